// The elementwise activations beyond ReLU, with PyTorch's definitions (forward and the
// gradient they backpropagate), shared by every backend's kernels and the reference.
#pragma once

#include <cmath>
#include <optional>
#include <string>

namespace tandem {

enum class Activation { Relu6, Hardswish, Gelu, Sigmoid, Tanh };

// The spec's op names: relu6, hardswish, gelu (erf form), sigmoid, tanh.
std::optional<Activation> parse_activation(const std::string& op);
const char* activation_name(Activation a);

// y = f(x).
inline float activation_forward(Activation a, float x) {
  switch (a) {
    case Activation::Relu6: return std::fmin(std::fmax(x, 0.0f), 6.0f);
    case Activation::Hardswish: return x * std::fmin(std::fmax(x + 3.0f, 0.0f), 6.0f) / 6.0f;
    case Activation::Gelu: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::Sigmoid: return 1.0f / (1.0f + std::exp(-x));
    case Activation::Tanh: return std::tanh(x);
  }
  return x;
}

// dx = dy * f'(x) (y = f(x) given too: sigmoid and tanh use it). Kinks as PyTorch: relu6
// passes the gradient for 0 < x < 6, hardswish uses (2x + 3) / 6 on [-3, 3].
inline float activation_backward(Activation a, float x, float y, float dy) {
  switch (a) {
    case Activation::Relu6: return x > 0.0f && x < 6.0f ? dy : 0.0f;
    case Activation::Hardswish: return x < -3.0f ? 0.0f : x <= 3.0f ? dy * (2.0f * x + 3.0f) / 6.0f : dy;
    case Activation::Gelu: {
      const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
      const float pdf = std::exp(-0.5f * x * x) * 0.39894228040143268f;
      return dy * (cdf + x * pdf);
    }
    case Activation::Sigmoid: return dy * y * (1.0f - y);
    case Activation::Tanh: return dy * (1.0f - y * y);
  }
  return dy;
}

}  // namespace tandem
