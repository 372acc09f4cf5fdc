// Batch normalisation over the last dimension (channels in NHWC; features after a linear),
// as torch.nn.BatchNorm2d/1d, through the backend's BatchNormKernel: training normalises with
// the micro-batch's statistics and updates the running ones (unbiased variance); evaluation
// uses the running ones.
#include <cmath>

#include "core/layers/layers.h"

namespace tandem {

BatchNormLayer::BatchNormLayer(const GraphNode& node, const Shape& in, Backend& backend)
    : Layer(node.spec.name), attrs_(node.spec.batch_norm), channels_(in[in.rank() - 1]),
      weight_(node.spec.name + ".weight", Shape{channels_}), bias_(node.spec.name + ".bias", Shape{channels_}),
      running_mean_(Tensor::zeros({channels_})), running_var_(Tensor::empty({channels_})),
      batch_var_(Tensor::empty({channels_})), backend_(backend) {
  weight_.value().fill(1.0f);  // PyTorch's initialisation: scale 1, shift 0
  weight_.bump_version();
  running_var_.fill(1.0f);
}

std::vector<Param*> BatchNormLayer::params() { return {&weight_, &bias_}; }

BatchNormKernel& BatchNormLayer::kernel(int64_t rows) {
  return kernels_.get(rows, [&](int64_t n) { return backend_.batch_norm(BatchNormGeometry{n, channels_, attrs_.eps}); });
}

void BatchNormLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  const int64_t c = channels_, rows = in[0].numel() / c;
  // Stash: per channel the mean and 1/sqrt(var + eps) used, then the mode (1: training), for
  // this micro-batch's backward.
  auto* stats = static_cast<float*>(stash.reserve((2 * static_cast<std::size_t>(c) + 1) * sizeof(float)));
  float* mean = stats;
  float* inv_std = stats + c;
  if (!training_)
    for (int64_t k = 0; k < c; ++k) {
      mean[k] = running_mean_[k];
      inv_std[k] = 1.0f / std::sqrt(running_var_[k] + attrs_.eps);
    }
  kernel(rows).forward(in[0].data(), weight_.value().data(), bias_.value().data(), training_, mean, inv_std,
                       batch_var_.data(), out.data());
  if (training_) {
    const double m = attrs_.momentum, unbias = rows > 1 ? static_cast<double>(rows) / static_cast<double>(rows - 1) : 1.0;
    for (int64_t k = 0; k < c; ++k) {
      running_mean_[k] = static_cast<float>((1.0 - m) * running_mean_[k] + m * mean[k]);
      running_var_[k] = static_cast<float>((1.0 - m) * running_var_[k] + m * batch_var_[k] * unbias);
    }
  }
  stats[2 * c] = training_ ? 1.0f : 0.0f;
}

void BatchNormLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash& stash) {
  const int64_t c = channels_, rows = in[0].numel() / c;
  const auto* stats = reinterpret_cast<const float*>(stash.bytes.data());
  kernel(rows).backward(in[0].data(), grad_out.data(), weight_.value().data(), stats, stats + c, stats[2 * c] != 0.0f,
                        grad_in[0].defined() ? grad_in[0].data() : nullptr, weight_.grad_target(), bias_.grad_target());
  weight_.commit_grad();
  bias_.commit_grad();
}

}  // namespace tandem
