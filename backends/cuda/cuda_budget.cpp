#include "backends/cuda/cuda_budget.h"

#include "core/error.h"

namespace tandem::cuda {

void DeviceBudget::set_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
}

std::size_t DeviceBudget::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

std::size_t DeviceBudget::reserved() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

void DeviceBudget::reserve(std::size_t bytes, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (limit_ != 0 && bytes > limit_ - std::min(reserved_, limit_))
    fail("cuda", cat("the GPU memory budget (", limit_ >> 20, " MiB for all sessions, tandem-cloud serve --gpu-memory-mb) ",
                     "has ", (limit_ - std::min(reserved_, limit_)) >> 20, " MiB left and ", what, " needs ", bytes >> 20,
                     " MiB more: this session does not fit now; try again later, or with a smaller batch"));
  reserved_ += bytes;
}

void DeviceBudget::release(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= std::min(bytes, reserved_);
}

DeviceBudget& device_budget() {
  static DeviceBudget budget;
  return budget;
}

}  // namespace tandem::cuda
