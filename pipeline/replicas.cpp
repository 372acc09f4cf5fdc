#include "pipeline/replicas.h"

#include <algorithm>
#include <cstdio>
#include <mutex>

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
  totals_.epoch = membership.epoch();
}

ReplicaSync::ReplicaSync(Stage& stage, Group& group, const ReplicaOptions& options)
    : stage_(stage), group_(&group), options_(options) {
  if (options_.average_every < 1) fail("replicas", "average-every must be at least 1 update");
  if (!stage_.optimizer()) fail("replicas", cat(stage_.graph().name(), " has no optimizer: nothing to keep in step"));
  stage_.set_update_sync(this);
  totals_.members = static_cast<uint64_t>(group.size());
  totals_.rank = group.rank();
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
bool ReplicaSync::surviving(F&& collective) {
  std::lock_guard serial(collective_mu_);
  for (;;) {
    try {
      Group& g = group();
      const Group::Stats before = g.stats();
      collective(g);
      const Group::Stats& after = g.stats();
      std::lock_guard lock(totals_mu_);
      last_ = {after.collectives - before.collectives, after.bytes - before.bytes, after.seconds - before.seconds};
      totals_.collectives += last_.collectives;
      totals_.bytes += last_.bytes;
      totals_.seconds += last_.seconds;
      totals_.epoch = membership_ ? membership_->epoch() : 0;
      totals_.members = static_cast<uint64_t>(g.size());
      totals_.rank = g.rank();
      if (membership_) totals_.membership = membership_->stats();
      return true;
    } catch (const GroupLost&) {
      if (!membership_ || stopping_) throw;
    }
    // The next epoch, of the members alive; again while its group does not meet.
    try {
      membership_->reform(true);
    } catch (const GroupLost& e) {
      std::fprintf(stderr, "%s: re-forming again\n", e.what());
    } catch (const LeftOut& e) {
      if (!options_.heal) {
        if (options_.on_left_out) options_.on_left_out(e.what());
        throw;
      }
      // The others went on without this replica: it joins again and takes rank 0's state;
      // what it was to hand in is dropped. (The epoch that lets it in may fail to meet: ask again.)
      std::fprintf(stderr, "%s\n", e.what());
      for (;;) {
        try {
          membership_->rejoin();
          break;
        } catch (const GroupLost& again) {
          std::fprintf(stderr, "%s: asking again\n", again.what());
        }
      }
      copy_from(0);
      return false;
    }
  }
}

ReplicaSync::Totals ReplicaSync::totals() const {
  std::lock_guard lock(totals_mu_);
  return totals_;
}

// Each member's tensors times `weight`, then `lr`, the weight and rank 0's join flag,
// all-summed; then divided by the weights' sum. Where that sum is zero (no member saw a
// sample) the tensors keep their own values: a weighted sum of zero weights is no average.
bool ReplicaSync::all_mean(const std::vector<Tensor*>& tensors, float weight, std::size_t summed, float lr) {
  const std::size_t n = floats_in(tensors) + 3;
  buffer_.resize(n);
  const bool gradients = options_.mode == ReplicaMode::Synchronous;
  const bool summed_here = surviving([&](Group& g) {
    in_step(g, gradients ? Kind::Gradients : Kind::Weights, n,
            gradients ? static_cast<uint64_t>(stage_.optimizer()->steps()) : updates_);
    float* at = buffer_.data();
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const float* v = tensors[k]->data();
      const float times = k < summed ? 1.0f : weight;  // the summed ones as they are
      for (int64_t i = 0; i < tensors[k]->numel(); ++i) at[i] = v[i] * times;
      at += tensors[k]->numel();
    }
    at[0] = lr;
    at[1] = weight;
    at[2] = membership_ && g.rank() == 0 && membership_->joiners() ? 1.0f : 0.0f;
    g.all_sum(buffer_);
    if (membership_) last_members_ = membership_->members();
  });
  if (!summed_here) {  // this replica joined the set again: its state is rank 0's now
    joining_ = false;
    return false;
  }
  take_mean(tensors, summed);
  return true;
}

void ReplicaSync::take_mean(const std::vector<Tensor*>& tensors, std::size_t summed) {
  const std::size_t n = buffer_.size();
  joining_ = buffer_[n - 1] > 0.0f;
  const float total = buffer_[n - 2];
  ++averages_;
  if (!(total > 0)) return;
  const float* at = buffer_.data();
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const float scale = k < summed ? 1.0f : 1.0f / total;
    float* v = tensors[k]->data();
    for (int64_t i = 0; i < tensors[k]->numel(); ++i) v[i] = at[i] * scale;
    at += tensors[k]->numel();
  }
}

uint64_t ReplicaSync::before_update(uint64_t samples, double* lr_sum) {
  if (options_.mode != ReplicaMode::Synchronous) return samples;
  // Summed: the parameters' gradients (the buffers, batch norm's statistics, still averaged).
  // (not summed: this replica joined the set again and took rank 0's state; it skips the update)
  const bool summed_here = all_mean(averaged(true), static_cast<float>(samples),
                                    options_.sum ? stage_.network().params().size() : 0,
                                    lr_sum ? static_cast<float>(*lr_sum) : 0.0f);
  last_samples_ = summed_here ? static_cast<uint64_t>(buffer_[buffer_.size() - 2]) : 0;  // every replica's samples
  if (lr_sum) *lr_sum = summed_here ? buffer_[buffer_.size() - 3] : 0.0;
  return last_samples_;
}

namespace {
const char* kind_name(int kind) {
  switch (kind) {
    case 1: return "the gradients of update";
    case 2: return "the weights' average after update";
    case 3: return "a joiner's copy at update";
    case 4: return "round";
    default: return "an unknown collective";
  }
}
}  // namespace

ReplicaSync::Header ReplicaSync::in_step(Group& g, Kind kind, std::size_t floats, uint64_t index, bool pending) {
  constexpr std::size_t kw = 4;  // a member's header: kind and count (high part), count (low part), index, flags
  const auto size = static_cast<std::size_t>(g.size()), rank = static_cast<std::size_t>(g.rank());
  headers_.assign(kw * size, 0.0f);
  // Floats hold integers exactly below 2^24: the index and the count, split in two where larger.
  // An idle member's slot stays zero but for its flags (kinds start at 1: 4096 and more).
  if (kind != Kind::Idle) {
    headers_[kw * rank] = static_cast<float>(static_cast<int>(kind) * 4096 + (floats >> 24));
    headers_[kw * rank + 1] = static_cast<float>(floats & 0xFFFFFF);
    headers_[kw * rank + 2] = static_cast<float>(index & 0xFFFFFF);
  }
  // Flags, in the member's own place: 1, rank 0 saw a joiner; 2, this idle member holds a round's fronts.
  if (kind == Kind::Idle)
    headers_[kw * rank + 3] = (rank == 0 && membership_ && membership_->joiners() ? 1.0f : 0.0f) + (pending ? 2.0f : 0.0f);
  g.all_sum(headers_);
  const auto active = [&](std::size_t m) { return headers_[kw * m] > 0.0f; };
  const auto same = [&](std::size_t a, std::size_t b) {
    return headers_[kw * a] == headers_[kw * b] && headers_[kw * a + 1] == headers_[kw * b + 1] &&
           headers_[kw * a + 2] == headers_[kw * b + 2];
  };
  // The reference: this member's header, or an idle member's first active one's.
  std::size_t ref = rank;
  if (kind == Kind::Idle)
    for (std::size_t m = 0; m < size && ref == rank; ++m)
      if (active(m)) ref = m;
  Header out;
  out.joiners = static_cast<int>(headers_[3]) % 2 == 1;
  for (std::size_t m = 0; m < size; ++m) out.pending = out.pending || static_cast<int>(headers_[kw * m + 3]) >= 2;
  if (!active(ref)) return out;  // every member idle
  for (std::size_t m = 0; m < size; ++m) {
    if (!active(m) || same(m, ref)) continue;
    const auto what = [&](std::size_t r) {
      const auto k = static_cast<uint64_t>(headers_[kw * r]);
      const uint64_t count = ((k % 4096) << 24) + static_cast<uint64_t>(headers_[kw * r + 1]);
      return cat("replica ", r, membership_ && r < membership_->members().size() ? cat(" (", membership_->members()[r], ")") : std::string(),
                 " is at ", kind_name(static_cast<int>(k / 4096)), " ", static_cast<uint64_t>(headers_[kw * r + 2]), " with ",
                 count, " values");
    };
    fail("replicas", cat("the replica set is out of step: ", what(m), ", ", what(ref),
                         ": every replica must make the same collectives in the same order (the same updates and "
                         "rounds; give each the same options)"));
  }
  const auto k = static_cast<uint64_t>(headers_[kw * ref]);
  out.kind = static_cast<Kind>(k / 4096);
  out.floats = ((k % 4096) << 24) + static_cast<uint64_t>(headers_[kw * ref + 1]);
  out.index = static_cast<uint64_t>(headers_[kw * ref + 2]);
  return out;
}

ReplicaSync::Idled ReplicaSync::idle(const IdleCalls& calls) {
  std::lock_guard serial(collective_mu_);
  const bool gradients = options_.mode == ReplicaMode::Synchronous;
  const std::vector<Tensor*> tensors = averaged(gradients);
  const std::size_t n = floats_in(tensors) + 3;
  std::vector<float> extra;
  Header seen;
  uint64_t round = 0;
  // (no window is open: the driver calls this only then) what it hands in is zeros
  if (gradients) stage_.zero_grad();
  const bool pending = calls.round_pending && calls.round_pending();
  const auto round_part = [&](std::size_t floats) {
    extra = calls.round_values ? calls.round_values() : std::vector<float>(floats, 0.0f);
    if (extra.size() != floats)
      fail("replicas", cat("the replica set is out of step: its round sums ", floats, " values, where this replica's "
                           "are ", extra.size(), " (every replica must serve the same model)"));
  };
  const bool here = surviving([&](Group& g) {
    seen = in_step(g, Kind::Idle, 0, 0, pending);
    switch (seen.kind) {
      case Kind::Idle:
        // Nobody trains; some hold their edges' last fronts: the round, all together, now.
        if (!seen.pending || !calls.next_round) return;
        round = calls.next_round();
        extra = calls.round_values ? calls.round_values() : std::vector<float>{};
        in_step(g, Kind::Extra, extra.size(), round);
        g.all_sum(extra);
        seen.kind = Kind::Extra;
        return;
      case Kind::Gradients:
      case Kind::Weights:
        if (seen.kind != (gradients ? Kind::Gradients : Kind::Weights) || seen.floats != n ||
            seen.index != ((gradients ? static_cast<uint64_t>(stage_.optimizer()->steps()) : updates_) & 0xFFFFFF))
          fail("replicas", cat("the replica set is out of step: the others make ", kind_name(static_cast<int>(seen.kind)),
                               " ", seen.index, " with ", seen.floats, " values, where this idle replica is at ",
                               gradients ? static_cast<uint64_t>(stage_.optimizer()->steps()) : updates_, " with ", n,
                               " (every replica must run the same model and --replica-mode)"));
        buffer_.assign(n, 0.0f);
        buffer_[n - 1] = membership_ && g.rank() == 0 && membership_->joiners() ? 1.0f : 0.0f;
        g.all_sum(buffer_);
        if (membership_) last_members_ = membership_->members();
        return;
      case Kind::Extra:
        round = seen.index;
        round_part(seen.floats);  // its edges' last fronts, if any wait, else zeros
        g.all_sum(extra);
        return;
      case Kind::Copy:
        fail("replicas", "the replica set is out of step: the others copy a joiner's state while this replica is "
                         "idle, outside the update that lets it in");
    }
  });
  if (!here) return Idled::Nothing;  // left out, joined again: its state is rank 0's
  switch (seen.kind) {
    case Kind::Gradients: {
      take_mean(tensors, options_.sum ? stage_.network().params().size() : 0);
      last_samples_ = static_cast<uint64_t>(buffer_[n - 2]);
      if (calls.update) calls.update(last_samples_, buffer_[n - 3]);
      after_update();
      return Idled::Update;
    }
    case Kind::Weights:
      take_mean(tensors, 0);
      updates_ = seen.index;  // the members' count at this average
      for (Param* p : stage_.network().params()) p->bump_version();
      if (joining_) admit_joiners();
      return Idled::Average;
    case Kind::Extra:
      if (calls.round) calls.round(extra, round);
      return Idled::Round;
    default: {
      std::lock_guard lock(totals_mu_);  // a poll, not a collective that carried anything
      totals_.collectives -= last_.collectives;
      totals_.bytes -= last_.bytes;
      totals_.seconds -= last_.seconds;
      ++totals_.idle_polls;
    }
      if (seen.joiners) admit_joiners();  // the whole set idle: a joiner waits for no update
      return Idled::Nothing;
  }
}

bool ReplicaSync::all_sum(std::span<float> values, uint64_t index) {
  // (an all-sum a lost member broke may have summed part of them in place: each try starts
  // from this replica's own values)
  const std::vector<float> own(values.begin(), values.end());
  return surviving([&](Group& g) {
    std::copy(own.begin(), own.end(), values.begin());
    in_step(g, Kind::Extra, values.size(), index);
    g.all_sum(values);
  });
}

void ReplicaSync::after_update() {
  // The optimizer's update count, which a replica that joins takes too: every member averages
  // at the same updates.
  // Counted here, not by the optimizer: a replica that skipped its update (no finite gradients)
  // still averages with the others.
  const uint64_t updates = ++updates_;
  if (options_.mode == ReplicaMode::LocalSgd && updates % options_.average_every == 0) {
    all_mean(averaged(false), 1.0f, 0);
    for (Param* p : stage_.network().params()) p->bump_version();
  }
  if (joining_) admit_joiners();
}

void ReplicaSync::admit_joiners() {
  // Every member agreed on it in the same all-sum: all move on together.
  joining_ = false;
  std::lock_guard serial(collective_mu_);
  try {
    membership_->reform(false);
  } catch (const GroupLost& e) {  // its group did not meet: copy_from re-forms with those alive
    std::fprintf(stderr, "%s\n", e.what());
  }
  copy_from(0);
}

void ReplicaSync::copy_from(int root) {
  std::vector<Tensor*> tensors = averaged(false);
  for (Tensor* t : stage_.optimizer()->state()) tensors.push_back(t);
  std::vector<float> extra = get_extra_ ? get_extra_() : std::vector<float>{};
  // The update counts, exactly: a float holds integers below 2^24, and runs are shorter.
  const int64_t steps = stage_.optimizer()->steps();
  if (steps >= (int64_t{1} << 24) || updates_ >= (uint64_t{1} << 24))
    fail("replicas", cat("an update count of ", std::max<uint64_t>(static_cast<uint64_t>(steps), updates_),
                         " does not fit the broadcast"));
  extra.push_back(static_cast<float>(updates_));  // (last: after also_copy's)
  const std::size_t n = floats_in(tensors) + 1 + extra.size();
  const bool copied_here = surviving([&](Group& g) {
    buffer_.resize(n);
    in_step(g, Kind::Copy, buffer_.size(), 0);  // (a joiner's update count is not yet the others')
    float* at = buffer_.data();
    for (const Tensor* t : tensors) {
      std::copy_n(t->data(), t->numel(), at);
      at += t->numel();
    }
    *at = static_cast<float>(steps);
    std::copy(extra.begin(), extra.end(), at + 1);
    g.broadcast(buffer_, std::min(root, g.size() - 1));
  });
  if (!copied_here) return;  // left out meanwhile: the copy made on joining again holds
  float* at = buffer_.data();
  for (Tensor* t : tensors) {
    std::copy_n(at, t->numel(), t->data());
    at += t->numel();
  }
  stage_.optimizer()->set_steps(static_cast<int64_t>(*at));
  updates_ = static_cast<uint64_t>(at[extra.size()]);
  if (set_extra_) set_extra_(std::span<const float>(at + 1, extra.size() - 1));
  for (Param* p : stage_.network().params()) p->bump_version();
}

}  // namespace tandem
