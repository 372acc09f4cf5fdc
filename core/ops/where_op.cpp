// where: cond ? a : b elementwise (cond's nonzero values pick a), the three per-sample shapes
// broadcast as numpy does: torch.where and masked_fill, ONNX's Where where no pattern takes
// it (a key padding mask's is attention's). Inputs: cond, then a unless `where.a` is given,
// then b unless `where.b` is given; a given one is a constant and may be infinite
// (scores.masked_fill(mask == 0, -inf)), never NaN. cond is usually a comparison's 0/1
// (binary's equal, less, ...). Backward: dy to a where cond holds, to b elsewhere, each summed
// over the axes it was repeated on; cond gets 0. Layer: WhereLayer (simple_layers.cpp), on
// VectorKernel::elementwise (select) and sum_rows, so every backend runs it.
#include <cmath>

#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {

void define_where_op(OpTable& t) {
  OpDef d;
  d.name = "where";
  d.parse = [](const spec::Node& node, NodeSpec& out, const std::string& label) {
    if (const auto* a = node.where()) {
      if (a->a()) out.where.a = *a->a();
      if (a->b()) out.where.b = *a->b();
    }
    for (const std::optional<float>& v : {out.where.a, out.where.b})
      if (v && std::isnan(*v)) ops::fail_attr(label, "where", "field 'where.a' or 'where.b' is NaN (give a number or an infinity)");
  };
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    const std::size_t want = 1 + (n.where.a ? 0 : 1) + (n.where.b ? 0 : 1);
    if (in.size() != want)
      ops::fail_node(n, cat("field 'inputs' needs ", want, " inputs (cond", n.where.a ? "" : ", a", n.where.b ? "" : ", b",
                            "; field 'where.a' or 'where.b' gives a constant instead), got ", in.size()));
    Shape out = in[0];
    for (std::size_t k = 1; k < in.size(); ++k) out = ops::broadcast(n, out, in[k]);
    return out;
  };
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape& out) {
    OpCost c;
    c.forward_flops = ops::count(out);
    c.backward_data_flops = 2.0 * ops::count(out);  // a select for each branch
    return c;
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<WhereLayer>(node, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
