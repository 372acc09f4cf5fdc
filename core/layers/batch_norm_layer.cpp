// Batch normalisation over the last dimension (channels in NHWC; features after a linear),
// as torch.nn.BatchNorm2d/1d: training normalises with the micro-batch's statistics and
// updates the running ones (unbiased variance); evaluation uses the running ones. A
// per-channel reduction and an affine map: one portable loop for every backend.
#include <cmath>

#include "core/layers/layers.h"

namespace tandem {

BatchNormLayer::BatchNormLayer(const GraphNode& node, const Shape& in, Rng&)
    : Layer(node.spec.name), attrs_(node.spec.batch_norm), channels_(in[in.rank() - 1]),
      weight_(node.spec.name + ".weight", Shape{channels_}), bias_(node.spec.name + ".bias", Shape{channels_}),
      running_mean_(Tensor::zeros({channels_})), running_var_(Tensor::empty({channels_})) {
  weight_.value().fill(1.0f);  // PyTorch's initialisation: scale 1, shift 0
  weight_.bump_version();
  running_var_.fill(1.0f);
}

std::vector<Param*> BatchNormLayer::params() { return {&weight_, &bias_}; }

void BatchNormLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  const int64_t c = channels_, rows = in[0].numel() / c;
  const float* x = in[0].data();
  float* y = out.data();
  // Stash: per channel the mean and 1/sqrt(var + eps) used, then the mode (1: training), for
  // this micro-batch's backward.
  auto* stats = static_cast<float*>(stash.reserve((2 * static_cast<std::size_t>(c) + 1) * sizeof(float)));
  float* mean = stats;
  float* inv_std = stats + c;
  if (training_) {
    for (int64_t k = 0; k < c; ++k) {
      double s = 0.0, ss = 0.0;
      for (int64_t r = 0; r < rows; ++r) s += x[r * c + k];
      const double m = s / static_cast<double>(rows);
      for (int64_t r = 0; r < rows; ++r) ss += (x[r * c + k] - m) * (x[r * c + k] - m);
      const double var = ss / static_cast<double>(rows);
      mean[k] = static_cast<float>(m);
      inv_std[k] = static_cast<float>(1.0 / std::sqrt(var + attrs_.eps));
      const double unbiased = rows > 1 ? ss / static_cast<double>(rows - 1) : var;
      running_mean_[k] = static_cast<float>((1.0 - attrs_.momentum) * running_mean_[k] + attrs_.momentum * m);
      running_var_[k] = static_cast<float>((1.0 - attrs_.momentum) * running_var_[k] + attrs_.momentum * unbiased);
    }
  } else {
    for (int64_t k = 0; k < c; ++k) {
      mean[k] = running_mean_[k];
      inv_std[k] = 1.0f / std::sqrt(running_var_[k] + attrs_.eps);
    }
  }
  const float* g = weight_.value().data();
  const float* b = bias_.value().data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < c; ++k) y[r * c + k] = (x[r * c + k] - mean[k]) * inv_std[k] * g[k] + b[k];
  stats[2 * c] = training_ ? 1.0f : 0.0f;
}

void BatchNormLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash& stash) {
  const int64_t c = channels_, rows = in[0].numel() / c;
  const float* x = in[0].data();
  const float* dy = grad_out.data();
  const auto* stats = reinterpret_cast<const float*>(stash.bytes.data());
  const float* mean = stats;
  const float* inv_std = stats + c;
  const bool trained = stats[2 * c] != 0.0f;
  const float* g = weight_.value().data();
  float* dg = weight_.grad_target();
  float* db = bias_.grad_target();
  for (int64_t k = 0; k < c; ++k) {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const double xhat = (x[r * c + k] - mean[k]) * inv_std[k];
      sum_dy += dy[r * c + k];
      sum_dy_xhat += dy[r * c + k] * xhat;
    }
    dg[k] = static_cast<float>(sum_dy_xhat);
    db[k] = static_cast<float>(sum_dy);
    if (!grad_in[0].defined()) continue;
    float* dx = grad_in[0].data();
    const double n = static_cast<double>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const double xhat = (x[r * c + k] - mean[k]) * inv_std[k];
      // Training: the statistics depend on x too; evaluation: a fixed affine map.
      const double v = trained ? (n * dy[r * c + k] - sum_dy - xhat * sum_dy_xhat) / n : dy[r * c + k];
      dx[r * c + k] = static_cast<float>(g[k] * inv_std[k] * v);
    }
  }
  weight_.commit_grad();
  bias_.commit_grad();
}

}  // namespace tandem
