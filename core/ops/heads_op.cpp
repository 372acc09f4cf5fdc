// heads: `count` independent Linear(F -> hidden), ReLU, Linear(hidden -> out) heads on one
// feature vector, outputs side by side (the loss sees `count` groups). Layer: heads_layer.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.heads();
  if (!a) ops::fail_attr(label, "heads", "missing field 'heads'");
  for (const auto& [field, v] : {std::pair{"heads.count", a->count()}, std::pair{"heads.hidden", a->hidden()},
                                 std::pair{"heads.out_features", a->out_features()}})
    if (v <= 0) ops::fail_attr(label, "heads", cat("field '", field, "' must be > 0, got ", v));
  out.heads = {a->count(), a->hidden(), a->out_features()};
}

// Per head: F x hidden and hidden x out multiply-adds, the ReLU between, the biases.
OpCost cost(const NodeSpec& n, std::span<const Shape> in, const Shape&) {
  const HeadsAttrs& h = n.heads;
  const double heads = static_cast<double>(h.count), f = static_cast<double>(in[0][0]);
  const double hidden = static_cast<double>(h.hidden), out = static_cast<double>(h.out_features);
  const double macs = heads * (f * hidden + hidden * out);
  OpCost c;
  c.forward_flops = 2.0 * macs + heads * hidden;                     // + the ReLU
  c.backward_data_flops = 2.0 * macs + heads * hidden;               // dx and the hidden gradient, masked
  c.backward_weights_flops = 2.0 * macs + heads * (hidden + out);    // dW1, dW2 and the bias sums
  return c;
}

}  // namespace

void define_heads_op(OpTable& t) {
  OpDef d;
  d.name = "heads";
  d.parse = parse;
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
           ops::expect_inputs(n, in, 1, 1);
           return Shape{n.heads.count * n.heads.out_features};
         };
  d.cost = cost;
  d.params = [](const NodeSpec& n, std::span<const Shape> in) {
           const HeadsAttrs& h = n.heads;
           return std::vector<ParamSpec>{{"w1", Shape{h.count * h.hidden, in[0][0]}},
                                         {"b1", Shape{h.count * h.hidden}},
                                         {"w2", Shape{h.count, h.out_features, h.hidden}},
                                         {"b2", Shape{h.count * h.out_features}}};
         };
  d.torch_layout = [](const NodeSpec&, std::string_view field) { return field == "w1" ? TorchLayout::InputColumns : TorchLayout::Same; };
  d.output_groups = [](const NodeSpec& n) { return n.heads.count; };
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng& rng) -> std::unique_ptr<Layer> {
           return std::make_unique<HeadsLayer>(node, in[0], backend, rng);
         };
  t.add(std::move(d));
}

}  // namespace tandem
