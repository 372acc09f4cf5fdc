// Replicas of a stage (data parallel): R processes serve the same stage, each on its own
// first parties' micro-batches, and keep one set of weights through a Group
// (collective/group.h; Gloo over TCP between machines). Two ways, chosen per replica set:
//
// - synchronous: before every update the replicas' weight gradients are all-summed, each
//   weighted by the samples its replica's step saw, so every replica applies the update one
//   stage would have applied to all their samples as one batch (torch's DistributedDataParallel,
//   with the mean over samples rather than over ranks, so replicas may see unequal batches).
//   The optimizer's state stays local and stays identical, as every replica applies the same
//   update from the same state. One all-sum a step: the gradients, the layers' buffers (batch
//   norm's running statistics, averaged the same way) and the sample count in one buffer.
// - local SGD (DiLoCo's inner loop, for replicas far apart): each replica updates on its own,
//   and every `average_every` updates the weights and buffers become the replicas' mean.
//   Optimizer state stays local.
//
// A replica that joins takes the weights, buffers, optimizer state and step count of a
// member already serving (copy_from) before it serves.
//
// Over a Membership (collective/membership.h) the set changes while it trains: a collective
// that a lost member breaks is done again by the survivors in the next epoch (the step's
// update then averages their samples only), and a replica asking to join is let in after an
// update that every member agreed on within its all-sum (rank 0 raises a flag in it), then
// copies rank 0's state.
//
// A replica with nothing to hand in (a cloud replica whose edges are all gone, or one that
// joined and has none yet) still takes part in every collective: idle() learns from the
// others' headers which collective is next and hands in zeros, so the set neither waits for
// it nor drops it, and its state stays the set's.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "collective/group.h"
#include "collective/membership.h"
#include "pipeline/stage.h"

namespace tandem {

enum class ReplicaMode { Synchronous, LocalSgd };

struct ReplicaOptions {
  ReplicaMode mode = ReplicaMode::Synchronous;
  uint32_t average_every = 1;  // local SGD: the updates between two averages (at least 1)
  // Synchronous: the gradients summed over the replicas rather than averaged by samples; the
  // caller scales the update by before_update's total (a federation's shared shard, whose
  // update is the mean of its window's steps: every replica's steps are one window).
  bool sum = false;
  // A replica left out of an epoch (silent past the others' timeout): true, it joins the set
  // again by itself and takes rank 0's state; false, LeftOut reaches the caller (a program
  // whose own clients' steps must stay in step with the set's ends, and starts afresh).
  bool heal = true;
  std::function<void(const std::string& why)> on_left_out;  // without heal: called before LeftOut is thrown
};

// "sync" or "local-sgd"; an Error naming both otherwise.
ReplicaMode replica_mode(const std::string& name);

class ReplicaSync final : public UpdateSync {
 public:
  // Attaches itself to `stage` (Stage::set_update_sync) until destroyed. Neither is owned.
  ReplicaSync(Stage& stage, Group& group, const ReplicaOptions& options);
  // Keeps in step with whoever the membership's current epoch lists.
  ReplicaSync(Stage& stage, Membership& membership, const ReplicaOptions& options);
  ~ReplicaSync() override;
  ReplicaSync(const ReplicaSync&) = delete;
  ReplicaSync& operator=(const ReplicaSync&) = delete;

  // Every member's weights, buffers, optimizer state and update count become member `root`'s
  // (every member calls it; a replica that joins a running set, or replicas starting from
  // different files).
  void copy_from(int root);

  uint64_t before_update(uint64_t samples, double* lr_sum) override;
  void after_update() override;

  // A replica with nothing to hand in takes part in the set's next collective, whichever it is
  // (the others' headers say), with zeros: an update's gradients (then `update` applies the
  // set's summed gradients in the stage, `steps` of them at `lr_sum`, 0: none; after_update
  // follows), a local-SGD average (the weights become the mean), or a round (`round` gets the
  // set's sums of that many values and its index). Nothing when every member is idle (a
  // joiner waiting is then let in). An out-of-step set is the same Error as elsewhere.
  // Rounds: `round_pending` says this replica holds fronts for the next round (its edges'
  // final ones), `round_values` gives its part of a round's all-sum and `next_round` the
  // round's index. When every member is idle and one holds fronts, all make that round now.
  struct IdleCalls {
    std::function<void(uint64_t steps, double lr_sum)> update;
    std::function<void(std::span<const float> sums, uint64_t index)> round;
    std::function<bool()> round_pending;
    std::function<std::vector<float>()> round_values;
    std::function<uint64_t()> next_round;
  };
  enum class Idled { Nothing, Update, Average, Round };
  Idled idle(const IdleCalls& calls);
  // The replica is stopping: a collective a lost member breaks now throws GroupLost rather
  // than re-forming the set (callable from any thread).
  void stop() { stopping_ = true; }

  // Another collective the replicas make in step (a federation's round: the fronts' weighted
  // sum): `values` all-summed, over a membership again in the next epoch when a member is
  // lost. `index` numbers it among its kind (every member passes the same: the round); a
  // member at another index or with another count of values is an Error on every member.
  // false: this replica had been left out of the set and joined it again (its state, and
  // also_copy's, are rank 0's now), and `values` are not summed.
  bool all_sum(std::span<float> values, uint64_t index);
  // State besides the stage's that a joiner takes with copy_from (a federation's round and
  // average): `get` flattens it, `set` takes rank 0's back.
  void also_copy(std::function<std::vector<float>()> get, std::function<void(std::span<const float>)> set) {
    get_extra_ = std::move(get);
    set_extra_ = std::move(set);
  }

  // The samples all replicas' last synchronous step saw together.
  uint64_t last_step_samples() const { return last_samples_; }
  // Over a membership: the members whose all-sum gave the last update (the epoch's then).
  const std::vector<std::string>& last_step_members() const { return last_members_; }
  uint64_t averages() const { return averages_; }  // all-sums so far (a step each, or one every H)
  // Every collective this replica made, over every epoch's group (read from any thread: a
  // metrics scrape): count, payload bytes, seconds inside them.
  struct Totals {
    uint64_t collectives = 0, bytes = 0;
    double seconds = 0;
    uint64_t idle_polls = 0;  // header exchanges in which every member was idle (not counted above)
    uint64_t epoch = 0, members = 0;  // over a membership: its epoch and size now
    int rank = 0;
    Membership::Stats membership;  // reforms, members dropped and joined
  };
  Totals totals() const;
  Group& group() { return membership_ ? membership_->group() : *group_; }

 private:
  // The values an all-sum averages: trainable parameters' gradients (or, for local SGD, their
  // values) then the layers' buffers.
  std::vector<Tensor*> averaged(bool gradients);
  // The first `summed` tensors summed, the rest averaged by `weight`; `lr` summed beside them
  // (buffer_'s layout: the tensors, lr, weight, join flag). false: this replica was left out,
  // joined the set again and holds rank 0's state (nothing was summed).
  bool all_mean(const std::vector<Tensor*>& tensors, float weight, std::size_t summed, float lr = 0.0f);
  // buffer_'s sums into `tensors` (the first `summed` as they are, the rest over the weights'
  // total, unless it is 0); sets joining_.
  void take_mean(const std::vector<Tensor*>& tensors, std::size_t summed);
  void admit_joiners();  // after a collective that agreed to let a replica in: the next epoch, and its copy
  // Runs a collective; over a membership, again in the next epoch when a member is lost.
  // false: this replica was left out of that epoch, joined the set again and copied rank 0's
  // state; the collective was not made.
  template <typename F>
  bool surviving(F&& collective);
  // What each collective is, checked on every member before its payload (in one all-sum, each
  // member's header in its own place): a member at another update, round or size would
  // otherwise pair its payload with another's.
  // (Idle: a member with nothing to hand in, which learns what the others make.)
  enum class Kind { Idle = 0, Gradients = 1, Weights = 2, Copy = 3, Extra = 4 };
  struct Header {
    Kind kind = Kind::Idle;  // Idle: every member was
    uint64_t floats = 0, index = 0;
    bool joiners = false;  // rank 0 saw a replica waiting to join
    bool pending = false;  // an idle member holds fronts for the next round
  };
  // The collective the active members make (each checked against the others). `pending`: an
  // idle member's flag.
  Header in_step(Group& g, Kind kind, std::size_t floats, uint64_t index, bool pending = false);

  Stage& stage_;
  Group* group_ = nullptr;
  Membership* membership_ = nullptr;
  bool joining_ = false;  // the last all-sum agreed to let a replica in
  ReplicaOptions options_;
  // One collective at a time, whichever thread makes it (a federation's round and an update
  // come from different sessions' threads): they share the group and these buffers.
  std::recursive_mutex collective_mu_;
  std::atomic<bool> stopping_{false};
  uint64_t updates_ = 0;  // after_update calls (local SGD averages on it; copied to joiners)
  std::vector<float> buffer_;  // one all-sum's payload, kept between steps
  std::vector<float> headers_;
  std::function<std::vector<float>()> get_extra_;
  std::function<void(std::span<const float>)> set_extra_;
  std::vector<std::string> last_members_;
  Group::Stats last_;  // the last collective surviving() counted (idle() moves an empty poll's to idle_polls)
  uint64_t averages_ = 0, last_samples_ = 0;
  mutable std::mutex totals_mu_;
  Totals totals_;
};

}  // namespace tandem
