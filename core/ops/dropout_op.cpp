// dropout: inverted dropout with probability p and a seeded, counter-based mask (the same
// on every backend: core/dropout_bits.h). Kernel: DropoutKernel; layer: DropoutLayer
// (simple_layers.cpp).
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"
#include "schema/model_generated.h"

namespace tandem {

void define_dropout_op(OpTable& t) {
  OpDef d = ops::elementwise("dropout", 2, 1);  // a hash compare and a scale; backward a masked scale
  d.parse = [](const spec::Node& node, NodeSpec& out, const std::string& label) {
    const auto* a = node.dropout();
    if (!a) return;
    if (!(a->p() >= 0.0f && a->p() < 1.0f))
      ops::fail_attr(label, "dropout", cat("field 'dropout.p' must be in [0, 1), got ", a->p()));
    out.dropout.p = a->p();
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<DropoutLayer>(node.spec.name, node.spec.dropout.p, rng.next(), backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
