#include "core/activation.h"

namespace tandem {

std::optional<Activation> parse_activation(const std::string& op) {
  if (op == "relu6") return Activation::Relu6;
  if (op == "hardswish") return Activation::Hardswish;
  if (op == "gelu") return Activation::Gelu;
  if (op == "sigmoid") return Activation::Sigmoid;
  if (op == "tanh") return Activation::Tanh;
  return std::nullopt;
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::Relu6: return "relu6";
    case Activation::Hardswish: return "hardswish";
    case Activation::Gelu: return "gelu";
    case Activation::Sigmoid: return "sigmoid";
    case Activation::Tanh: return "tanh";
  }
  return "?";
}

}  // namespace tandem
