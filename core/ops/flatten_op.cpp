// flatten: a sample's tensor seen as one vector (NHWC order), a view: no copy, no work.
// Interop maps a following linear layer's columns to PyTorch's CHW order.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"

namespace tandem {

void define_flatten_op(OpTable& t) {
  OpDef d;
  d.name = "flatten";
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
           ops::expect_inputs(n, in, 1, 0);
           return Shape{in[0].numel()};
         };
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape&) { return OpCost{}; };
  d.view = true;
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend&, Rng&) -> std::unique_ptr<Layer> {
           return std::make_unique<ViewLayer>(node.spec.name);
         };
  t.add(std::move(d));
}

}  // namespace tandem
