// concat: two or more inputs side by side along the last dimension (channels in NHWC), a
// copy on every backend. Layer: ConcatLayer (simple_layers.cpp).
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"

namespace tandem {
namespace {

Shape infer(const NodeSpec& n, std::span<const Shape> in) {
  if (in.size() < 2)
    fail("graph", cat("node '", n.name, "' (concat): field 'inputs' needs 2 or more inputs, got ", in.size()));
  const int rank = in[0].rank();
  int64_t dims[kMaxRank];
  for (int d = 0; d < rank; ++d) dims[d] = in[0][d];
  dims[rank - 1] = 0;
  for (const Shape& s : in) {
    bool same = s.rank() == rank;
    for (int d = 0; same && d + 1 < rank; ++d) same = s[d] == in[0][d];
    if (!same)
      fail("graph", cat("node '", n.name, "' (concat): input ", s.str(), " differs from ", in[0].str(),
                        " in more than the last dimension"));
    dims[rank - 1] += s[rank - 1];
  }
  return Shape::of(dims, rank);
}

}  // namespace

void define_concat_op(OpTable& t) {
  OpDef d;
  d.name = "concat";
  d.sequence = SequenceLength::Follows;  // along the last dimension: the tokens stay first
  d.infer_shape = infer;
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape&) { return OpCost{}; };  // copies only
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
           return std::make_unique<ConcatLayer>(node.spec.name, backend);
         };
  t.add(std::move(d));
}

}  // namespace tandem
