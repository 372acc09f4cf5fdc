// Multi-head attention on simd::gemm: per sample and head, S = Q K^T, the masked softmax,
// O = P V; backward dP = dO V^T, dV = P^T dO, dS, dQ = dS K, dK = dS^T Q. Heads are column
// slices of [tokens, features] (leading dimension = features), so nothing is repacked but
// the transposes the GEMM's row-major B needs.
#include "backends/simd/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "backends/simd/gemm.h"

namespace tandem::simd {

void masked_softmax_row(float* s, int64_t n, float scale, const float* mask, int64_t causal_last) {
  const int64_t last = causal_last < 0 ? n - 1 : std::min(causal_last, n - 1);
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j <= last; ++j)
    if (!mask || mask[j] != 0.0f) top = std::max(top, s[j] * scale);
  if (top == -std::numeric_limits<float>::infinity()) {  // no key to attend to: zeros, not NaN
    for (int64_t j = 0; j < n; ++j) s[j] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const bool keep = j <= last && (!mask || mask[j] != 0.0f);
    s[j] = keep ? std::exp(s[j] * scale - top) : 0.0f;
    sum += s[j];
  }
  const float inv = 1.0f / sum;  // sum >= 1: the maximum contributes exp(0)
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

void softmax_backward_row(const float* p, float* dp, int64_t n, float scale) {
  float dot = 0.0f;
  for (int64_t j = 0; j < n; ++j) dot += p[j] * dp[j];
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - dot) * scale;
}

namespace {

class Attention final : public AttentionKernel {
 public:
  explicit Attention(const AttentionGeometry& g)
      : g_(g), scale_(1.0f / std::sqrt(static_cast<float>(g.head_dim))),
        square_(static_cast<std::size_t>(g.tokens * g.tokens)), square2_(square_.size()),
        panel_(static_cast<std::size_t>(g.tokens * g.head_dim)) {}

  void forward(const float* q, const float* k, const float* v, const float* mask, float* out, float* probs) override {
    const int64_t T = g_.tokens, D = g_.features(), dh = g_.head_dim;
    for (int64_t b = 0; b < g_.batch; ++b)
      for (int64_t h = 0; h < g_.heads; ++h) {
        const int64_t at = b * T * D + h * dh;
        float* p = probs + (b * g_.heads + h) * T * T;
        transpose(T, dh, k + at, D, panel_.data());  // K^T [dh, T]
        gemm(T, T, dh, q + at, D, panel_.data(), T, p, T, false);
        for (int64_t i = 0; i < T; ++i) masked_softmax_row(p + i * T, T, scale_, mask ? mask + b * T : nullptr, g_.causal ? i : -1);
        gemm(T, dh, T, p, T, v + at, D, out + at, D, false);
      }
  }

  void backward(const float* q, const float* k, const float* v, const float* probs, const float* dout, float* dq,
                float* dk, float* dv) override {
    const int64_t T = g_.tokens, D = g_.features(), dh = g_.head_dim;
    for (int64_t b = 0; b < g_.batch; ++b)
      for (int64_t h = 0; h < g_.heads; ++h) {
        const int64_t at = b * T * D + h * dh;
        const float* p = probs + (b * g_.heads + h) * T * T;
        float* ds = square_.data();
        if (dv) {
          transpose(T, T, p, T, square2_.data());  // P^T
          gemm(T, dh, T, square2_.data(), T, dout + at, D, dv + at, D, false);
        }
        if (!dq && !dk) continue;
        transpose(T, dh, v + at, D, panel_.data());  // V^T
        gemm(T, T, dh, dout + at, D, panel_.data(), T, ds, T, false);  // dP
        for (int64_t i = 0; i < T; ++i) softmax_backward_row(p + i * T, ds + i * T, T, scale_);
        if (dq) gemm(T, dh, T, ds, T, k + at, D, dq + at, D, false);
        if (dk) {
          transpose(T, T, ds, T, square2_.data());  // dS^T
          gemm(T, dh, T, square2_.data(), T, q + at, D, dk + at, D, false);
        }
      }
  }

 private:
  AttentionGeometry g_;
  float scale_;
  std::vector<float> square_, square2_, panel_;  // [T, T], [T, T], [T, head_dim] scratch
};

}  // namespace

std::unique_ptr<AttentionKernel> make_attention(const AttentionGeometry& g) { return std::make_unique<Attention>(g); }

}  // namespace tandem::simd
