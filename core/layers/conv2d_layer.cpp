// Conv2d: NHWC input, OHWI weight, optional bias; all three passes run in the backend.
#include "core/layers/layers.h"

#include <cmath>

namespace tandem {

Conv2dLayer::Conv2dLayer(const GraphNode& node, const Shape& in, Backend& backend, Rng& rng)
    : Layer(node.spec.name), backend_(backend),
      weight_(node.spec.name + ".weight",
              Shape{node.spec.conv2d.out_channels, node.spec.conv2d.kernel[0], node.spec.conv2d.kernel[1],
                    in[2] / node.spec.conv2d.groups}) {
  const Conv2dAttrs& a = node.spec.conv2d;
  geometry_.in_h = in[0];
  geometry_.in_w = in[1];
  geometry_.in_c = in[2];
  geometry_.out_c = a.out_channels;
  geometry_.kernel_h = a.kernel[0];
  geometry_.kernel_w = a.kernel[1];
  geometry_.stride_h = a.stride[0];
  geometry_.stride_w = a.stride[1];
  geometry_.pad_h = a.padding[0];
  geometry_.pad_w = a.padding[1];
  geometry_.dilation_h = a.dilation[0];
  geometry_.dilation_w = a.dilation[1];
  geometry_.bias = a.bias;
  geometry_.groups = a.groups;
  // PyTorch's fan-in counts one group's input channels.
  const float bound = 1.0f / std::sqrt(static_cast<float>(in[2] / a.groups * a.kernel[0] * a.kernel[1]));
  init_uniform(weight_, bound, rng);
  if (a.bias) {
    bias_.emplace(node.spec.name + ".bias", Shape{a.out_channels});
    init_uniform(*bias_, bound, rng);
  }
  if (node.spec.freeze) {
    weight_.freeze();
    if (bias_) bias_->freeze();
  }
}

std::vector<Param*> Conv2dLayer::params() {
  if (bias_) return {&weight_, &*bias_};
  return {&weight_};
}

Conv2dKernel& Conv2dLayer::kernel(int64_t batch) {
  return kernels_.get(batch, [&](int64_t n) {
    Conv2dGeometry g = geometry_;
    g.batch = n;
    return backend_.conv2d(g);
  });
}

void Conv2dLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(in[0].shape()[0]).forward(in[0].data(), view_of(weight_, bias_ ? &*bias_ : nullptr), out.data());
}

void Conv2dLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                           std::span<Tensor> grad_in, Stash& stash) {
  backward_data(in, out, grad_out, grad_in, stash);
  backward_weights(in, out, grad_out, stash);
}

void Conv2dLayer::backward_data(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                                std::span<Tensor> grad_in, Stash&) {
  if (grad_in[0].defined())
    kernel(in[0].shape()[0]).backward_data(grad_out.data(), view_of(weight_, bias_ ? &*bias_ : nullptr),
                                           grad_in[0].data());
}

void Conv2dLayer::backward_weights(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, Stash&) {
  if (!weight_.trainable()) return;  // frozen (NodeSpec::freeze)
  kernel(in[0].shape()[0]).backward_weights(in[0].data(), grad_out.data(), weight_.grad_target(),
                                            bias_ ? bias_->grad_target() : nullptr);
  weight_.commit_grad();
  if (bias_) bias_->commit_grad();
}

}  // namespace tandem
