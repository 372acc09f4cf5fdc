// The activations' formulas as PyTorch defines them, forward and the gradient each passes
// back: one place for the op definitions (core/ops) and the cuda backend's device kernels.
#pragma once

#include <math.h>

#include "core/host_device.h"

namespace tandem::act {

// Kinks as PyTorch: relu6 passes the gradient for 0 < x < 6, hardswish uses (2x + 3) / 6 on [-3, 3].
TANDEM_HOST_DEVICE inline float relu6(float x) { return fminf(fmaxf(x, 0.0f), 6.0f); }
TANDEM_HOST_DEVICE inline float relu6_grad(float x, float, float dy) { return x > 0.0f && x < 6.0f ? dy : 0.0f; }

TANDEM_HOST_DEVICE inline float hardswish(float x) { return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; }
TANDEM_HOST_DEVICE inline float hardswish_grad(float x, float, float dy) {
  return x < -3.0f ? 0.0f : x <= 3.0f ? dy * (2.0f * x + 3.0f) / 6.0f : dy;
}

// hardsigmoid: relu6(x + 3) / 6, nn.Hardsigmoid (MobileNetV3's squeeze-excitation gate); the
// gradient 1/6 strictly inside (-3, 3), as PyTorch.
TANDEM_HOST_DEVICE inline float hardsigmoid(float x) { return fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; }
TANDEM_HOST_DEVICE inline float hardsigmoid_grad(float x, float, float dy) {
  return x > -3.0f && x < 3.0f ? dy / 6.0f : 0.0f;
}

// GELU, erf form (nn.GELU()).
TANDEM_HOST_DEVICE inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
TANDEM_HOST_DEVICE inline float gelu_grad(float x, float, float dy) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  const float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
  return dy * (cdf + x * pdf);
}

// GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): nn.GELU(approximate="tanh").
TANDEM_HOST_DEVICE inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
TANDEM_HOST_DEVICE inline float gelu_tanh_grad(float x, float, float dy) {
  const float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));
  const float inner = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * inner);
}

TANDEM_HOST_DEVICE inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
TANDEM_HOST_DEVICE inline float sigmoid_grad(float, float y, float dy) { return dy * y * (1.0f - y); }

TANDEM_HOST_DEVICE inline float tanh_(float x) { return tanhf(x); }
TANDEM_HOST_DEVICE inline float tanh_grad(float, float y, float dy) { return dy * (1.0f - y * y); }

// silu (swish): x * sigmoid(x); the gradient is s * (1 + x * (1 - s)).
TANDEM_HOST_DEVICE inline float silu(float x) { return x / (1.0f + expf(-x)); }
TANDEM_HOST_DEVICE inline float silu_grad(float x, float, float dy) {
  const float s = 1.0f / (1.0f + expf(-x));
  return dy * s * (1.0f + x * (1.0f - s));
}

}  // namespace tandem::act
