#include "pipeline/replicas.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

ReplicaMode replica_mode(const std::string& name) {
  if (name == "sync") return ReplicaMode::Synchronous;
  if (name == "local-sgd") return ReplicaMode::LocalSgd;
  fail("replicas", cat("'", name, "' is no way to keep replicas in step: choose sync (gradients all-summed every step) "
                       "or local-sgd (weights averaged every average-every updates)"));
}

ReplicaSync::ReplicaSync(Stage& stage, Membership& membership, const ReplicaOptions& options)
    : ReplicaSync(stage, membership.group(), options) {
  group_ = nullptr;
  membership_ = &membership;
}

ReplicaSync::ReplicaSync(Stage& stage, Group& group, const ReplicaOptions& options)
    : stage_(stage), group_(&group), options_(options) {
  if (options_.average_every < 1) fail("replicas", "average-every must be at least 1 update");
  if (!stage_.optimizer()) fail("replicas", cat(stage_.graph().name(), " has no optimizer: nothing to keep in step"));
  stage_.set_update_sync(this);
}

ReplicaSync::~ReplicaSync() { stage_.set_update_sync(nullptr); }

std::vector<Tensor*> ReplicaSync::averaged(bool gradients) {
  std::vector<Tensor*> out;
  for (Param* p : stage_.network().params()) out.push_back(gradients ? &p->grad() : &p->value());
  for (auto& [name, t] : stage_.network().buffers()) out.push_back(t);
  return out;
}

namespace {
std::size_t floats_in(const std::vector<Tensor*>& tensors) {
  std::size_t n = 0;
  for (const Tensor* t : tensors) n += static_cast<std::size_t>(t->numel());
  return n;
}
}  // namespace

template <typename F>
void ReplicaSync::surviving(F&& collective) {
  for (;;) {
    try {
      collective(group());
      return;
    } catch (const GroupLost&) {
      if (!membership_) throw;
      membership_->reform(true);  // throws when this replica is left out
    }
  }
}

// Each member's tensors times `weight`, the weight and rank 0's join flag after them,
// all-summed; then divided by the weights' sum. Where that sum is zero (no member saw a
// sample) the tensors keep their own values: a weighted sum of zero weights is no average.
void ReplicaSync::all_mean(const std::vector<Tensor*>& tensors, float weight) {
  const std::size_t n = floats_in(tensors) + 2;
  buffer_.resize(n);
  surviving([&](Group& g) {
    float* at = buffer_.data();
    for (const Tensor* t : tensors) {
      const float* v = t->data();
      for (int64_t i = 0; i < t->numel(); ++i) at[i] = v[i] * weight;
      at += t->numel();
    }
    at[0] = weight;
    at[1] = membership_ && g.rank() == 0 && membership_->joiners() ? 1.0f : 0.0f;
    g.all_sum(buffer_);
    if (membership_) last_members_ = membership_->members();
  });
  joining_ = buffer_.back() > 0.0f;
  const float total = buffer_[n - 2];
  ++averages_;
  if (!(total > 0)) return;
  const float scale = 1.0f / total;
  const float* at = buffer_.data();
  for (Tensor* t : tensors) {
    float* v = t->data();
    for (int64_t i = 0; i < t->numel(); ++i) v[i] = at[i] * scale;
    at += t->numel();
  }
}

void ReplicaSync::before_update(uint64_t samples) {
  if (options_.mode != ReplicaMode::Synchronous) return;
  all_mean(averaged(true), static_cast<float>(samples));
  last_samples_ = static_cast<uint64_t>(buffer_[buffer_.size() - 2]);  // the weights' sum: every replica's samples
}

void ReplicaSync::after_update() {
  // The optimizer's update count, which a replica that joins takes too: every member averages
  // at the same updates.
  const auto updates = static_cast<uint64_t>(stage_.optimizer()->steps());
  if (options_.mode == ReplicaMode::LocalSgd && updates % options_.average_every == 0) {
    all_mean(averaged(false), 1.0f);
    for (Param* p : stage_.network().params()) p->bump_version();
  }
  if (joining_) {  // every member agreed on it in the same all-sum: all move on together
    joining_ = false;
    membership_->reform(false);
    copy_from(0);
  }
}

void ReplicaSync::copy_from(int root) {
  std::vector<Tensor*> tensors = averaged(false);
  for (Tensor* t : stage_.optimizer()->state()) tensors.push_back(t);
  buffer_.resize(floats_in(tensors) + 1);
  // The update count, exactly: a float holds integers below 2^24, and runs are shorter.
  const int64_t steps = stage_.optimizer()->steps();
  if (steps >= (int64_t{1} << 24)) fail("replicas", cat("an update count of ", steps, " does not fit the broadcast"));
  surviving([&](Group& g) {
    float* at = buffer_.data();
    for (const Tensor* t : tensors) {
      std::copy_n(t->data(), t->numel(), at);
      at += t->numel();
    }
    *at = static_cast<float>(steps);
    g.broadcast(buffer_, std::min(root, g.size() - 1));
  });
  float* at = buffer_.data();
  for (Tensor* t : tensors) {
    std::copy_n(at, t->numel(), t->data());
    at += t->numel();
  }
  stage_.optimizer()->set_steps(static_cast<int64_t>(*at));
  for (Param* p : stage_.network().params()) p->bump_version();
}

}  // namespace tandem
