// softmax over the last dimension (probabilities as a layer; the losses take logits).
// Layer: SoftmaxLayer (simple_layers.cpp).
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"

namespace tandem {

void define_softmax_op(OpTable& t) {
  // exp, sum and scale a value; backward: a dot product over the row, then a multiply-subtract.
  OpDef d = ops::elementwise("softmax", 3, 4);
  d.keeps_layout = false;  // mixes a row's values
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<SoftmaxLayer>(node.spec.name, in[0], backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
