// linear: x [..., in] -> x W^T + b, W [out, in], over the last dimension as torch.nn.Linear
// (a sample's vector, or each token's of a sequence [tokens, in]). When a rank-1 input
// flattens an NHWC image, PyTorch's weight columns run over CHW. Layer: linear_layer.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.linear();
  if (!a) ops::fail_attr(label, "linear", "missing field 'linear'");
  if (a->out_features() <= 0)
    ops::fail_attr(label, "linear", cat("field 'linear.out_features' must be > 0, got ", a->out_features()));
  out.linear.out_features = a->out_features();
  out.linear.bias = a->bias();
}

OpCost cost(const NodeSpec& n, std::span<const Shape> in, const Shape& out) {
  const double macs = ops::count(in[0]) * static_cast<double>(n.linear.out_features);
  OpCost c;
  c.forward_flops = c.backward_data_flops = c.backward_weights_flops = 2.0 * macs;
  if (n.linear.bias) c.backward_weights_flops += static_cast<double>(n.linear.out_features);
  if (n.lora.rank > 0) {
    // The adapter: x A^T and its B, each way; the scaled add of its output (2 a value),
    // the scaled output gradient (1) and the add into the input gradient (1).
    const double r = static_cast<double>(n.lora.rank), rows = ops::count(out) / n.linear.out_features;
    const double adapter = 2.0 * rows * r * (static_cast<double>(in[0][in[0].rank() - 1]) + n.linear.out_features);
    c.forward_flops += adapter + 2.0 * ops::count(out);
    c.backward_data_flops += adapter + ops::count(out) + ops::count(in[0]);
    // A frozen base computes no weight gradient; the adapter's two do.
    c.backward_weights_flops = adapter + ops::count(out);
  }
  return c;
}

}  // namespace

void define_linear_op(OpTable& t) {
  OpDef d;
  d.name = "linear";
  d.sequence = SequenceLength::Follows;  // a sequence is its tokens' rows
  d.parse = parse;
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
           ops::expect_inputs(n, in, 1, 0);
           if (in[0].rank() > 2)  // an image: torch would apply it per pixel, which is rarely meant
             ops::fail_node(n, cat("expects a vector [features] or a sequence [tokens, features] per sample, got ",
                                   in[0].str(), " (add a flatten node before it)"));
           Shape out = in[0];
           out[out.rank() - 1] = n.linear.out_features;
           return out;
         };
  d.cost = cost;
  d.params = [](const NodeSpec& n, std::span<const Shape> in) {
           const int64_t features = in[0][in[0].rank() - 1];
           std::vector<ParamSpec> p{{"weight", Shape{n.linear.out_features, features}}};
           if (n.linear.bias) p.push_back({"bias", Shape{n.linear.out_features}});
           if (n.lora.rank > 0) {  // PEFT's names
             p.push_back({"lora_A.weight", Shape{n.lora.rank, features}});
             p.push_back({"lora_B.weight", Shape{n.linear.out_features, n.lora.rank}});
           }
           return p;
         };
  d.torch_layout = [](const NodeSpec&, std::string_view field) { return field == "weight" ? TorchLayout::InputColumns : TorchLayout::Same; };
  d.freezable = true;
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng& rng) -> std::unique_ptr<Layer> {
           return std::make_unique<LinearLayer>(node, in[0], backend, rng);
         };
  t.add(std::move(d));
}

}  // namespace tandem
