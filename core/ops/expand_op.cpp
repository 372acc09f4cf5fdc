// expand: a sample repeated along its axes of 1 to `expand.shape` (per sample; the batch
// stays), the two shapes broadcast as numpy does (aligned on the last axis, each dimension
// equal or 1; the input's missing leading axes repeated): torch's x.expand(N, ...) and
// x.unsqueeze(1).expand(-1, k, -1), ONNX's Expand where no pattern takes it. Backward: the
// gradient summed over the repeated axes. Layer: ExpandLayer (simple_layers.cpp), on
// VectorKernel::elementwise and sum_rows, so every backend runs it.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {

void define_expand_op(OpTable& t) {
  OpDef d;
  d.name = "expand";
  // Fixed: a [T] axis of 1 repeated could line up with the tokens of another input.
  d.parse = [](const spec::Node& node, NodeSpec& out, const std::string& label) {
    const auto* a = node.expand();
    if (!a || !a->shape()) ops::fail_attr(label, "expand", "missing field 'expand' (shape: the per-sample dimensions)");
    out.expand.assign(a->shape()->begin(), a->shape()->end());
  };
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 0);
    const auto rank = static_cast<int>(n.expand.size());
    if (rank == 0 || rank >= kMaxRank)
      ops::fail_node(n, cat("field 'expand.shape' has ", rank, " dimensions (1 to ", kMaxRank - 1, " a sample)"));
    int64_t dims[kMaxRank] = {};
    for (int i = 0; i < rank; ++i) {
      const int64_t v = n.expand[static_cast<std::size_t>(i)];
      if (v < 1 || v > kMaxSampleElements)
        ops::fail_node(n, cat("field 'expand.shape' has dimension ", i, " of ", v, " (each 1 to ", kMaxSampleElements, ")"));
      dims[i] = v;
    }
    const Shape target = Shape::of(dims, rank);
    if (!target.numel_at_most(kMaxSampleElements)) ops::fail_node(n, cat("field 'expand.shape' ", target.str(), " holds too many values"));
    const Shape out = ops::broadcast(n, in[0], target);
    if (!out.numel_at_most(kMaxSampleElements)) ops::fail_node(n, cat("its output ", out.str(), " holds too many values"));
    return out;
  };
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape& out) {
    OpCost c;
    c.backward_data_flops = ops::count(out);  // the sums
    return c;
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<ExpandLayer>(node.spec.name, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
