// reduce: the sum, mean, maximum or minimum over per-sample axes (`reduce: { mode, axes }`, 0
// the first after the batch, negative from the last), which the output drops ([1] where all
// go): torch's x.sum(dims), x.mean(dims), x.amax(dims) and x.amin(dims), ONNX's ReduceSum,
// ReduceMean, ReduceMax and ReduceMin where no fused op (layer norm, global_avg_pool,
// token_pool) takes them. Backward spreads the output's gradient over what each value summed
// (divided by their count for the mean), or gives it to the first value that was the maximum
// (minimum). Layer: ReduceLayer (simple_layers.cpp): a permute to put the reduced axes last
// where they are not, then a pass over rows, where the backend keeps the tensors
// (VectorKernel), so every backend runs it.
#include <algorithm>

#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

// The reduced axes of a per-sample input of `rank`, each in [0, rank), sorted; errors name the node.
std::vector<int> reduced_axes(const NodeSpec& n, int rank) {
  if (n.reduce.axes.empty()) ops::fail_node(n, "field 'reduce.axes' is empty (name the axes to reduce)");
  std::vector<int> axes;
  for (int a : n.reduce.axes) {
    const int axis = a < 0 ? a + rank : a;
    if (axis < 0 || axis >= rank)
      ops::fail_node(n, cat("field 'reduce.axes' names axis ", a, ", outside an input of ", rank, " dimensions"));
    if (std::find(axes.begin(), axes.end(), axis) != axes.end())
      ops::fail_node(n, cat("field 'reduce.axes' names axis ", a, " twice"));
    axes.push_back(axis);
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

}  // namespace

void define_reduce_op(OpTable& t) {
  OpDef d;
  d.name = "reduce";
  d.parse = [](const spec::Node& node, NodeSpec& out, const std::string& label) {
    const auto* a = node.reduce();
    if (!a || !a->axes())
      ops::fail_attr(label, "reduce", "missing field 'reduce' (mode: \"sum\", \"mean\", \"max\" or \"min\", axes)");
    const std::string mode = a->mode() ? a->mode()->str() : "sum";
    using M = ReduceAttrs::Mode;
    const M modes[] = {M::sum, M::mean, M::max, M::min};
    const auto at = std::find_if(std::begin(modes), std::end(modes), [&](M m) { return mode == reduce_mode_name(m); });
    if (at == std::end(modes))
      ops::fail_attr(label, "reduce", cat("field 'reduce.mode' is '", mode, "' (\"sum\", \"mean\", \"max\" or \"min\")"));
    out.reduce.mode = *at;
    out.reduce.axes.assign(a->axes()->begin(), a->axes()->end());
  };
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 0);
    const std::vector<int> axes = reduced_axes(n, in[0].rank());
    int64_t dims[kMaxRank] = {};
    int rank = 0;
    for (int i = 0; i < in[0].rank(); ++i)
      if (!std::binary_search(axes.begin(), axes.end(), i)) dims[rank++] = in[0][i];
    if (rank == 0) dims[rank++] = 1;
    return Shape::of(dims, rank);
  };
  d.cost = [](const NodeSpec& n, std::span<const Shape> in, const Shape& out) {
    OpCost c;
    const bool extreme = n.reduce.mode == ReduceAttrs::Mode::max || n.reduce.mode == ReduceAttrs::Mode::min;
    c.forward_flops = ops::count(in[0]) + (extreme ? 0.0 : ops::count(out));  // the adds (compares), and the scale
    c.backward_data_flops = extreme ? 0.0 : ops::count(in[0]);               // a scaled copy a value (a routed one)
    return c;
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<ReduceLayer>(node.spec.name, reduced_axes(node.spec, in[0].rank()), node.spec.reduce.mode, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
