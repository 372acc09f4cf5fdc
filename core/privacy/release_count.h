// How many times the training set's activations have left under noise: what the privacy
// accountant counts (a replayed step, after a lost link or a restart, is a fresh release of
// the same samples). A party that keeps checkpoints keeps this count durably
// (ports/files/release_ledger.h), so a new process goes on from it.
#pragma once

#include <cstdint>

namespace tandem {

class ReleaseCount {
 public:
  virtual ~ReleaseCount() = default;
  virtual uint64_t releases() const = 0;
  // One more release, counted (durably, where the count is kept) before it leaves.
  virtual void count_one() = 0;
  // At least `n` releases were made (a checkpoint of step n, from before the count was kept).
  virtual void at_least(uint64_t n) = 0;
};

}  // namespace tandem
