// Noise on the cut (DP for the activations an edge sends): each sample's activations clipped
// to L2 norm C, then Gaussian noise of standard deviation sigma*C added; and the backward.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace tandem {

class CutNoise {
 public:
  // seed 0: seeded from the operating system's entropy (what a run uses: the cloud must not
  // be able to predict the noise); otherwise fixed, for tests.
  CutNoise(float clip, float sigma, uint64_t seed = 0);

  // Writes to `out` (the shape of `activations`, [n, ...]) each sample's activations scaled to
  // at most `clip` in L2 norm, plus N(0, (sigma*clip)^2) per element. `scales` receives each
  // sample's factor min(1, clip/norm) for backward.
  void forward(const Tensor& activations, Tensor& out, std::vector<float>& scales);
  // The gradient with respect to the activations from the one with respect to `out`: the
  // noise adds nothing; a clipped sample's gradient goes through the clip's Jacobian
  // s * (I - a a^T / |a|^2) (s = clip/|a|), an unclipped one's is unchanged.
  void backward(const Tensor& grad_out, const Tensor& activations, const std::vector<float>& scales,
                Tensor& grad_in) const;

  // For a gradient of a mean over `samples` (each row a sample's, divided by samples): each
  // sample's gradient of its own loss (its row times samples) through forward, scaled back, in
  // `out`. `per_sample` and `scales` are scratch.
  void forward_per_sample(const Tensor& grad, float samples, Tensor& per_sample, Tensor& out,
                          std::vector<float>& scales);

  float clip() const { return clip_; }
  float sigma() const { return sigma_; }

 private:
  double standard_normal();
  float clip_, sigma_;
  std::mt19937_64 engine_;
  bool have_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace tandem
