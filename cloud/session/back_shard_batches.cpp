#include "cloud/session/back_shard_batches.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/loss.h"

namespace tandem {
namespace {

constexpr int kSlot = 0;  // every batch runs in one slot: its weight gradients finish before the next

// `buffer` seen as `shape`, grown when too small (steady state: no allocation).
Tensor grown(Tensor& buffer, const Shape& shape) {
  if (!buffer.defined() || buffer.numel() < shape.numel()) buffer = Tensor::empty(shape);
  return buffer.prefix(shape);
}

Shape item_shape(const Tensor& t) {
  Shape s = t.shape();
  s[0] = 1;
  return s;
}

// Micro-batches join one batch when every input has the same per-sample shape (with length
// buckets, the same length).
bool same_kind(const BatchedMicrobatch& a, const BatchedMicrobatch& b) {
  if (a.inputs.size() != b.inputs.size()) return false;
  for (std::size_t i = 0; i < a.inputs.size(); ++i)
    if (item_shape(a.inputs[i]) != item_shape(b.inputs[i])) return false;
  return true;
}

}  // namespace

BackShardBatches::BackShardBatches(Network& net, Optimizer& optimizer, uint32_t window, double gather_s,
                                   double timeout_s, uint32_t quorum)
    : net_(net), optimizer_(optimizer), stage_(net, &optimizer), window_(std::max<uint32_t>(1, window)),
      quorum_(quorum),
      gather_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gather_s))),
      timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))) {}

bool BackShardBatches::begin_step(uint64_t owner, uint32_t microbatches, const std::atomic<bool>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  Member& me = members_[owner];
  me.last = Clock::now();
  if (me.open) return true;
  changed_.notify_all();  // a new member: batches forming now may wait for it
  const auto arrived = Clock::now();
  // As turns' queue would: a session that already has a step in this window leaves the free
  // slots, for up to the gather time, to the sessions without one that are on their way:
  // those that took part in the last window, and new ones (waiting here for their first).
  auto yields = [&] {
    if (members_[owner].window != window_id_ || Clock::now() - arrived >= gather_) return false;
    std::size_t without = 0;
    for (const auto& [other, m] : members_)
      if (other != owner && !m.open && (m.window == Member::kNever || m.window + 1 == window_id_)) ++without;
    return without >= window_ - taken_;
  };
  if (!first_arrival_) first_arrival_ = arrived;
  // The first window waits for the quorum's sessions (those of the first update), up to the timeout.
  const auto waits_for_quorum = [&] {
    return window_id_ == 0 && (!replica_ || fresh_) && members_.size() < quorum_ &&
           Clock::now() - *first_arrival_ < timeout_;
  };
  // Replica windows: one step of each admitted session a window (drive() admits them).
  const auto replica_waits = [&] {
    const Member& m = members_[owner];
    return !m.admitted || m.window == window_id_ || (taken_ == 0 && busy_) || waits_for_quorum();
  };
  while (replica_ ? replica_waits()
                  : taken_ >= window_ || (taken_ == 0 && busy_) || yields() || waits_for_quorum()) {
    if (cancelled) return false;
    evict_quiet(Clock::now());
    auto until = Clock::now() + std::chrono::milliseconds(50);
    if (Clock::now() - arrived < gather_) until = std::min(until, arrived + gather_);  // (never a past time: no spin)
    changed_.wait_until(lock, until);
  }
  if (taken_ == 0) {  // a new window sums from zero; an abandoned step's deferred weights are dropped
    net_.drop_deferred_weights();
    weights_pending_ = weights_failed_ = false;
    stage_.zero_grad();
  }
  ++taken_;
  Member& m = members_[owner];  // (the map may have changed while waiting)
  m.open = true;
  m.window = window_id_;
  m.remaining = microbatches;
  m.last = Clock::now();
  changed_.notify_all();
  return true;
}

std::size_t BackShardBatches::expected() const {
  std::size_t coming = 0, idle = 0;
  if (replica_) {  // the admitted sessions' micro-batches of this window still to come
    for (const auto& [owner, m] : members_)
      if (m.admitted && (m.open ? m.remaining > 0 : m.window != window_id_)) ++coming;
    return coming;
  }
  for (const auto& [owner, m] : members_) {
    if (m.open && m.remaining > 0) ++coming;
    if (!m.open) ++idle;
  }
  return coming + std::min<std::size_t>(window_ - taken_, idle);
}

bool BackShardBatches::ready(Clock::time_point now) const {
  return !pending_.empty() && (pending_.size() >= expected() || now - pending_.front()->at >= gather_);
}

bool BackShardBatches::run(uint64_t owner, BatchedMicrobatch& mb, const std::atomic<bool>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto it = members_.find(owner);
  if (evicted_.count(owner) || it == members_.end() || !it->second.open) {
    mb.outcome = BatchedMicrobatch::Outcome::Evicted;
    return false;
  }
  it->second.last = Clock::now();
  Pending me{owner, &mb, Clock::now()};
  pending_.push_back(&me);
  changed_.notify_all();
  for (;;) {
    if (me.done) break;
    if (!me.taken && cancelled) {
      std::erase(pending_, &me);
      changed_.notify_all();
      mb.outcome = BatchedMicrobatch::Outcome::Closed;
      return false;
    }
    // The last batch's weight gradients run while this batch gathers (its micro-batches are
    // still on their way), off the path of the cut's gradients.
    if (!busy_ && weights_pending_ && !weights_failed_ && pending_.size() < expected()) {
      busy_ = true;
      lock.unlock();
      try {
        apply_deferred_weights();
      } catch (...) {  // the next batch's leader meets the same failure and tells its sessions
        weights_failed_ = true;
      }
      lock.lock();
      busy_ = false;
      changed_.notify_all();
      continue;
    }
    const auto now = Clock::now();
    if (!busy_ && ready(now)) {
      lead(lock);
      continue;
    }
    // (While the shard is busy only its release can make a batch ready, and it notifies.)
    auto until = now + std::chrono::milliseconds(50);
    if (!busy_ && !pending_.empty()) until = std::min(until, pending_.front()->at + gather_);
    changed_.wait_until(lock, until);
  }
  if (const auto m = members_.find(owner); m != members_.end()) m->second.last = Clock::now();
  return mb.outcome == BatchedMicrobatch::Outcome::Trained;
}

void BackShardBatches::lead(std::unique_lock<std::mutex>& lock) {
  std::vector<Pending*> batch;
  batch.reserve(pending_.size());
  const BatchedMicrobatch& first = *pending_.front()->mb;
  for (auto p = pending_.begin(); p != pending_.end();) {
    if (same_kind(first, *(*p)->mb)) {
      (*p)->taken = true;
      if (const auto m = members_.find((*p)->owner); m != members_.end()) {
        if (m->second.remaining > 0) --m->second.remaining;  // (counted until taken: the batch waits for it)
        m->second.last = Clock::now();  // computing is not going quiet
        m->second.in_batch = true;
      }
      batch.push_back(*p);
      p = pending_.erase(p);
    } else {
      ++p;
    }
  }
  busy_ = true;
  lock.unlock();
  double seconds = 0.0;
  try {
    compute(batch, seconds);
  } catch (...) {  // the cloud's own failure (a kernel, memory): each session is told
    std::string why = "an unknown error";
    try {
      throw;
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
    }
    for (Pending* p : batch) {
      p->mb->outcome = BatchedMicrobatch::Outcome::Failed;
      p->mb->failure = why;
    }
    // Nothing of the failed batch stays: its deferred weight gradients, what the unsplit
    // layers added, and the running statistics its forwards moved.
    net_.drop_deferred_weights();
    weights_pending_ = weights_failed_ = false;
    if (unsplit_dirty_) restore_unsplit();
    if (buffers_saved_) restore_buffers();
  }
  int64_t rows = 0;
  for (const Pending* p : batch) rows += p->mb->inputs[0].shape()[0];
  for (Pending* p : batch)
    p->mb->compute_s = seconds * static_cast<double>(p->mb->inputs[0].shape()[0]) / static_cast<double>(rows);
  lock.lock();
  busy_ = false;
  for (Pending* p : batch) {
    p->done = true;
    if (const auto m = members_.find(p->owner); m != members_.end()) m->second.in_batch = false;
  }
  ++stats_.batches;
  stats_.microbatches += batch.size();
  stats_.largest = std::max(stats_.largest, static_cast<uint32_t>(batch.size()));
  changed_.notify_all();
}

void BackShardBatches::apply_deferred_weights() {
  if (weights_pending_) stage_.backward_weights(kSlot);
  weights_pending_ = false;
}

std::span<const Tensor> BackShardBatches::joined(const std::vector<Pending*>& members) {
  // Always copies, one micro-batch too: the sessions' decode buffers are theirs to reuse
  // (their next Forward), and the deferred weight gradients read these inputs later.
  const std::span<const Tensor> first = members.front()->mb->inputs;
  int64_t rows = 0;
  for (const Pending* p : members) rows += p->mb->inputs[0].shape()[0];
  joined_buffers_.resize(first.size());
  joined_.resize(first.size());
  for (std::size_t i = 0; i < first.size(); ++i) {
    Shape shape = first[i].shape();
    shape[0] = rows;
    Tensor joined = grown(joined_buffers_[i], shape);
    std::size_t at = 0;
    for (const Pending* p : members) {
      const Tensor& part = p->mb->inputs[i];
      std::memcpy(joined.data() + at, part.data(), part.bytes());
      at += static_cast<std::size_t>(part.numel());
    }
    joined_[i] = joined;
  }
  return joined_;
}

bool BackShardBatches::passes(const std::vector<Pending*>& members, bool backward, Tensor* grad) {
  const Tensor& out = stage_.forward(joined(members), kSlot);
  const Tensor dlogits = grown(dlogits_, out.shape());
  bool all = true;
  int64_t r = 0;
  for (Pending* p : members) {
    BatchedMicrobatch& mb = *p->mb;
    const int64_t n = mb.inputs[0].shape()[0];
    Tensor d = dlogits.slice_batch(r, n);
    mb.loss = stage_.loss(out.slice_batch(r, n), mb.labels, mb.loss_scale, &d);
    if (!std::isfinite(mb.loss)) {
      mb.outcome = BatchedMicrobatch::Outcome::NonFiniteLoss;
      all = false;
    }
    r += n;
  }
  if (!all || !backward) return all;
  // The layers that cannot defer their weight gradients (batch and layer norm) add them now:
  // kept, so that a pass whose rows overflow can be undone exactly.
  const std::vector<Param*>& unsplit = net_.unsplit_params();
  unsplit_saved_.resize(unsplit.size());
  for (std::size_t i = 0; i < unsplit.size(); ++i) grown(unsplit_saved_[i], unsplit[i]->grad().shape()).copy_from(unsplit[i]->grad());
  unsplit_dirty_ = true;  // (until the pass is kept or undone: an exception undoes it, lead())
  *grad = stage_.backward(dlogits, kSlot, true, /*defer_weights=*/true);
  r = 0;
  for (Pending* p : members) {
    const int64_t n = p->mb->inputs[0].shape()[0];
    if (!all_finite(grad->slice_batch(r, n))) {
      p->mb->outcome = BatchedMicrobatch::Outcome::NonFiniteGradient;
      all = false;
    }
    r += n;
  }
  if (all) return true;  // (still dirty until compute() has handed the rows back)
  net_.drop_deferred_weights();  // nothing of this pass may reach the weights
  restore_unsplit();
  return false;
}

void BackShardBatches::compute(const std::vector<Pending*>& batch, double& seconds) {
  const auto t0 = Clock::now();
  apply_deferred_weights();  // the last batch's, before this one reuses the slot
  net_.set_training(true);
  // Rows whose loss or cut gradient is not finite (activations at the float range's end) reach
  // no weight: the pass is undone and runs again without them. Batch statistics (batch norm)
  // spread one micro-batch's overflow to every row, so a failing joined batch first tries each
  // micro-batch alone, and only those that fail alone are refused.
  // Training forwards move batch norm's running statistics: a pass that is undone, and each
  // trial, must leave them as they were, so the batch moves them once (save_buffers).
  std::vector<Pending*> live = batch;
  bool alone_tried = batch.size() == 1, first = true;
  Tensor grad;
  auto pass = [&](const std::vector<Pending*>& members) {
    if (!first) restore_buffers();
    first = false;
    return passes(members, true, &grad);
  };
  save_buffers();
  for (;;) {
    if (live.empty()) {
      restore_buffers();  // no row of the batch was trained
      break;
    }
    if (pass(live)) {
      int64_t r = 0;
      for (Pending* p : live) {
        BatchedMicrobatch& mb = *p->mb;
        const Tensor rows_grad = grad.slice_batch(r, mb.inputs[0].shape()[0]);
        r += rows_grad.shape()[0];
        if (!mb.grad->defined() || mb.grad->shape() != rows_grad.shape()) *mb.grad = Tensor::empty(rows_grad.shape());
        mb.grad->copy_from(rows_grad);
        mb.weight_version = static_cast<uint64_t>(optimizer_.steps());
      }
      weights_pending_ = net_.weights_pending(kSlot);
      unsplit_dirty_ = false;  // the pass is kept
      break;
    }
    if (!alone_tried) {
      alone_tried = true;
      for (Pending* p : live) {
        p->mb->outcome = BatchedMicrobatch::Outcome::Trained;
        if (pass({p})) restore_unsplit();  // (a trial: the survivors run again together)
        net_.drop_deferred_weights();
      }
    }
    std::erase_if(live, [](const Pending* p) { return p->mb->outcome != BatchedMicrobatch::Outcome::Trained; });
  }
  buffers_saved_ = false;
  // The batch's compute, shared among its micro-batches by rows (the sessions' busy time).
  seconds = std::chrono::duration<double>(Clock::now() - t0).count();
}

void BackShardBatches::restore_unsplit() {
  const std::vector<Param*>& unsplit = net_.unsplit_params();
  for (std::size_t i = 0; i < unsplit.size(); ++i)
    unsplit[i]->grad().copy_from(unsplit_saved_[i].prefix(unsplit[i]->grad().shape()));
  unsplit_dirty_ = false;
}

void BackShardBatches::save_buffers() {
  net_.save_state(state_saved_);
  buffers_saved_ = true;
}

void BackShardBatches::restore_buffers() { net_.restore_state(state_saved_); }


bool BackShardBatches::finish_step(uint64_t owner, float lr_scale, const std::function<void()>& between_updates) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto it = members_.find(owner);
  if (it == members_.end() || !it->second.open) return !evicted_.count(owner);
  it->second.open = false;
  it->second.remaining = 0;
  it->second.last = Clock::now();
  changed_.notify_all();
  if (replica_) {  // drive() applies the update once every admitted session finished
    ++finished_;
    lr_sum_ += lr_scale;
    return true;
  }
  if (++finished_ < window_) return true;
  // The window's last step: the update, the mean of its steps' gradients (each its batch's mean).
  changed_.wait(lock, [this] { return !busy_; });
  busy_ = true;
  lock.unlock();
  bool applied = false;
  try {
    apply_deferred_weights();
    applied = net_.gradients_finite();
    if (!applied)  // a refused micro-batch overflowed the shard's gradients: the shard must not take them
      std::fprintf(stderr, "tandem-cloud: the shared back shard's summed gradients are not finite (the weights' "
                           "own gradients overflowed); this update is skipped%s\n",
                   stage_.update_sync() ? " here (the other replicas' rows still update every replica)" : "");
    if (UpdateSync* sync = stage_.update_sync()) {
      // Replicas (their sync sums the gradients): every one takes part in every update, one
      // without finite gradients with none, and all apply the mean of all their windows'
      // steps, as one shard whose window held every replica's steps would.
      if (!applied) stage_.zero_grad();
      const uint64_t steps = sync->before_update(applied ? window_ : 0, nullptr);
      applied = steps > 0;
      if (applied) {
        optimizer_.set_lr_scale(lr_scale / static_cast<float>(steps));
        optimizer_.step();
      }
      sync->after_update();
    } else if (applied) {
      optimizer_.set_lr_scale(lr_scale / static_cast<float>(window_));
      stage_.step();
    }
    if (applied && between_updates) between_updates();
  } catch (...) {
    lock.lock();
    busy_ = false;
    weights_pending_ = weights_failed_ = false;
    taken_ = finished_ = 0;
    ++window_id_;
    changed_.notify_all();
    throw;
  }
  lock.lock();
  busy_ = false;
  if (applied) ++updates_;
  taken_ = finished_ = 0;
  ++window_id_;
  changed_.notify_all();
  return true;
}

void BackShardBatches::set_replica_windows(double hold_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  replica_ = true;
  hold_ = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(hold_s));
  fresh_ = optimizer_.steps() == 0;
}

bool BackShardBatches::admit(uint64_t owner, const std::atomic<bool>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!replica_) return true;
  members_[owner].last = Clock::now();
  changed_.notify_all();
  for (;;) {
    const auto it = members_.find(owner);
    if (it == members_.end() || cancelled) return false;
    if (it->second.admitted) return true;
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

void BackShardBatches::retire(uint64_t owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = members_.find(owner);
  if (!replica_ || it == members_.end() || it->second.open) return;
  it->second.admitted = false;
  it->second.retired = true;
  changed_.notify_all();
}

bool BackShardBatches::window_complete() const {
  if (finished_ == 0) return false;
  for (const auto& [owner, m] : members_)
    if (m.admitted && (m.window != window_id_ || m.open)) return false;
  return true;
}

bool BackShardBatches::apply_summed(uint64_t steps, double lr_sum) {
  if (steps == 0) return false;
  // The mean of the steps' learning-rate scales, over the steps: the mean of their gradients.
  const auto mean_lr = static_cast<float>(lr_sum / static_cast<double>(steps));
  optimizer_.set_lr_scale(mean_lr / static_cast<float>(steps));
  optimizer_.step();
  return true;
}

void BackShardBatches::next_window(bool applied) {
  if (applied) ++updates_;
  updated_since_round_ = updated_since_round_ || applied;
  weights_pending_ = weights_failed_ = false;
  taken_ = finished_ = 0;
  lr_sum_ = 0.0;
  ++window_id_;
  at_boundary_ = false;
  changed_.notify_all();
}

void BackShardBatches::replica_update(std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [this] { return !busy_; });
  busy_ = true;
  const uint64_t steps = finished_;
  double lr = lr_sum_;
  lock.unlock();
  bool applied = false;
  try {
    apply_deferred_weights();
    const bool finite = net_.gradients_finite();
    if (!finite) {  // every replica takes part: this one with none of its steps
      std::fprintf(stderr, "tandem-cloud: the shared back shard's summed gradients are not finite (the weights' own "
                           "gradients overflowed); this replica's steps are left out of the update\n");
      stage_.zero_grad();
      lr = 0.0;
    }
    UpdateSync& sync = *stage_.update_sync();
    const uint64_t total = sync.before_update(finite ? steps : 0, &lr);
    applied = apply_summed(total, lr);
    sync.after_update();
  } catch (...) {
    lock.lock();
    busy_ = false;
    next_window(false);
    throw;
  }
  lock.lock();
  busy_ = false;
  next_window(applied);
}

void BackShardBatches::apply_idle_update(uint64_t steps, double lr_sum) {
  const bool applied = apply_summed(steps, lr_sum);  // (drive() holds the shard: busy_)
  std::lock_guard<std::mutex> lock(mutex_);
  if (applied) ++updates_;
  updated_since_round_ = updated_since_round_ || applied;
}

void BackShardBatches::round_boundary() {
  std::lock_guard<std::mutex> lock(mutex_);
  at_boundary_ = true;
  round_closed_ = true;
  updated_since_round_ = false;
  changed_.notify_all();
}

void BackShardBatches::round_ready() {
  std::lock_guard<std::mutex> lock(mutex_);
  round_ready_ = true;
  changed_.notify_all();
}

void BackShardBatches::drive(const std::atomic<bool>& stop, const Drive& calls) {
  if (!replica_) fail("back shard", "drive() serves replica windows: set_replica_windows first");
  const auto started = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  // (each step below that leaves the lock holds the shard, busy_, and gives it back on any exit)
  const auto holding = [&](auto&& work) {
    busy_ = true;
    lock.unlock();
    try {
      work();
    } catch (...) {
      lock.lock();
      busy_ = false;
      changed_.notify_all();
      throw;
    }
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  };
  while (!stop) {
    if (at_boundary_)
      for (auto& [owner, m] : members_)
        if (!m.admitted && !m.retired) {
          m.admitted = ever_admitted_ = true;
          changed_.notify_all();
        }
    // The round closed last is kept after the update that follows it, as one cloud keeps it
    // (CloudSession::save_round): its checkpoint is that update's shard and the round's average.
    if (round_closed_ && updated_since_round_ && !busy_) {
      round_closed_ = false;
      if (calls.after_round) holding(calls.after_round);
      continue;
    }
    if (window_complete()) {
      replica_update(lock);
      continue;
    }
    if (round_ready_ && !busy_) {  // (after the update of its last steps' window, just above)
      round_ready_ = false;
      if (calls.round) holding(calls.round);
      continue;
    }
    const bool any = std::any_of(members_.begin(), members_.end(), [](const auto& m) { return m.second.admitted; });
    // At the set's start its first update waits a while for this replica's first sessions.
    const bool held = fresh_ && !ever_admitted_ && Clock::now() - started < hold_;
    if (!any && taken_ == 0 && finished_ == 0 && !busy_ && !held) {
      IdleTurn turn = IdleTurn::Nothing;
      holding([&] { turn = calls.idle(); });
      // After an update the set is within a round; after a round, or with every replica idle,
      // at a boundary.
      at_boundary_ = turn != IdleTurn::Update;
      if (turn == IdleTurn::Nothing) changed_.wait_for(lock, std::chrono::milliseconds(20));
      continue;
    }
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

bool BackShardBatches::step_open(uint64_t owner) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = members_.find(owner);
  return it != members_.end() && it->second.open;
}

bool BackShardBatches::begin_eval(uint64_t owner, const std::atomic<bool>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (busy_) {
    if (cancelled) return false;
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
  busy_ = true;
  eval_owner_ = owner;
  return true;
}

void BackShardBatches::end_eval(uint64_t owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (eval_owner_ != owner) return;
  eval_owner_ = 0;
  busy_ = false;
  changed_.notify_all();
}

void BackShardBatches::release(uint64_t owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (eval_owner_ == owner) {
    eval_owner_ = 0;
    busy_ = false;
  }
  const auto it = members_.find(owner);
  if (it != members_.end()) {
    if (it->second.open) --taken_;  // the slot is free for another step
    members_.erase(it);
  }
  evicted_.erase(owner);
  changed_.notify_all();
}

void BackShardBatches::evict_quiet(Clock::time_point now) {
  for (auto it = members_.begin(); it != members_.end();) {
    const bool handing_in = std::any_of(pending_.begin(), pending_.end(), [&](const Pending* p) { return p->owner == it->first; });
    if (it->second.open && !handing_in && !it->second.in_batch && now - it->second.last > timeout_) {
      evicted_.insert(it->first);  // its step is lost; its session is told at its next message
      --taken_;
      it = members_.erase(it);
      changed_.notify_all();
    } else {
      ++it;
    }
  }
}

bool BackShardBatches::was_evicted(uint64_t owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  return evicted_.erase(owner) > 0;
}

uint64_t BackShardBatches::updates() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return updates_;
}

BackShardBatches::Stats BackShardBatches::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace tandem
