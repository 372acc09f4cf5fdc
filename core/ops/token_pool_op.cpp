// token_pool: one vector from a sequence [tokens, features] for a classifier head: "first"
// (the [CLS] token, as BERT's pooler reads it; the default) or "mean" over the tokens an
// optional mask [tokens] keeps (all of them without one; 0 when it keeps none). A weighted sum
// of the tokens (TokenPoolKernel), the weights from the mask. Layer: TokenPoolLayer
// (simple_layers.cpp).
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.token_pool();
  if (!a || !a->mode()) return;  // the default: first
  const std::string mode = a->mode()->str();
  if (mode != "first" && mode != "mean")
    ops::fail_attr(label, "token_pool", cat("field 'token_pool.mode' is 'first' or 'mean', got '", mode, "'"));
  out.token_pool.mean = mode == "mean";
}

}  // namespace

void define_token_pool_op(OpTable& t) {
  OpDef d;
  d.name = "token_pool";
  d.sequence = SequenceLength::Pools;
  d.parse = parse;
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    if (in.empty() || in.size() > 2)
      ops::fail_node(n, cat("field 'inputs' needs a sequence and optionally its mask, got ", in.size(), " inputs"));
    if (in[0].rank() != 2) ops::fail_node(n, cat("expects a sequence [tokens, features] per sample, got ", in[0].str()));
    if (in.size() == 2 && in[1] != Shape{in[0][0]})
      ops::fail_node(n, cat("its mask must be [tokens] = [", in[0][0], "], got ", in[1].str()));
    return Shape{in[0][1]};
  };
  // first: a copy (0 FLOPs); mean: an add a value and a scale a feature forward, a scaled
  // copy a value backward.
  d.cost = [](const NodeSpec& n, std::span<const Shape> in, const Shape& out) {
    OpCost c;
    if (n.token_pool.mean) {
      c.forward_flops = ops::count(in[0]) + ops::count(out);
      c.backward_data_flops = ops::count(in[0]);
    }
    return c;
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<TokenPoolLayer>(node, in[0], backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
