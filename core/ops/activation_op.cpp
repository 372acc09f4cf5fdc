// relu and the activations with PyTorch's definitions: relu6, hardswish, gelu (erf form),
// sigmoid, tanh. relu has a kernel of its own (ReluLayer); the others are an Activation each
// (core/activation.h), which backends map to a library kernel or run as these loops.
#include <cmath>

#include "core/activation.h"
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"

namespace tandem {
namespace {

// Kinks as PyTorch: relu6 passes the gradient for 0 < x < 6, hardswish uses (2x + 3) / 6 on [-3, 3].
constexpr Activation kRelu6{"relu6", [](float x) { return std::fmin(std::fmax(x, 0.0f), 6.0f); },
                            [](float x, float, float dy) { return x > 0.0f && x < 6.0f ? dy : 0.0f; }};
constexpr Activation kHardswish{
    "hardswish", [](float x) { return x * std::fmin(std::fmax(x + 3.0f, 0.0f), 6.0f) / 6.0f; },
    [](float x, float, float dy) { return x < -3.0f ? 0.0f : x <= 3.0f ? dy * (2.0f * x + 3.0f) / 6.0f : dy; }};
constexpr Activation kGelu{"gelu", [](float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); },
                           [](float x, float, float dy) {
                             const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
                             const float pdf = std::exp(-0.5f * x * x) * 0.39894228040143268f;
                             return dy * (cdf + x * pdf);
                           }};
constexpr Activation kSigmoid{"sigmoid", [](float x) { return 1.0f / (1.0f + std::exp(-x)); },
                              [](float, float y, float dy) { return dy * y * (1.0f - y); }};
constexpr Activation kTanh{"tanh", [](float x) { return std::tanh(x); },
                           [](float, float y, float dy) { return dy * (1.0f - y * y); }};

}  // namespace

void define_activation_op(OpTable& t) {
  OpDef relu = ops::elementwise("relu", 1, 1);
  relu.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<ReluLayer>(node.spec.name, backend);
  };
  t.add(std::move(relu));
  // FLOPs a value as the formulas above count them (exp, erf and tanh as one each).
  struct Counted {
    const Activation* a;
    double forward, backward;
  };
  for (const Counted& c : {Counted{&kRelu6, 2, 2}, Counted{&kHardswish, 5, 4}, Counted{&kGelu, 6, 10},
                           Counted{&kSigmoid, 3, 3}, Counted{&kTanh, 1, 3}}) {
    const Activation* a = c.a;
    OpDef d = ops::elementwise(std::string(a->name), c.forward, c.backward);
    d.activation = a;
    d.make_layer = [a](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
      return std::make_unique<ActivationLayer>(node.spec.name, *a, backend);
    };
    t.add(std::move(d));
  }
}

}  // namespace tandem
