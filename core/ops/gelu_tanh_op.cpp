// gelu_tanh: GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// PyTorch's nn.GELU(approximate="tanh") and BERT's original "gelu_new"; gelu is the erf form.
// Backends run it as an Activation (oneDNN: eltwise_gelu_tanh).
#include "core/activation.h"
#include "core/activation_math.h"
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"

namespace tandem {
namespace {

constexpr Activation kGeluTanh{"gelu_tanh", act::gelu_tanh, act::gelu_tanh_grad};

}  // namespace

void define_gelu_tanh_op(OpTable& t) {
  // Forward: x^2, x^3, * 0.044715, + x, * sqrt(2/pi), tanh, + 1, * x, * 0.5 = 9 a value.
  // Backward: the forward's tanh argument again (6), its derivative (4), 1 - t^2 (2),
  // 0.5 x (1 - t^2) inner (3), 0.5 (1 + t) (2), the sum (1), * dy (1) = 19.
  OpDef d = ops::elementwise("gelu_tanh", 9, 19);
  d.activation = &kGeluTanh;
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<ActivationLayer>(node.spec.name, kGeluTanh, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
