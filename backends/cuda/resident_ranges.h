// The address ranges of the tensors a kernel may use in place: CUDA managed memory the cuda
// backend made them in (TANDEM_CUDA_MEMORY=managed). Bookkeeping only, no CUDA call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <shared_mutex>

namespace tandem::cuda {

class ResidentRanges {
 public:
  // Records [p, p + bytes); `p` must not be recorded already.
  void add(const void* p, std::size_t bytes);
  // Forgets the range that starts at `p` (nothing when none does).
  void remove(const void* p);
  // Whether all of [p, p + bytes) lies in one recorded range (a tensor or a view of one).
  // Null is never resident. Takes a shared lock and does not allocate: every kernel call asks.
  bool contains(const void* p, std::size_t bytes) const;
  std::size_t size() const;

 private:
  mutable std::shared_mutex mu_;
  std::map<std::uintptr_t, std::size_t> ranges_;  // start -> bytes
};

// The process's: the managed tensor memory records its allocations here.
ResidentRanges& resident_ranges();

}  // namespace tandem::cuda
