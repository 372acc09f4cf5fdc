// Heads: N independent Linear-ReLU-Linear heads on one feature vector, run as three calls a
// pass whatever N is: one Linear F -> N*H (all first layers), one ReLU, one grouped linear of
// N x (H -> O) (all second layers). The ReLU output and the backward's scratch live in the
// micro-batch's stash.
#include <cmath>

#include "core/layers/layers.h"

namespace tandem {

HeadsLayer::HeadsLayer(const GraphNode& node, const Shape& in, Backend& backend, Rng& rng)
    : Layer(node.spec.name), backend_(backend), heads_(node.spec.heads), features_(in[0]),
      w1_(node.spec.name + ".w1", Shape{heads_.count * heads_.hidden, in[0]}),
      b1_(node.spec.name + ".b1", Shape{heads_.count * heads_.hidden}),
      w2_(node.spec.name + ".w2", Shape{heads_.count, heads_.out_features, heads_.hidden}),
      b2_(node.spec.name + ".b2", Shape{heads_.count * heads_.out_features}) {
  // Each head's layers as PyTorch initialises a Linear: U(+-1/sqrt(fan_in)).
  const float bound1 = 1.0f / std::sqrt(static_cast<float>(features_));
  const float bound2 = 1.0f / std::sqrt(static_cast<float>(heads_.hidden));
  init_uniform(w1_, bound1, rng);
  init_uniform(b1_, bound1, rng);
  init_uniform(w2_, bound2, rng);
  init_uniform(b2_, bound2, rng);
}

std::vector<Param*> HeadsLayer::params() { return {&w1_, &b1_, &w2_, &b2_}; }

HeadsLayer::Kernels& HeadsLayer::kernels(int64_t batch) {
  for (auto& [n, k] : kernels_)
    if (n == batch) return *k;
  auto k = std::make_unique<Kernels>();
  const int64_t hidden = heads_.count * heads_.hidden;
  k->first = backend_.linear({batch, features_, hidden, true});
  k->relu = backend_.relu(batch * hidden);
  k->second = backend_.grouped_linear({batch, heads_.count, heads_.hidden, heads_.out_features, true});
  kernels_.emplace_back(batch, std::move(k));
  return *kernels_.back().second;
}

void HeadsLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  const int64_t batch = in[0].shape()[0], hidden = batch * heads_.count * heads_.hidden;
  Kernels& k = kernels(batch);
  auto* a = static_cast<float*>(stash.reserve(3 * static_cast<std::size_t>(hidden) * sizeof(float)));
  k.first->forward(in[0].data(), view_of(w1_, &b1_), a);
  k.relu->forward(a, a);
  k.second->forward(a, view_of(w2_, &b2_), out.data());
}

void HeadsLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                          std::span<Tensor> grad_in, Stash& stash) {
  backward_data(in, out, grad_out, grad_in, stash);
  backward_weights(in, out, grad_out, stash);
}

// The stash holds a (the ReLU output), da and dh: the data pass leaves dh there for the
// weights pass.
void HeadsLayer::backward_data(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                               std::span<Tensor> grad_in, Stash& stash) {
  const int64_t batch = in[0].shape()[0], hidden = batch * heads_.count * heads_.hidden;
  Kernels& k = kernels(batch);
  auto* a = reinterpret_cast<float*>(stash.bytes.data());
  float* da = a + hidden;
  float* dh = da + hidden;
  k.second->backward_data(grad_out.data(), view_of(w2_, &b2_), da);
  k.relu->backward(a, da, dh);
  if (grad_in[0].defined()) k.first->backward_data(dh, view_of(w1_, &b1_), grad_in[0].data());
}

void HeadsLayer::backward_weights(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, Stash& stash) {
  const int64_t batch = in[0].shape()[0], hidden = batch * heads_.count * heads_.hidden;
  Kernels& k = kernels(batch);
  auto* a = reinterpret_cast<float*>(stash.bytes.data());
  const float* dh = a + 2 * hidden;
  k.second->backward_weights(a, grad_out.data(), w2_.grad_target(), b2_.grad_target());
  k.first->backward_weights(in[0].data(), dh, w1_.grad_target(), b1_.grad_target());
  for (Param* p : params()) p->commit_grad();
}

}  // namespace tandem
