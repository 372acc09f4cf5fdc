// mul: a * b, elementwise; b of a's shape, or of its last dimension ([C], or [1, 1, C] for an
// image [H, W, C]) repeated over the rest: a gate per channel (MobileNetV3's squeeze-excitation),
// per feature, or a gated unit's product. The gradient goes to both inputs (b's summed over
// what it was repeated on). Layer: MulLayer (simple_layers.cpp); kernels: Backend::mul.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"

namespace tandem {

void define_mul_op(OpTable& t) {
  OpDef d;
  d.name = "mul";
  d.sequence = SequenceLength::Follows;
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 2, 0);
    const Shape &a = in[0], &b = in[1];
    if (b == a) return a;
    bool ones = b.rank() == 1 || b.rank() == a.rank();
    for (int i = 0; ones && i + 1 < b.rank(); ++i) ones = b[i] == 1;
    if (!ones || b[b.rank() - 1] != a[a.rank() - 1])
      fail("graph", cat("node '", n.name, "' (mul): inputs of shapes ", a.str(), " and ", b.str(), " (mul needs b of a's shape, "
                        "or of its last dimension [", a[a.rank() - 1], "] repeated over the rest)"));
    return a;
  };
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape& out) {
    OpCost c;
    c.forward_flops = ops::count(out);
    c.backward_data_flops = 3.0 * ops::count(out);  // da = dy b; db = sum dy a
    return c;
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<MulLayer>(node.spec.name, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
