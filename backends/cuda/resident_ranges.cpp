#include "backends/cuda/resident_ranges.h"

#include <mutex>

namespace tandem::cuda {

void ResidentRanges::add(const void* p, std::size_t bytes) {
  std::unique_lock lock(mu_);
  ranges_[reinterpret_cast<std::uintptr_t>(p)] = bytes;
}

void ResidentRanges::remove(const void* p) {
  std::unique_lock lock(mu_);
  ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
}

bool ResidentRanges::contains(const void* p, std::size_t bytes) const {
  if (!p) return false;
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::shared_lock lock(mu_);
  auto it = ranges_.upper_bound(at);  // the first range starting after p
  if (it == ranges_.begin()) return false;
  --it;  // the last range starting at or before p
  const std::uintptr_t end = it->first + it->second;
  return at < end && bytes <= end - at;
}

std::size_t ResidentRanges::size() const {
  std::shared_lock lock(mu_);
  return ranges_.size();
}

ResidentRanges& resident_ranges() {
  static ResidentRanges* ranges = new ResidentRanges;  // never destroyed: tensors may outlive statics
  return *ranges;
}

}  // namespace tandem::cuda
