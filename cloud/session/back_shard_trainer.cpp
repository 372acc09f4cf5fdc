#include "cloud/session/back_shard_trainer.h"

#include <algorithm>
#include <cstdio>

namespace tandem {

BackShardTrainer::BackShardTrainer(Network& net, Optimizer& optimizer, double timeout_s, uint32_t accumulate)
    : net_(net), optimizer_(optimizer), turns_(std::make_unique<BackShardTurns>(timeout_s)),
      accumulate_(std::max<uint32_t>(1, accumulate)) {}

BackShardTrainer::BackShardTrainer(Network& net, Optimizer& optimizer, double timeout_s, uint32_t accumulate,
                                   Batched batched)
    : net_(net), optimizer_(optimizer),
      batches_(std::make_unique<BackShardBatches>(net, optimizer, accumulate, batched.gather_s, timeout_s, batched.quorum)),
      accumulate_(std::max<uint32_t>(1, accumulate)) {}

bool BackShardTrainer::begin_step(uint64_t owner, const std::atomic<bool>& cancelled, uint32_t microbatches) {
  if (batches_) return batches_->begin_step(owner, microbatches, cancelled);
  if (turns_ && !turns_->acquire(owner, cancelled)) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  // A step abandoned mid-way (its session closed or was evicted) may have left weight
  // gradients deferred; they are never applied.
  net_.drop_deferred_weights();
  if (accumulated_ == 0) net_.zero_grad();  // else this step's gradients add to the summed steps'
  if (open_owner_ != 0 && open_owner_ != owner) {  // its holder was evicted mid-step
    lost_owner_ = open_owner_;
    abandoned_ = abandoned_ || accumulated_ > 0;
  }
  open_owner_ = owner;
  return true;
}

bool BackShardTrainer::begin_eval(uint64_t owner, const std::atomic<bool>& cancelled) {
  if (batches_) return batches_->begin_eval(owner, cancelled);
  return !turns_ || turns_->acquire(owner, cancelled);
}

void BackShardTrainer::end_eval(uint64_t owner) {
  if (batches_) return batches_->end_eval(owner);
  release(owner);
}

// (Batched: a session computes on the shard only in an evaluation, which holds it already.)
bool BackShardTrainer::begin_compute(uint64_t owner) { return !turns_ || turns_->begin_compute(owner); }

void BackShardTrainer::end_compute() {
  if (turns_) turns_->end_compute();
}

bool BackShardTrainer::finish_step(uint64_t owner, float lr_scale, const std::function<void()>& between_updates) {
  if (batches_) return batches_->finish_step(owner, lr_scale, between_updates);
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_owner_ != owner) {  // no open step of this owner's: nothing to apply, ever twice
    if (lost_owner_ != owner) return true;
    lost_owner_ = 0;
    return false;  // another took the shard over while this owner's step was open
  }
  open_owner_ = 0;
  if (turns_ && !turns_->begin_compute(owner)) return false;  // it went quiet and lost the turn: the step is lost
  if (++accumulated_ >= accumulate_) {
    // A step abandoned mid-way among the summed ones (its micro-batch refused) may have left
    // non-finite gradients in the layers that add theirs during backward: the shard must not
    // take them (checked only then; the sum is dropped).
    if (abandoned_ && !net_.gradients_finite()) {
      std::fprintf(stderr, "tandem-cloud: the shared back shard's summed gradients are not finite (an abandoned "
                           "step's); this update is skipped\n");
    } else {
      // The update averages the summed steps' gradients (each is its batch's mean).
      optimizer_.set_lr_scale(lr_scale / static_cast<float>(accumulate_));
      optimizer_.step();
      ++updates_;
      if (between_updates) between_updates();
    }
    accumulated_ = 0;
    abandoned_ = false;
  }
  if (turns_) {
    turns_->end_compute();
    turns_->release(owner);
  }
  return true;
}

bool BackShardTrainer::step_open(uint64_t owner) const {
  if (batches_) return batches_->step_open(owner);
  std::lock_guard<std::mutex> lock(mutex_);
  return open_owner_ == owner;
}

void BackShardTrainer::release(uint64_t owner) {
  if (batches_) return batches_->release(owner);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_owner_ == owner) {
      open_owner_ = 0;
      abandoned_ = accumulated_ > 0 || abandoned_;  // (summing steps: what it left stays in the sum)
    }
  }
  if (turns_) turns_->release(owner);
}

uint64_t BackShardTrainer::updates() const {
  if (batches_) return batches_->updates();
  std::lock_guard<std::mutex> lock(mutex_);
  return updates_;
}

}  // namespace tandem
