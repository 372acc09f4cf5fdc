#include "backends/cuda/cuda_pool.h"

#include "core/error.h"

namespace tandem::cuda {

DevicePool::DevicePool(Raw raw, DeviceBudget& budget) : raw_(std::move(raw)), budget_(budget) {}

DevicePool::~DevicePool() {
  std::lock_guard<std::mutex> lock(mutex_);
  trim_locked();
}

std::size_t DevicePool::size_class(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{1} << 20;
  const std::size_t unit = bytes <= kLarge ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

void* DevicePool::take(std::size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  const std::size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  // The smallest cached block that holds it, if it is at most an eighth larger (a larger one
  // would sit mostly unused while a request its size waits for a new allocation).
  if (auto it = cached_.lower_bound(size); it != cached_.end() && it->first <= size + size / 8) {
    void* block = it->second;
    use_.live += it->first;
    use_.cached -= it->first;
    ++use_.reuses;
    cached_.erase(it);
    return block;
  }
  try {
    budget_.reserve(size, what);
  } catch (const Error&) {
    if (cached_.empty()) throw;
    trim_locked();  // what is cached may be what stands in the way
    budget_.reserve(size, what);
  }
  void* block = nullptr;
  try {
    try {
      block = raw_.allocate(size);
    } catch (const Error&) {
      if (cached_.empty()) throw;
      trim_locked();
      block = raw_.allocate(size);
    }
  } catch (...) {
    budget_.release(size);
    throw;
  }
  sizes_.emplace(block, size);
  use_.live += size;
  ++use_.allocations;
  return block;
}

bool DevicePool::give(void* block) {
  if (block == nullptr) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = sizes_.find(block);
  if (it == sizes_.end()) return false;
  use_.live -= it->second;
  use_.cached += it->second;
  cached_.emplace(it->second, block);
  return true;
}

void DevicePool::trim() {
  std::lock_guard<std::mutex> lock(mutex_);
  trim_locked();
}

void DevicePool::trim_locked() {
  for (const auto& [size, block] : cached_) {
    raw_.free(block);
    budget_.release(size);
    sizes_.erase(block);
  }
  use_.cached = 0;
  cached_.clear();
}

DevicePool::Use DevicePool::use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return use_;
}

}  // namespace tandem::cuda
