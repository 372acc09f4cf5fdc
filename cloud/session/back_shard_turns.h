// Turns on one back shard that many sessions train (split-federated): a session holds the
// turn for one whole step (its K micro-batches and the update) or one evaluation batch, the
// others wait. A waiting session gives up when cancelled (its connection closed), so closing
// a connection never waits on another edge.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace tandem {

class BackShardTurns {
 public:
  // Blocks until `owner` holds the turn (true) or `cancelled` becomes true (false).
  bool acquire(uint64_t owner, const std::atomic<bool>& cancelled) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (held_ && owner_ != owner) {
      if (cancelled) return false;
      free_.wait_for(lock, std::chrono::milliseconds(50));
    }
    held_ = true;
    owner_ = owner;
    return true;
  }
  void release(uint64_t owner) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!held_ || owner_ != owner) return;
      held_ = false;
    }
    free_.notify_all();
  }
  bool held_by(uint64_t owner) {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_ && owner_ == owner;
  }

 private:
  std::mutex mutex_;
  std::condition_variable free_;
  uint64_t owner_ = 0;
  bool held_ = false;
};

}  // namespace tandem
