// The back shard, its optimizer and the one place its update happens. A session's step holds
// the shard from its first micro-batch to the update, which is applied exactly once per step
// behind the shard's lock, on every path: a shard of one edge's own, or one shard every edge
// of a federation trains, its steps' gradients summed `accumulate` at a time before one
// update: in turns (BackShardTurns), or those steps together with their micro-batches joined
// into one batch (BackShardBatches). Sessions speak the protocol; this owns the weights.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "core/network.h"
#include "core/optimizer.h"
#include "cloud/session/back_shard_batches.h"
#include "cloud/session/back_shard_turns.h"

namespace tandem {

class BackShardTrainer {
 public:
  // One edge's own shard.
  BackShardTrainer(Network& net, Optimizer& optimizer) : net_(net), optimizer_(optimizer) {}
  // One shard for every edge, in turns; a holder quiet mid-step for `timeout_s` loses its turn.
  BackShardTrainer(Network& net, Optimizer& optimizer, double timeout_s, uint32_t accumulate);
  // One shard for every edge, the `accumulate` steps of an update together, micro-batches
  // handed in within `gather_s` of each other as one batch (run_batched).
  struct Batched {
    double gather_s = 0.005;
    // The first update waits (up to timeout_s) until this many sessions have begun a step,
    // as a federation's first round waits for its --min-edges: its window is then one step
    // of each, not several of the first to arrive.
    uint32_t quorum = 1;
  };
  BackShardTrainer(Network& net, Optimizer& optimizer, double timeout_s, uint32_t accumulate, Batched batched);

  Network& net() { return net_; }
  const Network& net() const { return net_; }
  Optimizer& optimizer() { return optimizer_; }
  bool shared() const { return turns_ != nullptr || batches_ != nullptr; }
  // Micro-batches train through run_batched (never the session's own forward and backward).
  bool batched() const { return batches_ != nullptr; }

  // `owner`'s step starts: waits for the turn on a shared shard, and zeroes the gradients
  // unless they are summing across steps. false: `cancelled` turned true while waiting.
  // `microbatches`: the step's (a batched shard waits for no more of them).
  bool begin_step(uint64_t owner, const std::atomic<bool>& cancelled, uint32_t microbatches = 1);
  // Batched: one micro-batch of `owner`'s open step, trained within a batch (BackShardBatches::run).
  bool run_batched(uint64_t owner, BatchedMicrobatch& mb, const std::atomic<bool>& cancelled) {
    return batches_->run(owner, mb, cancelled);
  }
  // A batched shard's stage, where its replicas keep in step (null otherwise).
  Stage* batched_stage() { return batches_ ? &batches_->stage() : nullptr; }
  BackShardBatches* batches() { return batches_.get(); }
  BackShardBatches::Stats batch_stats() const { return batches_ ? batches_->stats() : BackShardBatches::Stats{}; }
  // An evaluation batch between steps: the turn for it alone (released by end_eval).
  bool begin_eval(uint64_t owner, const std::atomic<bool>& cancelled);
  void end_eval(uint64_t owner);
  // Brackets `owner`'s work on the shard; false when it lost the turn by going quiet.
  bool begin_compute(uint64_t owner);
  void end_compute();

  // The open step of `owner` is complete: the update, once, with the step's learning-rate
  // factor (divided by the steps summed). `between_updates` runs after an update, still
  // holding the shard (a federation's round checkpoint). Then the turn is released. A call
  // without an open step does nothing; false when the owner lost the turn (nothing applied).
  bool finish_step(uint64_t owner, float lr_scale, const std::function<void()>& between_updates = nullptr);
  bool step_open(uint64_t owner) const;
  // Gives the turn up (a closed session); an open step of its is abandoned.
  void release(uint64_t owner);
  // True once for an owner that lost the turn by going quiet.
  bool was_evicted(uint64_t owner) {
    return turns_ ? turns_->was_evicted(owner) : batches_ && batches_->was_evicted(owner);
  }
  // Optimizer steps applied so far.
  uint64_t updates() const;

 private:
  Network& net_;
  Optimizer& optimizer_;
  std::unique_ptr<BackShardTurns> turns_;      // shared shards in turns
  std::unique_ptr<BackShardBatches> batches_;  // shared shards in batches
  uint32_t accumulate_ = 1, accumulated_ = 0;
  mutable std::mutex mutex_;  // the update, the summing count and the open steps
  uint64_t open_owner_ = 0;   // the owner whose step is open (0: none)
  uint64_t lost_owner_ = 0;   // the last owner whose open step was taken over
  bool abandoned_ = false;    // a step abandoned mid-way left gradients in the open sum
  uint64_t updates_ = 0;
};

}  // namespace tandem
