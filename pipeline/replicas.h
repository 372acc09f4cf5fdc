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
#pragma once

#include <cstdint>
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

  void before_update(uint64_t samples) override;
  void after_update() override;

  // The samples all replicas' last synchronous step saw together.
  uint64_t last_step_samples() const { return last_samples_; }
  // Over a membership: the members whose all-sum gave the last update (the epoch's then).
  const std::vector<std::string>& last_step_members() const { return last_members_; }
  uint64_t averages() const { return averages_; }  // all-sums so far (a step each, or one every H)
  Group& group() { return membership_ ? membership_->group() : *group_; }

 private:
  // The values an all-sum averages: trainable parameters' gradients (or, for local SGD, their
  // values) then the layers' buffers.
  std::vector<Tensor*> averaged(bool gradients);
  void all_mean(const std::vector<Tensor*>& tensors, float weight);
  // Runs a collective; over a membership, again in the next epoch when a member is lost.
  template <typename F>
  void surviving(F&& collective);

  Stage& stage_;
  Group* group_ = nullptr;
  Membership* membership_ = nullptr;
  bool joining_ = false;  // the last all-sum agreed to let a replica in
  ReplicaOptions options_;
  std::vector<float> buffer_;  // one all-sum's payload, kept between steps
  std::vector<std::string> last_members_;
  uint64_t averages_ = 0, last_samples_ = 0;
};

}  // namespace tandem
