#include "core/privacy/cut_noise.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace tandem {

CutNoise::CutNoise(float clip, float sigma, uint64_t seed) : clip_(clip), sigma_(sigma) {
  if (!(clip > 0.0f)) fail("privacy", cat("the clip norm must be > 0, got ", clip));
  if (!(sigma >= 0.0f)) fail("privacy", cat("the noise multiplier must be >= 0, got ", sigma));
  if (seed == 0) {
    std::random_device os;  // the OS's entropy source on Linux and in browsers (crypto.getRandomValues)
    std::seed_seq seq{os(), os(), os(), os(), os(), os(), os(), os()};
    engine_.seed(seq);
  } else {
    engine_.seed(seed);
  }
}

double CutNoise::standard_normal() {
  // Box-Muller on 53-bit uniforms (the standard's normal_distribution differs between
  // libraries; this one is the same everywhere for a given seed).
  if (have_spare_) {
    have_spare_ = false;
    return spare_;
  }
  const double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1)), t = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(t);
  have_spare_ = true;
  return r * std::cos(t);
}

void CutNoise::forward(const Tensor& activations, Tensor& out, std::vector<float>& scales) {
  const int64_t n = activations.shape()[0], d = activations.shape().item_numel();
  sized(out, activations.shape());
  scales.assign(static_cast<std::size_t>(n), 1.0f);
  const float* a = activations.data();
  float* o = out.data();
  const double stddev = static_cast<double>(sigma_) * clip_;
  for (int64_t i = 0; i < n; ++i) {
    double sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sq += static_cast<double>(a[i * d + j]) * a[i * d + j];
    const double norm = std::sqrt(sq);
    const float s = norm > clip_ ? static_cast<float>(clip_ / norm) : 1.0f;
    scales[static_cast<std::size_t>(i)] = s;
    for (int64_t j = 0; j < d; ++j)
      o[i * d + j] = s * a[i * d + j] + (stddev > 0.0 ? static_cast<float>(stddev * standard_normal()) : 0.0f);
  }
}

void CutNoise::forward_per_sample(const Tensor& grad, float samples, Tensor& per_sample, Tensor& out,
                                  std::vector<float>& scales) {
  sized(per_sample, grad.shape());
  const float* g = grad.data();
  float* p = per_sample.data();
  for (int64_t i = 0, n = grad.numel(); i < n; ++i) p[i] = g[i] * samples;
  forward(per_sample, out, scales);
  float* o = out.data();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) o[i] /= samples;
}

void CutNoise::backward(const Tensor& grad_out, const Tensor& activations, const std::vector<float>& scales,
                        Tensor& grad_in) const {
  const int64_t n = activations.shape()[0], d = activations.shape().item_numel();
  if (grad_out.shape() != activations.shape() || static_cast<int64_t>(scales.size()) != n)
    fail("privacy", cat("the cut's gradient ", grad_out.shape().str(), " does not fit its activations ",
                        activations.shape().str()));
  sized(grad_in, activations.shape());
  const float *a = activations.data(), *g = grad_out.data();
  float* gi = grad_in.data();
  for (int64_t i = 0; i < n; ++i) {
    const float s = scales[static_cast<std::size_t>(i)];
    if (s >= 1.0f) {
      for (int64_t j = 0; j < d; ++j) gi[i * d + j] = g[i * d + j];
      continue;
    }
    double sq = 0.0, dot = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      sq += static_cast<double>(a[i * d + j]) * a[i * d + j];
      dot += static_cast<double>(a[i * d + j]) * g[i * d + j];
    }
    const double k = dot / sq;
    for (int64_t j = 0; j < d; ++j) gi[i * d + j] = static_cast<float>(s * (g[i * d + j] - a[i * d + j] * k));
  }
}

}  // namespace tandem
