// Linear: x[N, I] -> x W^T + b with W [O, I]; all three passes run in the backend. A
// sequence [batch, tokens, I] is batch * tokens rows. With a LoRA adapter (NodeSpec::lora),
// y += s (x A^T) B^T, s = alpha / rank, A [r, I] and B [O, r] on the backend's linear
// kernels too; the base W and b are frozen then, as with NodeSpec::freeze. PEFT's
// lora_dropout drops the adapter's input (not the base layer's) in training.
#include "core/layers/dropout_mask.h"
#include "core/layers/layers.h"

#include <cmath>
#include <cstring>

namespace tandem {
namespace {

// An adapter's temporaries (its dropped input, its output before it is added, its part of dx)
// live only inside one call, so every adapter a thread runs shares them, grown to the largest
// asked for, instead of each keeping its own per row count (spam-bert's four adapters held
// 29 MiB so). One layer runs at a time on a thread; a network is run by one thread at a time.
struct LoraScratch {
  Tensor first, second;
  std::vector<uint8_t> keep;  // a dropout mask, drawn again from its call (LinearLayer::dropout_keep)
};
thread_local LoraScratch scratch;
float* lora_scratch(Tensor LoraScratch::*which, int64_t floats) {
  Tensor& t = scratch.*which;
  if (!t.defined() || t.numel() < floats) t = Tensor::empty(Shape{floats});
  return t.data();
}
uint8_t* lora_keep_scratch(int64_t values) {
  if (scratch.keep.size() < static_cast<std::size_t>(values)) scratch.keep.resize(static_cast<std::size_t>(values));
  return scratch.keep.data();
}

void scale_in_place(float* v, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) v[i] *= s;
}

}  // namespace

LinearLayer::LinearLayer(const GraphNode& node, const Shape& in, Backend& backend, Rng& rng)
    : Layer(node.spec.name), backend_(backend),
      weight_(node.spec.name + ".weight", Shape{node.spec.linear.out_features, in[in.rank() - 1]}) {
  geometry_.in_features = in[in.rank() - 1];
  geometry_.out_features = node.spec.linear.out_features;
  geometry_.bias = node.spec.linear.bias;
  geometry_.weights_id = new_weights_id();
  const float bound = 1.0f / std::sqrt(static_cast<float>(geometry_.in_features));
  init_uniform(weight_, bound, rng);
  if (geometry_.bias) {
    bias_.emplace(node.spec.name + ".bias", Shape{geometry_.out_features});
    init_uniform(*bias_, bound, rng);
  }
  if (const LoraAttrs& l = node.spec.lora; l.rank > 0) {
    // PEFT's initialisation: A as a linear layer's weight (U(+-1/sqrt(in))), B zero.
    lora_ids_ = {new_weights_id(), new_weights_id()};
    lora_a_.emplace(node.spec.name + ".lora_A.weight", Shape{l.rank, geometry_.in_features});
    lora_b_.emplace(node.spec.name + ".lora_B.weight", Shape{geometry_.out_features, l.rank});
    init_uniform(*lora_a_, bound, rng);
    lora_scale_ = l.scale();
    lora_dropout_ = l.dropout;
    if (lora_dropout_ > 0.0f) lora_seed_ = rng.next();  // after the weights: no dropout, no change to them
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

std::vector<std::pair<std::string, uint64_t*>> LinearLayer::counters() {
  if (lora_dropout_ == 0.0f) return {};
  return {{name() + ".lora_dropout.seed", &lora_seed_}, {name() + ".lora_dropout.calls", &lora_calls_}};
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
    k->down = backend_.linear(LinearGeometry{n, geometry_.in_features, r, false, lora_ids_[0]});
    k->up = backend_.linear(LinearGeometry{n, r, geometry_.out_features, false, lora_ids_[1]});
    return k;
  });
}

void LinearLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  const int64_t n = rows(in[0]);
  kernel(n).forward(in[0].data(), view_of(weight_, bias_ ? &*bias_ : nullptr), out.data());
  if (!lora_a_) return;
  // The stash keeps x A^T for backward, then (backward_data) the gradient reaching it; with
  // dropout, then the call of the mask's stream this forward drew (0: it dropped nothing),
  // from which backward draws the mask again rather than keeping a byte a value.
  const int64_t r = lora_a_->value().shape()[0], values = n * geometry_.in_features;
  const std::size_t products = 2 * static_cast<std::size_t>(n * r) * sizeof(float);
  auto* bytes = static_cast<uint8_t*>(stash.reserve(products + (lora_dropout_ > 0.0f ? sizeof(uint64_t) : 0)));
  auto* xa = reinterpret_cast<float*>(bytes);
  Lora& k = lora(n);
  const float* x = in[0].data();
  if (lora_dropout_ > 0.0f) {
    uint64_t call = 0;
    if (training_) {
      call = ++lora_calls_;
      uint8_t* keep = lora_keep_scratch(values);
      dropout_mask(lora_seed_, call, lora_dropout_, values, keep);
      x = dropped_input(x, keep, n, lora_scratch(&LoraScratch::first, values));
    }
    std::memcpy(bytes + products, &call, sizeof call);
  }
  k.down->forward(x, view_of(*lora_a_, nullptr), xa);
  float* u = lora_scratch(&LoraScratch::second, n * geometry_.out_features);
  k.up->forward(xa, view_of(*lora_b_, nullptr), u);
  float* y = out.data();
  for (int64_t i = 0, e = n * geometry_.out_features; i < e; ++i) y[i] += lora_scale_ * u[i];
}

void LinearLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                           std::span<Tensor> grad_in, Stash& stash) {
  backward_data(in, out, grad_out, grad_in, stash);
  backward_weights(in, out, grad_out, stash);
}

const uint8_t* LinearLayer::dropout_keep(const Stash& stash, int64_t n) const {
  if (lora_dropout_ == 0.0f) return nullptr;
  const std::size_t products = 2 * static_cast<std::size_t>(n * lora_a_->value().shape()[0]) * sizeof(float);
  uint64_t call = 0;
  std::memcpy(&call, stash.bytes.data() + products, sizeof call);
  if (call == 0) return nullptr;
  const int64_t values = n * geometry_.in_features;
  uint8_t* keep = lora_keep_scratch(values);
  dropout_mask(lora_seed_, call, lora_dropout_, values, keep);
  return keep;
}

const float* LinearLayer::dropped_input(const float* x, const uint8_t* keep, int64_t n, float* to) const {
  const float scale = 1.0f / (1.0f - lora_dropout_);
  for (int64_t i = 0, e = n * geometry_.in_features; i < e; ++i) to[i] = keep[i] ? x[i] * scale : 0.0f;
  return to;
}

void LinearLayer::backward_data(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                                std::span<Tensor> grad_in, Stash& stash) {
  const int64_t n = rows(in[0]);
  if (grad_in[0].defined())
    kernel(n).backward_data(grad_out.data(), view_of(weight_, bias_ ? &*bias_ : nullptr), grad_in[0].data());
  if (!lora_a_) return;
  Lora& k = lora(n);
  const int64_t r = lora_a_->value().shape()[0];
  float* dxa = reinterpret_cast<float*>(stash.bytes.data()) + n * r;
  // d(xA^T) = s dy B, the scale applied to the n x r product rather than to dy (n x out).
  k.up->backward_data(grad_out.data(), view_of(*lora_b_, nullptr), dxa);
  scale_in_place(dxa, n * r, lora_scale_);
  if (!grad_in[0].defined()) return;
  float* add = lora_scratch(&LoraScratch::first, n * geometry_.in_features);
  k.down->backward_data(dxa, view_of(*lora_a_, nullptr), add);  // its part of dx: d(xA^T) A
  float* dx = grad_in[0].data();
  if (const uint8_t* keep = dropout_keep(stash, n)) {  // through the dropout: the kept values' share
    const float scale = 1.0f / (1.0f - lora_dropout_);
    for (int64_t i = 0, e = n * geometry_.in_features; i < e; ++i) dx[i] += keep[i] ? add[i] * scale : 0.0f;
    return;
  }
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
  float* db = lora_b_->grad_target();
  k.up->backward_weights(xa, grad_out.data(), db, nullptr);  // dB = s dy^T xA^T, scaled as O x r
  scale_in_place(db, lora_b_->value().numel(), lora_scale_);
  // dA = d(xA^T)^T x, x as the adapter saw it: the dropped input is rebuilt from the stash's
  // mask.
  const uint8_t* keep = dropout_keep(stash, n);
  const float* x = keep ? dropped_input(in[0].data(), keep, n, lora_scratch(&LoraScratch::first, n * geometry_.in_features))
                        : in[0].data();
  k.down->backward_weights(x, dxa, lora_a_->grad_target(), nullptr);
  lora_b_->commit_grad();
  lora_a_->commit_grad();
}

}  // namespace tandem
