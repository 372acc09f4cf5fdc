// LayerNormLayer: the rows of the input (every sample's, or every token's, last dimension)
// through the backend's LayerNormKernel; each row's mean and variance stashed for backward.
#include "core/layers/layers.h"

namespace tandem {

LayerNormLayer::LayerNormLayer(const GraphNode& node, const Shape& in, Backend& backend)
    : Layer(node.spec.name), attrs_(node.spec.layer_norm), features_(in[in.rank() - 1]),
      weight_(node.spec.name + ".weight", Shape{features_}), bias_(node.spec.name + ".bias", Shape{features_}),
      backend_(backend) {
  weight_.value().fill(1.0f);  // PyTorch's initialisation: scale 1, shift 0
  weight_.bump_version();
  if (node.spec.freeze) {
    weight_.freeze();
    bias_.freeze();
    frozen_grads_ = Tensor::empty({2 * features_});  // the kernel's scale and shift gradients, unused
  }
}

LayerNormKernel& LayerNormLayer::kernel(int64_t rows) {
  return kernels_.get(rows, [&](int64_t n) { return backend_.layer_norm(LayerNormGeometry{n, features_, attrs_.eps}); });
}

void LayerNormLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  const int64_t rows = in[0].numel() / features_;
  auto* stats = static_cast<float*>(stash.reserve(2 * static_cast<std::size_t>(rows) * sizeof(float)));
  kernel(rows).forward(in[0].data(), weight_.value().data(), bias_.value().data(), out.data(), stats, stats + rows);
}

void LayerNormLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash& stash) {
  const int64_t rows = in[0].numel() / features_;
  const auto* stats = reinterpret_cast<const float*>(stash.bytes.data());
  const bool frozen = !weight_.trainable();
  if (frozen && !grad_in[0].defined()) return;
  kernel(rows).backward(in[0].data(), grad_out.data(), weight_.value().data(), stats, stats + rows,
                        grad_in[0].defined() ? grad_in[0].data() : nullptr,
                        frozen ? frozen_grads_.data() : weight_.grad_target(),
                        frozen ? frozen_grads_.data() + features_ : bias_.grad_target());
  if (frozen) return;
  weight_.commit_grad();
  bias_.commit_grad();
}

}  // namespace tandem
