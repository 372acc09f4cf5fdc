// slice: elements [start, end) of one per-sample axis (`axis`: 0 the first after the batch,
// negative from the last), step 1, as torch's x[..., start:end] and ONNX's Slice. A packed
// in-projection's query, key and value (nn.MultiheadAttention's in_proj_weight makes them side
// by side) are slices of its features. Backward writes the gradient into the slice's place and
// zeros elsewhere. Layer: SliceLayer (simple_layers.cpp): strided copies where the backend
// keeps the tensors (VectorKernel::copy_rows), so every backend runs it.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.slice();
  if (!a) ops::fail_attr(label, "slice", "missing field 'slice' (axis, start, end)");
  out.slice = {a->axis(), a->start(), a->end()};
}

int64_t slice_axis(const NodeSpec& n, const Shape& in) {
  const int64_t rank = in.rank(), axis = n.slice.axis < 0 ? n.slice.axis + rank : n.slice.axis;
  if (axis < 0 || axis >= rank)
    ops::fail_node(n, cat("field 'slice.axis' ", n.slice.axis, " is outside an input of ", rank, " dimensions ", in.str()));
  return axis;
}

}  // namespace

void define_slice_op(OpTable& t) {
  OpDef d;
  d.name = "slice";
  d.sequence = SequenceLength::Follows;  // of another axis than the tokens (Graph::build checks)
  d.parse = parse;
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 0);
    const int64_t axis = slice_axis(n, in[0]), along = in[0][static_cast<int>(axis)];
    if (n.slice.start < 0 || n.slice.end > along || n.slice.start >= n.slice.end)
      ops::fail_node(n, cat("field 'slice' [", n.slice.start, ", ", n.slice.end, ") is not a non-empty range of axis ", axis,
                            "'s ", along, " elements (input ", in[0].str(), ")"));
    int64_t dims[kMaxRank] = {};
    for (int i = 0; i < in[0].rank(); ++i) dims[i] = in[0][i];
    dims[axis] = n.slice.end - n.slice.start;
    return Shape::of(dims, in[0].rank());
  };
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape&) { return OpCost{}; };  // copies
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<SliceLayer>(node.spec.name, slice_axis(node.spec, in[0]) + 1, node.spec.slice.start, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
