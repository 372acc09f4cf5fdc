// Turns on one back shard that many sessions train (split-federated): a session holds the
// turn for one whole step (its K micro-batches and the update) or one evaluation batch, the
// others wait, first come first served, so the edges' steps interleave (an edge whose next
// step is already queued must not take turn after turn: with non-IID edges the shard would
// see long runs of the same classes). A waiting session gives up when cancelled (its connection closed), so closing
// a connection never waits on another edge; and a holder that has not computed for longer
// than the timeout (a hung edge mid-step) loses the turn, so it stalls the others no longer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

namespace tandem {

class BackShardTurns {
 public:
  using Clock = std::chrono::steady_clock;
  explicit BackShardTurns(double timeout_s = 30.0)
      : timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))) {}

  // Blocks until `owner` holds the turn (true) or `cancelled` becomes true (false).
  bool acquire(uint64_t owner, const std::atomic<bool>& cancelled) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (held_ && owner_ == owner) return true;
    queue_.push_back(owner);
    for (;;) {
      if (cancelled) {
        std::erase(queue_, owner);
        free_.notify_all();
        return false;
      }
      if (queue_.front() == owner) {
        if (!held_) break;
        if (!computing_ && Clock::now() - last_ > timeout_) {
          evicted_ = owner_;  // the holder went quiet mid-step: its step is lost
          break;
        }
      }
      free_.wait_for(lock, std::chrono::milliseconds(50));
    }
    queue_.pop_front();
    held_ = true;
    owner_ = owner;
    last_ = Clock::now();
    return true;
  }
  // Brackets the holder's work on the shard; false when `owner` no longer holds the turn.
  bool begin_compute(uint64_t owner) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!held_ || owner_ != owner) return false;
    computing_ = true;
    return true;
  }
  void end_compute() {
    std::lock_guard<std::mutex> lock(mutex_);
    computing_ = false;
    last_ = Clock::now();
  }
  void release(uint64_t owner) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!held_ || owner_ != owner) return;
      held_ = false;
      computing_ = false;
    }
    free_.notify_all();
  }
  bool held_by(uint64_t owner) {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_ && owner_ == owner;
  }
  // True once for a session that lost its turn by going quiet.
  bool was_evicted(uint64_t owner) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (evicted_ != owner) return false;
    evicted_ = 0;
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable free_;
  Clock::duration timeout_;
  Clock::time_point last_;
  std::deque<uint64_t> queue_;  // waiting sessions, in arrival order
  uint64_t owner_ = 0, evicted_ = 0;
  bool held_ = false, computing_ = false;
};

}  // namespace tandem
