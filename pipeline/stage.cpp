#include "pipeline/stage.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/loss.h"

namespace tandem {

namespace {
class Busy {
 public:
  explicit Busy(double& into) : into_(into), t0_(std::chrono::steady_clock::now()) {}
  ~Busy() { into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  double& into_;
  std::chrono::steady_clock::time_point t0_;
};
}  // namespace

Stage::Stage(Network& network, Optimizer* optimizer) : net_(network), optimizer_(optimizer) {}

void Stage::zero_grad() {
  if (mirror_) mirror_->zero_grad();
  net_.zero_grad();
  step_samples_ = 0;
}

void Stage::reset() {
  if (mirror_) mirror_->reset();
  StageMirror* mirror = mirror_;
  mirror_ = nullptr;  // the members reset alike, told once
  use_stash(false);
  net_.drop_deferred_weights();
  zero_grad();
  mirror_ = mirror;
}

void Stage::stash_weights() {
  if (mirror_) mirror_->stash_weights();
  StageMirror* mirror = mirror_;
  mirror_ = nullptr;
  use_stash(false);
  mirror_ = mirror;
  std::size_t k = 0;
  for (Param* p : net_.params()) {
    if (stash_.size() <= k) stash_.push_back(Tensor::empty(p->value().shape()));
    stash_[k++].copy_from(p->value());
  }
}

void Stage::use_stash(bool stashed) {
  if (stashed_ == stashed || stash_.empty()) return;
  if (mirror_) mirror_->use_stash(stashed);
  std::size_t k = 0;
  for (Param* p : net_.params()) {
    std::swap(p->value(), stash_[k++]);
    p->bump_version();  // kernels that pack weights see another tensor
  }
  stashed_ = stashed;
}

const Tensor& Stage::forward(std::span<const Tensor> inputs, int slot) {
  if (mirror_) mirror_->forward(inputs, slot, true);
  Busy busy(busy_s_);
  net_.set_training(true);
  if (!inputs.empty() && inputs[0].shape().rank() > 0) step_samples_ += static_cast<uint64_t>(inputs[0].shape()[0]);
  return net_.forward(inputs, slot);
}

const Tensor& Stage::evaluate(std::span<const Tensor> inputs, int slot) {
  if (mirror_) mirror_->forward(inputs, slot, false);
  Busy busy(busy_s_);
  net_.set_training(false);
  return net_.forward(inputs, slot);
}

Tensor Stage::backward(const Tensor& grad_output, int slot, bool want_input_grad, bool defer_weights) {
  if (mirror_) mirror_->backward(grad_output, slot, want_input_grad, defer_weights);
  Busy busy(busy_s_);
  return net_.backward(grad_output, slot, want_input_grad, defer_weights);
}

void Stage::backward_weights(int slot) {
  if (mirror_) mirror_->backward_weights(slot);
  Busy busy(busy_s_);
  net_.backward_weights(slot);
}

bool Stage::step(uint64_t samples) {
  if (!optimizer_) fail("stage", cat(graph().name(), " has no optimizer: it cannot take a step"));
  if (mirror_) mirror_->step(samples, optimizer_->lr_scale());
  Busy busy(busy_s_);
  bool apply = true;
  if (sync_) {
    if (!stash_.empty())
      fail("stage", cat(graph().name(), " has replicas and stashes weights: the asynchronous schedule's updates "
                        "would count the next step's samples; run replicas under a synchronous schedule"));
    apply = sync_->before_update(samples, nullptr) > 0;
  }
  if (apply) optimizer_->step();
  step_samples_ = 0;
  if (sync_) sync_->after_update();
  return apply;
}

double Stage::loss(const Tensor& outputs, const int32_t* labels, float grad_scale, Tensor* grad) const {
  return compute_loss(graph().loss(), outputs, labels, grad_scale, grad, graph().output_groups());
}

int64_t Stage::correct(const Tensor& outputs, const int32_t* labels) const {
  return count_correct(outputs, labels, graph().output_groups());
}

Tensor& Stage::output_grad(int slot) {
  if (slot < 0) fail("stage", cat("slot ", slot, " is negative"));
  if (output_grads_.size() <= static_cast<std::size_t>(slot)) output_grads_.resize(static_cast<std::size_t>(slot) + 1);
  return output_grads_[static_cast<std::size_t>(slot)];
}

Stage::LossPass Stage::forward_loss(std::span<const Tensor> inputs, int slot, const int32_t* labels, float grad_scale) {
  const Tensor& out = forward(inputs, slot);
  Busy busy(busy_s_);
  Tensor& grad = output_grad(slot);
  sized(grad, out.shape());
  LossPass pass;
  pass.loss = loss(out, labels, grad_scale, &grad);
  pass.correct = correct(out, labels);
  pass.finite = std::isfinite(pass.loss);
  return pass;
}

Stage::LossPass Stage::train_loss(std::span<const Tensor> inputs, int slot, const int32_t* labels, float grad_scale,
                                  bool want_input_grad, bool defer_weights) {
  LossPass pass = forward_loss(inputs, slot, labels, grad_scale);
  if (pass.finite) pass.input_grad = backward(output_grad(slot), slot, want_input_grad, defer_weights);
  return pass;
}

}  // namespace tandem
