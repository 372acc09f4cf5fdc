// A stage of a pipeline: one shard's Network and its Optimizer, with forward, backward and
// step over micro-batch slots, and, for the stage that holds the loss, forward -> loss ->
// backward. This is the one place that sequence is written: the in-process pipeline, the
// cloud's sessions, its joined batches and the edge's U-shaped tail all run it from here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/network.h"
#include "core/optimizer.h"

namespace tandem {

// What runs around a stage's update when the stage has replicas (pipeline/replicas.h): before
// it, with the samples the stage's training forwards saw since its last update, returning
// the samples every replica's update counts together (0: none saw one, and every replica
// skips the update alike); after it, applied or not. `lr_sum` (may be null): the update's
// learning-rate scales summed over its steps, in and out; a sync sums it over the replicas,
// so every replica scales the update alike even where its own steps' scales differ.
class UpdateSync {
 public:
  virtual ~UpdateSync() = default;
  virtual uint64_t before_update(uint64_t samples, double* lr_sum) = 0;
  virtual void after_update() = 0;
};

// What a stage tells the other members of its layer shards before each of its calls
// (pipeline/layer_shards.h: the members run the same calls on their slices, summing through
// their group). Every call that runs the network or changes its state is told, once, with
// what the others need to run it alike (the inputs, the output's gradient, the samples and
// the learning-rate scale); the loss runs on this member alone, and its gradient is told.
class StageMirror {
 public:
  virtual ~StageMirror() = default;
  virtual void forward(std::span<const Tensor> inputs, int slot, bool training) = 0;
  virtual void backward(const Tensor& grad_output, int slot, bool want_input_grad, bool defer_weights) = 0;
  virtual void backward_weights(int slot) = 0;
  virtual void step(uint64_t samples, float lr_scale) = 0;
  virtual void zero_grad() = 0;
  virtual void stash_weights() = 0;
  virtual void use_stash(bool stashed) = 0;
  virtual void reset() = 0;
};

class Stage {
 public:
  // `optimizer` may be null for a stage that is only evaluated. Neither is owned.
  Stage(Network& network, Optimizer* optimizer);

  Network& network() { return net_; }
  const Graph& graph() const { return net_.graph(); }
  Optimizer* optimizer() { return optimizer_; }

  // A training forward of one micro-batch into `slot` (Network::forward).
  const Tensor& forward(std::span<const Tensor> inputs, int slot);
  // An evaluation forward (Network::set_training(false): batch norm's running statistics,
  // no dropout), which keeps nothing for a backward.
  const Tensor& evaluate(std::span<const Tensor> inputs, int slot);
  // Its backward from the output's gradient (Network::backward); `defer_weights` leaves the
  // weight gradients for backward_weights(slot) (input gradients first).
  Tensor backward(const Tensor& grad_output, int slot, bool want_input_grad, bool defer_weights = false);
  void backward_weights(int slot);
  // The optimizer's update (zero_grad() follows it where the caller starts a new step), between
  // the sync's two calls when the stage has one. false: the replicas saw no sample, and none
  // updated.
  bool step() { return step(step_samples_); }
  // The same with the samples counted by the caller (joined batches that ran rows again).
  bool step(uint64_t samples);
  // Replicas of this stage keep in step through `sync` (not owned; null: none). The
  // asynchronous schedule's stash is refused: its updates would count another step's samples.
  void set_update_sync(UpdateSync* sync) { sync_ = sync; }
  UpdateSync* update_sync() const { return sync_; }
  // The samples the training forwards saw since the last update.
  uint64_t step_samples() const { return step_samples_; }
  void zero_grad();
  // Back to a step's start after an abandoned one: the current weights, no weight gradient
  // pending or accumulated.
  void reset();
  // The other layer-shard members are told of every call first (not owned; null: none).
  void set_mirror(StageMirror* mirror) { mirror_ = mirror; }

  // The loss of `outputs` (this stage's output, or some of its rows) against `labels`, its
  // gradient scaled by `grad_scale` written to `grad` (shaped like `outputs`) when not null.
  double loss(const Tensor& outputs, const int32_t* labels, float grad_scale, Tensor* grad) const;
  int64_t correct(const Tensor& outputs, const int32_t* labels) const;

  // Forward -> loss -> backward of one micro-batch, for the stage that holds the loss. The
  // loss's gradient is scaled by `grad_scale` (1 / the step's samples: the batch mean). When
  // the loss is not finite no backward runs (a party refuses such a micro-batch before any
  // gradient moves) and input_grad stays empty.
  struct LossPass {
    double loss = 0;
    int64_t correct = 0;
    bool finite = true;
    Tensor input_grad;  // when asked for; valid until the stage's next backward
  };
  LossPass train_loss(std::span<const Tensor> inputs, int slot, const int32_t* labels, float grad_scale,
                      bool want_input_grad, bool defer_weights = false);
  // The forward and the loss of train_loss, the gradient at the output left in
  // output_grad(slot): for a party that backs up from it its own way (label noise).
  LossPass forward_loss(std::span<const Tensor> inputs, int slot, const int32_t* labels, float grad_scale);
  Tensor& output_grad(int slot);

  // Weight stashing (the asynchronous schedule): stash_weights() keeps a copy of the
  // trainable parameters' values (the weights this step's forwards used); use_stash(true)
  // swaps them in, so a backward a step later runs on the weights its forward saw, and
  // use_stash(false) puts the current ones back. The update always runs on the current ones.
  void stash_weights();
  void use_stash(bool stashed);
  bool stashed() const { return stashed_; }

  // Seconds spent in forward, backward and step since construction.
  double busy_s() const { return busy_s_; }

 private:
  Network& net_;
  Optimizer* optimizer_;
  std::vector<Tensor> output_grads_;  // per slot: the loss's gradient at the output
  std::vector<Tensor> stash_;         // the other weights (trainable parameters' values)
  bool stashed_ = false;              // whether the parameters hold them now
  UpdateSync* sync_ = nullptr;
  StageMirror* mirror_ = nullptr;
  uint64_t step_samples_ = 0;
  double busy_s_ = 0;
};

}  // namespace tandem
