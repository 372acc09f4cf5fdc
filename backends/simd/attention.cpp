// Multi-head attention on simd::gemm_native: per sample and head, S = Q K^T, the masked softmax,
// O = P V; backward dP = dO V^T, dV = P^T dO, dS, dQ = dS K, dK = dS^T Q. Heads are column
// slices of [tokens, features] (leading dimension = features), so nothing is repacked but
// the transposes the GEMM's row-major B needs.
#include "backends/simd/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/simd/gemm.h"
#include "core/vector.h"

namespace tandem::simd {

TANDEM_SIMD_KERNEL void masked_softmax_row(float* s, int64_t n, float scale, const float* mask, int64_t causal_last) {
  // Scores scaled, and -inf where the key is masked or (causal) after the query.
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  const int64_t end = causal_last < 0 ? n : std::min(causal_last + 1, n), body = end - end % 16;
  f32x16 top16 = f32x16{} + kNone;
  for (int64_t j = 0; j < body; j += 16) {
    f32x16 v = load16(s + j) * scale;
    if (mask) v = select16(load16(mask + j) != 0.0f, v, f32x16{} + kNone);
    store16(s + j, v);
    top16 = max16(top16, v);
  }
  float top = kNone;
  for (int i = 0; i < 16; ++i) top = std::max(top, top16[i]);
  for (int64_t j = body; j < end; ++j) {
    s[j] = !mask || mask[j] != 0.0f ? s[j] * scale : kNone;
    top = std::max(top, s[j]);
  }
  for (int64_t j = end; j < n; ++j) s[j] = 0.0f;
  if (top == kNone) {  // no key to attend to: zeros, not NaN
    for (int64_t j = 0; j < end; ++j) s[j] = 0.0f;
    return;
  }
  // exp(score - top), exactly 0 where masked; the sum is >= 1 (the maximum gives exp(0)).
  f32x16 sum16 = {};
  for (int64_t j = 0; j < body; j += 16) {
    const f32x16 v = load16(s + j);
    const f32x16 e = select16(v == kNone, f32x16{}, exp16(v - top));
    store16(s + j, e);
    sum16 += e;
  }
  float sum = 0.0f;
  for (int i = 0; i < 16; ++i) sum += sum16[i];
  for (int64_t j = body; j < end; ++j) {
    s[j] = s[j] == kNone ? 0.0f : std::exp(s[j] - top);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < body; j += 16) store16(s + j, load16(s + j) * inv);
  for (int64_t j = body; j < end; ++j) s[j] *= inv;
}

TANDEM_SIMD_KERNEL void softmax_backward_row(const float* p, float* dp, int64_t n, float scale) {
  const int64_t body = n - n % 16;
  f32x16 dot16 = {};
  for (int64_t j = 0; j < body; j += 16) dot16 += load16(p + j) * load16(dp + j);
  float dot = 0.0f;
  for (int i = 0; i < 16; ++i) dot += dot16[i];
  for (int64_t j = body; j < n; ++j) dot += p[j] * dp[j];
  for (int64_t j = 0; j < body; j += 16) store16(dp + j, load16(p + j) * (load16(dp + j) - dot) * scale);
  for (int64_t j = body; j < n; ++j) dp[j] = p[j] * (dp[j] - dot) * scale;
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
        gemm_native(T, T, dh, q + at, D, panel_.data(), T, p, T, false);
        for (int64_t i = 0; i < T; ++i) masked_softmax_row(p + i * T, T, scale_, mask ? mask + b * T : nullptr, g_.causal ? i : -1);
        gemm_native(T, dh, T, p, T, v + at, D, out + at, D, false);
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
          gemm_native(T, dh, T, square2_.data(), T, dout + at, D, dv + at, D, false);
        }
        if (!dq && !dk) continue;
        transpose(T, dh, v + at, D, panel_.data());  // V^T
        gemm_native(T, T, dh, dout + at, D, panel_.data(), T, ds, T, false);  // dP
        for (int64_t i = 0; i < T; ++i) softmax_backward_row(p + i * T, ds + i * T, T, scale_);
        if (dq) gemm_native(T, dh, T, ds, T, k + at, D, dq + at, D, false);
        if (dk) {
          transpose(T, T, ds, T, square2_.data());  // dS^T
          gemm_native(T, dh, T, square2_.data(), T, q + at, D, dk + at, D, false);
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
