// add: a + b of equal shapes (residual connections); the gradient goes to both inputs.
// Layer: AddLayer (simple_layers.cpp).
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"

namespace tandem {

void define_add_op(OpTable& t) {
  OpDef d;
  d.name = "add";
  d.sequence = SequenceLength::Follows;
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
           ops::expect_inputs(n, in, 2, 0);
           if (in[0] != in[1])
             fail("graph", cat("node '", n.name, "' (add): inputs of shapes ", in[0].str(), " and ", in[1].str(),
                               " (add needs equal shapes)"));
           return in[0];
         };
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape& out) {
           OpCost c;
           c.forward_flops = ops::count(out);  // backward copies dy to both inputs: no arithmetic
           return c;
         };
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
           return std::make_unique<AddLayer>(node.spec.name, backend);
         };
  t.add(std::move(d));
}

}  // namespace tandem
