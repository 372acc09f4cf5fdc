// The CUDA backend (cloud GPUs): cuBLAS GEMMs, cuDNN convolutions and tandem's own device
// kernels (cuda_kernels.h); the registry names it "cuda" in the binaries that link it.
#pragma once

#include <memory>
#include <string>

#include "backends/registry.h"
#include "core/backend.h"

namespace tandem {

// Throws Error when this machine has no usable CUDA device (cuda_device_problem() says why).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

// "" when a CUDA device can be used, else why not in words a user can act on ("no CUDA
// device: CUDA driver version is insufficient for CUDA runtime version", ...).
std::string cuda_device_problem();

// The device the backend runs on: its name, its memory and the sessions' budget (for the
// cloud's start-up line).
std::string cuda_device_summary();

// The device memory all sessions' kernels may take together (cuda_budget.h); 0: 90% of the
// device's. Throws Error without a device.
void set_cuda_memory_budget(std::size_t bytes);

// The pool's bytes live and cached and its counts (cuda_pool.h), for the cloud's metrics.
GpuMemoryUse cuda_memory_use();

}  // namespace tandem
