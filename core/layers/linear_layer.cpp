// Linear: x[N, I] -> x W^T + b with W [O, I]; all three passes run in the backend. A
// sequence [batch, tokens, I] is batch * tokens rows.
#include "core/layers/layers.h"

#include <cmath>

namespace tandem {

LinearLayer::LinearLayer(const GraphNode& node, const Shape& in, Backend& backend, Rng& rng)
    : Layer(node.spec.name), backend_(backend),
      weight_(node.spec.name + ".weight", Shape{node.spec.linear.out_features, in[in.rank() - 1]}) {
  geometry_.in_features = in[in.rank() - 1];
  geometry_.out_features = node.spec.linear.out_features;
  geometry_.bias = node.spec.linear.bias;
  const float bound = 1.0f / std::sqrt(static_cast<float>(geometry_.in_features));
  init_uniform(weight_, bound, rng);
  if (geometry_.bias) {
    bias_.emplace(node.spec.name + ".bias", Shape{geometry_.out_features});
    init_uniform(*bias_, bound, rng);
  }
}

std::vector<Param*> LinearLayer::params() {
  if (bias_) return {&weight_, &*bias_};
  return {&weight_};
}

int64_t LinearLayer::rows(const Tensor& x) const { return x.numel() / geometry_.in_features; }

LinearKernel& LinearLayer::kernel(int64_t batch) {
  return kernels_.get(batch, [&](int64_t n) {
    LinearGeometry g = geometry_;
    g.batch = n;
    return backend_.linear(g);
  });
}

void LinearLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(rows(in[0])).forward(in[0].data(), view_of(weight_, bias_ ? &*bias_ : nullptr), out.data());
}

void LinearLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                           std::span<Tensor> grad_in, Stash& stash) {
  backward_data(in, out, grad_out, grad_in, stash);
  backward_weights(in, out, grad_out, stash);
}

void LinearLayer::backward_data(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                                std::span<Tensor> grad_in, Stash&) {
  if (grad_in[0].defined())
    kernel(rows(in[0])).backward_data(grad_out.data(), view_of(weight_, bias_ ? &*bias_ : nullptr),
                                           grad_in[0].data());
}

void LinearLayer::backward_weights(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, Stash&) {
  kernel(rows(in[0])).backward_weights(in[0].data(), grad_out.data(), weight_.grad_target(),
                                            bias_ ? bias_->grad_target() : nullptr);
  weight_.commit_grad();
  if (bias_) bias_->commit_grad();
}

}  // namespace tandem
