// The device memory the cloud's sessions may take on the GPU, together: every DeviceBuffer
// reserves its bytes here first, so a session whose kernels would pass the budget gets an
// Error that says so (and is closed with it) while the others go on. No CUDA call: testable
// without a GPU.
#pragma once

#include <cstddef>
#include <mutex>

namespace tandem::cuda {

class DeviceBudget {
 public:
  // 0: no limit.
  void set_limit(std::size_t bytes);
  std::size_t limit() const;
  std::size_t reserved() const;
  // Takes `bytes` for `what` (a kernel's buffers), or throws Error with what is left.
  void reserve(std::size_t bytes, const char* what);
  void release(std::size_t bytes);

 private:
  mutable std::mutex mutex_;
  std::size_t limit_ = 0, reserved_ = 0;
};

// The process's budget (tandem-cloud serve --gpu-memory-mb).
DeviceBudget& device_budget();

}  // namespace tandem::cuda
