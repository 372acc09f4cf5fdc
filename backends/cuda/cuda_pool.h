// The device memory the sessions' kernels take, cached: a buffer given back stays with the pool
// under its size class and the next buffer of that class takes it, instead of cudaFree (which
// waits for the whole device, every session's stream) and a new cudaMalloc. Blocks count
// against the budget while the pool holds them, taken or cached; a reservation past the limit,
// or a device out of memory, first gives the cached blocks back. The raw allocator is a
// parameter, so the bookkeeping is tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>

#include "backends/cuda/cuda_budget.h"

namespace tandem::cuda {

class DevicePool {
 public:
  struct Raw {
    std::function<void*(std::size_t)> allocate;  // throws Error when the device has no room
    std::function<void(void*)> free;
  };
  DevicePool(Raw raw, DeviceBudget& budget);
  ~DevicePool();  // frees what is cached (blocks still taken are their holders')
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes` (0: nullptr), cached if one of its class is, else new; `what`
  // is named in the budget's refusal.
  void* take(std::size_t bytes, const char* what);
  // Back into the cache. Every kernel call here ends with its stream waited for
  // (Context::staged), so no queued work still reads the block when its buffer goes; calls
  // that stop waiting must record an event a block and reuse it only once the event passed
  // (as PyTorch's caching allocator does). False, and nothing done, for a block this pool did
  // not make (it runs in a deleter: it must not throw).
  bool give(void* block);
  // Frees every cached block and gives its bytes back to the budget.
  void trim();

  struct Use {
    std::size_t live = 0, cached = 0;     // bytes taken, bytes cached
    uint64_t allocations = 0, reuses = 0;  // raw allocations made, takes a cached block served
  };
  Use use() const;

  // What a request of `bytes` takes: whole 512 B up to 1 MiB, whole MiB above (kernels of
  // one geometry ask the same sizes, so classes this fine are reused whole).
  static std::size_t size_class(std::size_t bytes);

 private:
  void trim_locked();

  Raw raw_;
  DeviceBudget& budget_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> cached_;      // by size: best fit first
  std::unordered_map<void*, std::size_t> sizes_;  // every block held, taken or cached
  Use use_;
};

// The process's pool: cudaMalloc and cudaFree on the current device, within device_budget().
// Never destroyed (its blocks would be freed after the CUDA runtime shut down).
DevicePool& device_pool();

}  // namespace tandem::cuda
