// hardsigmoid: relu6(x + 3) / 6, PyTorch's nn.Hardsigmoid: the gate of MobileNetV3's
// squeeze-excitation blocks. Backends run it as an Activation.
#include "core/activation.h"
#include "core/activation_math.h"
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"

namespace tandem {
namespace {

constexpr Activation kHardsigmoid{"hardsigmoid", act::hardsigmoid, act::hardsigmoid_grad};

}  // namespace

void define_hardsigmoid_op(OpTable& t) {
  OpDef d = ops::elementwise("hardsigmoid", 4, 2);  // add, two clamps, a divide; compare twice and scale
  d.activation = &kHardsigmoid;
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<ActivationLayer>(node.spec.name, kHardsigmoid, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
