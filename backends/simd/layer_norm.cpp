// Two passes a row (the mean, then the variance about it: no cancellation for rows far from
// zero), vectorised over features; the parameter gradients summed over rows in float.
#include "backends/simd/layer_norm.h"

#include <cmath>
#include <vector>

#include "core/vector.h"

namespace tandem::simd {
namespace {

[[gnu::always_inline]] inline float hsum(f32x16 v) {
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

TANDEM_SIMD_KERNEL void forward_rows(const float* x, int64_t rows, int64_t n, float eps, const float* gamma,
                                     const float* beta, float* y, float* mean, float* var) {
  const int64_t body = n - n % 16;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    f32x16 acc = {};
    for (int64_t i = 0; i < body; i += 16) acc += load16(xr + i);
    float s = hsum(acc);
    for (int64_t i = body; i < n; ++i) s += xr[i];
    const float m = s / static_cast<float>(n);
    f32x16 acc2 = {};
    for (int64_t i = 0; i < body; i += 16) {
      const f32x16 d = load16(xr + i) - m;
      acc2 += d * d;
    }
    float ss = hsum(acc2);
    for (int64_t i = body; i < n; ++i) ss += (xr[i] - m) * (xr[i] - m);
    const float v = ss / static_cast<float>(n);
    const float rstd = 1.0f / std::sqrt(v + eps);
    for (int64_t i = 0; i < body; i += 16)
      store16(yr + i, (load16(xr + i) - m) * rstd * load16(gamma + i) + load16(beta + i));
    for (int64_t i = body; i < n; ++i) yr[i] = (xr[i] - m) * rstd * gamma[i] + beta[i];
    mean[r] = m;
    var[r] = v;
  }
}

TANDEM_SIMD_KERNEL void backward_rows(const float* x, const float* dy, int64_t rows, int64_t n, float eps,
                                      const float* gamma, const float* mean, const float* var, float* dx,
                                      float* dgamma, float* dbeta) {
  const int64_t body = n - n % 16;
  for (int64_t i = 0; i < n; ++i) dgamma[i] = dbeta[i] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float* dyr = dy + r * n;
    const float m = mean[r], rstd = 1.0f / std::sqrt(var[r] + eps);
    f32x16 a = {}, b = {};
    for (int64_t i = 0; i < body; i += 16) {
      const f32x16 xhat = (load16(xr + i) - m) * rstd, g = load16(dyr + i);
      const f32x16 dxhat = g * load16(gamma + i);
      a += dxhat;
      b += dxhat * xhat;
      store16(dgamma + i, load16(dgamma + i) + g * xhat);
      store16(dbeta + i, load16(dbeta + i) + g);
    }
    float sum_dxhat = hsum(a), sum_dxhat_xhat = hsum(b);
    for (int64_t i = body; i < n; ++i) {
      const float xhat = (xr[i] - m) * rstd, dxhat = dyr[i] * gamma[i];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      dgamma[i] += dyr[i] * xhat;
      dbeta[i] += dyr[i];
    }
    if (dx == nullptr) continue;
    float* dxr = dx + r * n;
    const float scale = rstd / static_cast<float>(n), nf = static_cast<float>(n);
    for (int64_t i = 0; i < body; i += 16) {
      const f32x16 xhat = (load16(xr + i) - m) * rstd, dxhat = load16(dyr + i) * load16(gamma + i);
      store16(dxr + i, scale * (nf * dxhat - sum_dxhat - xhat * sum_dxhat_xhat));
    }
    for (int64_t i = body; i < n; ++i) {
      const float xhat = (xr[i] - m) * rstd, dxhat = dyr[i] * gamma[i];
      dxr[i] = scale * (nf * dxhat - sum_dxhat - xhat * sum_dxhat_xhat);
    }
  }
}

class LayerNorm final : public LayerNormKernel {
 public:
  explicit LayerNorm(const LayerNormGeometry& g) : g_(g) {}
  void forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* var) override {
    forward_rows(x, g_.rows, g_.features, g_.eps, gamma, beta, y, mean, var);
  }
  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* var, float* dx,
                float* dgamma, float* dbeta) override {
    backward_rows(x, dy, g_.rows, g_.features, g_.eps, gamma, mean, var, dx, dgamma, dbeta);
  }

 private:
  LayerNormGeometry g_;
};

}  // namespace

std::unique_ptr<LayerNormKernel> make_layer_norm(const LayerNormGeometry& g) { return std::make_unique<LayerNorm>(g); }

}  // namespace tandem::simd
