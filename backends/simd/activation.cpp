// GELU's erf form on 16-float vectors. The scalar loop (std::erf per value) ran at about
// 0.6 GFLOP/s and took 16% of spam-bert's front step on xnnpack (tandem profile), as much as
// the layer's two linears' forward together; this runs at vector speed. erf is Abramowitz and
// Stegun's 7.1.26 (absolute error at most 1.5e-7, below float's resolution of 1 + erf), on
// core/vector.h's exp16.
#include "backends/simd/activation.h"

#include <cmath>

#include "core/vector.h"

namespace tandem::simd {
namespace {

[[gnu::always_inline]] inline f32x16 erf16(f32x16 x) {
  const f32x16 zero = {}, one = zero + 1.0f;
  const i32x16 negative = x < zero;
  const f32x16 a = select16(negative, -x, x);
  const f32x16 t = one / (one + a * 0.3275911f);
  f32x16 p = t * 1.061405429f - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const f32x16 e = one - p * t * exp16(-(a * a));
  return select16(negative, -e, e);
}

constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;

TANDEM_SIMD_KERNEL void gelu_forward(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const f32x16 v = load16(x + i);
    store16(y + i, v * 0.5f * (erf16(v * kInvSqrt2) + 1.0f));
  }
  for (; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x): Phi the normal CDF, phi its density.
TANDEM_SIMD_KERNEL void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const f32x16 v = load16(x + i);
    const f32x16 cdf = (erf16(v * kInvSqrt2) + 1.0f) * 0.5f;
    const f32x16 pdf = exp16(v * v * -0.5f) * kInvSqrt2Pi;
    store16(dx + i, load16(dy + i) * (cdf + v * pdf));
  }
  for (; i < n; ++i) {
    const float cdf = 0.5f * (1.0f + std::erf(x[i] * kInvSqrt2)), pdf = std::exp(-0.5f * x[i] * x[i]) * kInvSqrt2Pi;
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

class Gelu final : public ActivationKernel {
 public:
  explicit Gelu(int64_t n) : n_(n) {}
  void forward(const float* x, float* y) override { gelu_forward(x, y, n_); }
  void backward(const float* x, const float*, const float* dy, float* dx) override { gelu_backward(x, dy, dx, n_); }

 private:
  int64_t n_;
};

}  // namespace

std::unique_ptr<ActivationKernel> make_activation(const Activation& kind, int64_t elements) {
  if (kind.name == "gelu") return std::make_unique<Gelu>(elements);
  return nullptr;
}

}  // namespace tandem::simd
