// transpose: a sample's axes permuted (the batch stays first): output axis i is input axis
// perm[i], 0 the first after the batch; torch's x.permute(0, ...) and ONNX's Transpose where
// no fused op takes the pattern (a channel shuffle). The gradient is the output's permuted
// back. Layer: TransposeLayer (simple_layers.cpp): one pass where the backend keeps the
// tensors (VectorKernel::permute), so every backend runs it.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {

void define_transpose_op(OpTable& t) {
  OpDef d;
  d.name = "transpose";
  d.parse = [](const spec::Node& node, NodeSpec& out, const std::string& label) {
    const auto* a = node.transpose();
    if (!a || !a->perm()) ops::fail_attr(label, "transpose", "missing field 'transpose' (perm: the axes' new order)");
    out.perm.assign(a->perm()->begin(), a->perm()->end());
  };
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 0);
    const int rank = in[0].rank();
    if (static_cast<int>(n.perm.size()) != rank)
      ops::fail_node(n, cat("field 'transpose.perm' has ", n.perm.size(), " axes; its input ", in[0].str(), " has ", rank));
    bool seen[kMaxRank] = {};
    int64_t dims[kMaxRank] = {};
    for (int i = 0; i < rank; ++i) {
      const int a = n.perm[static_cast<std::size_t>(i)];
      if (a < 0 || a >= rank || seen[a])
        ops::fail_node(n, cat("field 'transpose.perm' is not an order of the axes 0 to ", rank - 1, " (axis ", a, " at ", i, ")"));
      seen[a] = true;
      dims[i] = in[0][a];
    }
    return Shape::of(dims, rank);
  };
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape&) { return OpCost{}; };  // copies
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<TransposeLayer>(node.spec.name, node.spec.perm, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
