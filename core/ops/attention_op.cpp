// attention: multi-head scaled dot-product attention, as torch's
// F.scaled_dot_product_attention on [tokens, heads, head_dim] views: inputs query, key and
// value [tokens, features] (the outputs of three linear nodes, as BERT's self-attention) and
// an optional key padding mask [tokens] (1 keep, 0 padding); output [tokens, features],
// ready for the output linear. Layer: attention_layer.cpp; kernels: Backend::attention.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.attention();
  if (!a) ops::fail_attr(label, "attention", "missing field 'attention' (heads)");
  if (a->heads() <= 0) ops::fail_attr(label, "attention", cat("field 'attention.heads' must be > 0, got ", a->heads()));
  out.attention = {a->heads(), a->causal()};
}

Shape attention_shape(const NodeSpec& n, std::span<const Shape> in) {
  if (in.size() != 3 && in.size() != 4)
    ops::fail_node(n, cat("field 'inputs' needs query, key, value and optionally a mask, got ", in.size(), " inputs"));
  const Shape& q = in[0];
  if (q.rank() != 2) ops::fail_node(n, cat("expects a sequence [tokens, features] per sample, got ", q.str()));
  if (in[1] != q || in[2] != q)
    ops::fail_node(n, cat("query, key and value must have one shape, got ", q.str(), ", ", in[1].str(), ", ", in[2].str()));
  if (q[1] % n.attention.heads != 0)
    ops::fail_node(n, cat(q[1], " features do not split into ", n.attention.heads, " heads (field 'attention.heads')"));
  if (in.size() == 4 && in[3] != Shape{q[0]})
    ops::fail_node(n, cat("its mask must be [tokens] = [", q[0], "], got ", in[3].str()));
  return q;
}

// Per sample, T tokens, F features, H heads: S = Q K^T and O = P V are 2 T^2 F each; the
// softmax exp, sum, scale and mask a score (5 H T^2). Backward: dP, dV, dQ, dK are 2 T^2 F
// each, the softmax's gradient a dot product and a multiply-subtract a score (3 H T^2).
OpCost cost(const NodeSpec& n, std::span<const Shape> in, const Shape&) {
  const double t = static_cast<double>(in[0][0]), f = static_cast<double>(in[0][1]);
  const double scores = static_cast<double>(n.attention.heads) * t * t;
  OpCost c;
  c.forward_flops = 4.0 * t * t * f + 5.0 * scores;
  c.backward_data_flops = 8.0 * t * t * f + 3.0 * scores;
  return c;
}

}  // namespace

void define_attention_op(OpTable& t) {
  OpDef d;
  d.name = "attention";
  d.sequence = SequenceLength::Follows;  // the mask runs at the same length
  d.parse = parse;
  d.infer_shape = attention_shape;
  d.cost = cost;
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<AttentionLayer>(node, in[0], backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
