// silu (swish): x * sigmoid(x), PyTorch's nn.SiLU; the gradient is s * (1 + x * (1 - s)).
// The transformer feed-forward blocks use it. Backends run it as an Activation.
#include "core/activation.h"
#include "core/activation_math.h"
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"

namespace tandem {
namespace {

constexpr Activation kSilu{"silu", act::silu, act::silu_grad};

}  // namespace

void define_silu_op(OpTable& t) {
  OpDef d = ops::elementwise("silu", 4, 7);
  d.activation = &kSilu;
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<ActivationLayer>(node.spec.name, kSilu, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
