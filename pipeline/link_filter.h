// Filters on a stage's links: what a stage sends over a link is changed before it leaves, and
// what comes back for it is taken back through the change. These are the privacy filters of a
// split (README, "What leaves the data"), as objects any stage of a pipeline can put on its
// links (StagePeer::set_filters): noise on the activations a stage sends down (differential
// privacy, with an accountant), NoPeek's penalty on them, and noise on the gradient a loss
// stage sends up, so that the party before learns less of the labels. The wire codec (the
// links' dtype) and the egress audit are the links' own (StagePlan::dtype, the host's link).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/privacy/cut_noise.h"
#include "core/tensor.h"

namespace tandem {

class LinkFilter {
 public:
  virtual ~LinkFilter() = default;
  virtual std::string name() const = 0;
  // The stage's step begins (the first stage: its rows, each [samples, ...]; later stages: none).
  virtual void begin_step(std::span<const Tensor> first_inputs, uint32_t samples, uint32_t microbatches) {
    (void)first_inputs, (void)samples, (void)microbatches;
  }
  // Down: the activations micro-batch `mb` sends (`begin`: its first sample in the step). The
  // result (activations itself or a buffer of the filter's) is valid until the step's end.
  virtual const Tensor& activations_out(const Tensor& activations, uint32_t mb, int64_t begin) {
    (void)mb, (void)begin;
    return activations;
  }
  // Down: the activations of an evaluation micro-batch (nothing comes back for them).
  virtual const Tensor& evaluation_out(const Tensor& activations, uint32_t mb) {
    (void)mb;
    return activations;
  }
  // Down: the gradient of what micro-batch `mb` sent, as it came back: the gradient of the
  // stage's own output.
  virtual const Tensor& gradient_in(const Tensor& grad, uint32_t mb, int64_t begin) {
    (void)mb, (void)begin;
    return grad;
  }
  // Up, at the loss stage: the loss's gradient at the stage's output from which the gradient
  // sent up is computed, or null for the exact one. The stage's own weights train on the
  // exact one either way (StagePeer backs up twice).
  virtual const Tensor* loss_gradient_up(const Tensor& grad, uint32_t mb, uint32_t samples) {
    (void)grad, (void)mb, (void)samples;
    return nullptr;
  }
  // Whether loss_gradient_up gives one: the loss stage then backs each micro-batch up twice
  // (whole: the schedule must not split its backward).
  virtual bool backs_up_twice() const { return false; }
  // Up: the gradient micro-batch `mb` sends to the stage before, in a step of `samples`.
  virtual const Tensor& gradient_out(const Tensor& grad, uint32_t mb, uint32_t samples) {
    (void)mb, (void)samples;
    return grad;
  }
  // Up: whether the loss and correct count must stay here (they would tell of the labels that
  // the filter hides): Gradients then carry 0 for both.
  virtual bool hides_loss() const { return false; }
  // Whether the filter reads a whole step before the first gradient comes back (NoPeek): the
  // schedule must forward every micro-batch before its first backward at this stage.
  virtual bool needs_whole_step() const { return false; }
  // The step in flight is dropped (a lost link).
  virtual void reset() {}
};

// Differential privacy on the activations a stage sends (core/privacy/cut_noise.h): each
// sample's activations clipped to L2 norm `clip`, plus N(0, (sigma*clip)^2) per element; the
// gradient that comes back goes through the clip. seed 0: the noise from the OS's entropy.
class CutNoiseFilter final : public LinkFilter {
 public:
  CutNoiseFilter(float clip, float sigma, uint64_t seed) : noise_(clip, sigma, seed) {}
  std::string name() const override;
  const Tensor& activations_out(const Tensor& activations, uint32_t mb, int64_t begin) override;
  const Tensor& gradient_in(const Tensor& grad, uint32_t mb, int64_t begin) override;
  // Evaluation batches leave clipped and noised too (as tandem-edge's default --dp-eval noised).
  const Tensor& evaluation_out(const Tensor& activations, uint32_t mb) override;

 private:
  struct Slot {
    Tensor sent_from, noised, grad;  // the stage's output (a view), what left, the gradient back
    std::vector<float> scales;
  };
  Slot& slot(uint32_t mb);
  CutNoise noise_;
  std::vector<Slot> slots_;
};

// NoPeek (core/privacy/nopeek.h) on the activations a stage sends: alpha times the distance
// correlation between the step's first input and its activations joins the stage's loss. The
// penalty is the whole step's (its micro-batches' activations gathered), so it does not
// depend on K; its gradient is added to what comes back. Reads the step's correlation after
// its first gradient (dcor()).
class NoPeekFilter final : public LinkFilter {
 public:
  explicit NoPeekFilter(float alpha) : alpha_(alpha) {}
  std::string name() const override;
  void begin_step(std::span<const Tensor> first_inputs, uint32_t samples, uint32_t microbatches) override;
  const Tensor& activations_out(const Tensor& activations, uint32_t mb, int64_t begin) override;
  const Tensor& gradient_in(const Tensor& grad, uint32_t mb, int64_t begin) override;
  bool needs_whole_step() const override { return true; }
  void reset() override { ready_ = false; }
  // The last step's distance correlation, in [0, 1].
  double dcor() const { return dcor_; }

 private:
  float alpha_;
  Tensor x_;  // the step's first input
  uint32_t samples_ = 0, k_ = 0, seen_ = 0;
  int64_t row_ = 0;
  std::vector<float> z_, grad_;
  std::vector<Tensor> out_;  // per micro-batch: the gradient plus the penalty's
  std::vector<double> work_;
  bool ready_ = false;
  double dcor_ = 0.0;
};

// Noise on the gradient a stage sends up (the loss stage's, computed from the labels): each
// sample's gradient of its own loss (its row times the step's samples) clipped to L2 norm
// `clip`, plus N(0, (sigma*clip)^2) per element. The loss and correct count stay here. No
// epsilon is claimed: the stage's own weights train on the exact gradient.
class GradNoiseFilter final : public LinkFilter {
 public:
  GradNoiseFilter(float clip, float sigma, uint64_t seed) : noise_(clip, sigma, seed) {}
  std::string name() const override;
  const Tensor& gradient_out(const Tensor& grad, uint32_t mb, uint32_t samples) override;
  bool hides_loss() const override { return true; }

 private:
  CutNoise noise_;
  Tensor per_sample_, out_;
  std::vector<float> scales_;
};

// Label noise at the loss stage (as tandem-edge's --label-noise in a U-shaped split): each
// sample's gradient of its own loss at the logits, p - onehot(y) per head (L2 norm at most
// sqrt(2) a head), gets N(0, sigma^2) per value for the gradient sent up; the stage's own
// weights train on the exact one. The noise sits where the labels enter, so it hides them at
// less cost than GradNoiseFilter. The loss and correct count stay here. No epsilon is
// claimed. Softmax cross-entropy models only (`heads`: the model's output groups).
class LabelNoiseFilter final : public LinkFilter {
 public:
  LabelNoiseFilter(float sigma, int heads, uint64_t seed);
  std::string name() const override;
  const Tensor* loss_gradient_up(const Tensor& grad, uint32_t mb, uint32_t samples) override;
  bool backs_up_twice() const override { return true; }
  bool hides_loss() const override { return true; }

 private:
  float sigma_;
  CutNoise noise_;
  Tensor per_sample_, out_;
  std::vector<float> scales_;
};

}  // namespace tandem
