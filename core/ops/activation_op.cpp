// relu and the activations with PyTorch's definitions (core/activation_math.h): relu6,
// hardswish, gelu (erf form), sigmoid, tanh. relu has a kernel of its own (ReluLayer); the others are an Activation each
// (core/activation.h), which backends map to a library kernel or run as these loops.
#include "core/activation.h"
#include "core/activation_math.h"
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"

namespace tandem {
namespace {

constexpr Activation kRelu6{"relu6", act::relu6, act::relu6_grad};
constexpr Activation kHardswish{"hardswish", act::hardswish, act::hardswish_grad};
constexpr Activation kGelu{"gelu", act::gelu, act::gelu_grad};
constexpr Activation kSigmoid{"sigmoid", act::sigmoid, act::sigmoid_grad, true};
constexpr Activation kTanh{"tanh", act::tanh_, act::tanh_grad, true};

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
