// Linear: x[N, I] -> x W^T + b with W [O, I]; all three passes run in the backend. A
// sequence [batch, tokens, I] is batch * tokens rows. With a LoRA adapter (NodeSpec::lora),
// y += s (x A^T) B^T, s = alpha / rank, A [r, I] and B [O, r] on the backend's linear
// kernels too; the base W and b are frozen then, as with NodeSpec::freeze.
#include "core/layers/layers.h"

#include <cmath>
#include <cstring>

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
  if (const LoraAttrs& l = node.spec.lora; l.rank > 0) {
    // PEFT's initialisation: A as a linear layer's weight (U(+-1/sqrt(in))), B zero.
    lora_a_.emplace(node.spec.name + ".lora_A.weight", Shape{l.rank, geometry_.in_features});
    lora_b_.emplace(node.spec.name + ".lora_B.weight", Shape{geometry_.out_features, l.rank});
    init_uniform(*lora_a_, bound, rng);
    lora_scale_ = l.scale();
  }
  if (node.spec.freeze || lora_a_) {
    weight_.freeze();
    if (bias_) bias_->freeze();
  }
}

std::vector<Param*> LinearLayer::params() {
  std::vector<Param*> out{&weight_};
  if (bias_) out.push_back(&*bias_);
  if (lora_a_) out.insert(out.end(), {&*lora_a_, &*lora_b_});
  return out;
}

int64_t LinearLayer::rows(const Tensor& x) const { return x.numel() / geometry_.in_features; }

LinearKernel& LinearLayer::kernel(int64_t batch) {
  return kernels_.get(batch, [&](int64_t n) {
    LinearGeometry g = geometry_;
    g.batch = n;
    return backend_.linear(g);
  });
}

LinearLayer::Lora& LinearLayer::lora(int64_t batch) {
  return lora_kernels_.get(batch, [&](int64_t n) {
    auto k = std::make_unique<Lora>();
    const int64_t r = lora_a_->value().shape()[0];
    k->down = backend_.linear(LinearGeometry{n, geometry_.in_features, r, false});
    k->up = backend_.linear(LinearGeometry{n, r, geometry_.out_features, false});
    k->up_out = Tensor::empty({n, geometry_.out_features});
    k->scaled_dy = Tensor::empty({n, geometry_.out_features});
    k->dx = Tensor::empty({n, geometry_.in_features});
    return k;
  });
}

void LinearLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  const int64_t n = rows(in[0]);
  kernel(n).forward(in[0].data(), view_of(weight_, bias_ ? &*bias_ : nullptr), out.data());
  if (!lora_a_) return;
  // The stash keeps x A^T for backward, then (backward_data) the gradient reaching it.
  const int64_t r = lora_a_->value().shape()[0];
  auto* xa = static_cast<float*>(stash.reserve(2 * static_cast<std::size_t>(n * r) * sizeof(float)));
  Lora& k = lora(n);
  k.down->forward(in[0].data(), view_of(*lora_a_, nullptr), xa);
  k.up->forward(xa, view_of(*lora_b_, nullptr), k.up_out.data());
  float* y = out.data();
  const float* u = k.up_out.data();
  for (int64_t i = 0, e = n * geometry_.out_features; i < e; ++i) y[i] += lora_scale_ * u[i];
}

void LinearLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                           std::span<Tensor> grad_in, Stash& stash) {
  backward_data(in, out, grad_out, grad_in, stash);
  backward_weights(in, out, grad_out, stash);
}

// s * dy, the gradient reaching the adapter's output.
const Tensor& LinearLayer::scaled(Lora& k, const Tensor& grad_out, int64_t n) const {
  const float* dy = grad_out.data();
  float* s = k.scaled_dy.data();
  for (int64_t i = 0, e = n * geometry_.out_features; i < e; ++i) s[i] = lora_scale_ * dy[i];
  return k.scaled_dy;
}

void LinearLayer::backward_data(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                                std::span<Tensor> grad_in, Stash& stash) {
  const int64_t n = rows(in[0]);
  if (grad_in[0].defined())
    kernel(n).backward_data(grad_out.data(), view_of(weight_, bias_ ? &*bias_ : nullptr), grad_in[0].data());
  if (!lora_a_) return;
  Lora& k = lora(n);
  float* dxa = reinterpret_cast<float*>(stash.bytes.data()) + n * lora_a_->value().shape()[0];
  k.up->backward_data(scaled(k, grad_out, n).data(), view_of(*lora_b_, nullptr), dxa);  // d(xA^T) = s dy B
  if (!grad_in[0].defined()) return;
  k.down->backward_data(dxa, view_of(*lora_a_, nullptr), k.dx.data());  // its part of dx: d(xA^T) A
  float* dx = grad_in[0].data();
  const float* add = k.dx.data();
  for (int64_t i = 0, e = n * geometry_.in_features; i < e; ++i) dx[i] += add[i];
}

void LinearLayer::backward_weights(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, Stash& stash) {
  const int64_t n = rows(in[0]);
  if (weight_.trainable()) {
    kernel(n).backward_weights(in[0].data(), grad_out.data(), weight_.grad_target(),
                               bias_ ? bias_->grad_target() : nullptr);
    weight_.commit_grad();
    if (bias_) bias_->commit_grad();
  }
  if (!lora_a_) return;
  Lora& k = lora(n);
  const float* xa = reinterpret_cast<const float*>(stash.bytes.data());
  const float* dxa = xa + n * lora_a_->value().shape()[0];
  k.up->backward_weights(xa, scaled(k, grad_out, n).data(), lora_b_->grad_target(), nullptr);  // dB = s dy^T xA^T
  k.down->backward_weights(in[0].data(), dxa, lora_a_->grad_target(), nullptr);               // dA = d(xA^T)^T x
  lora_b_->commit_grad();
  lora_a_->commit_grad();
}

}  // namespace tandem
