// The backend registry: every backend this build has (reference and portable always; xnnpack,
// onednn when their libraries were found; cuda in the binaries that link backends/cuda),
// picked by name by the edge, the cloud and the tools.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"

namespace tandem {

// The named backend; an Error listing this build's backends when there is no such one.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});
// This build's backends, in a stable order (reference first).
std::vector<std::string> backend_names();
// `preferred` when this build has it, else "reference".
std::string preferred_backend(const std::string& preferred);
// The cloud's default: cuda when this binary has it and a CUDA device can be used, else onednn
// (else reference).
std::string default_cloud_backend();
// This binary's GPU: its name, memory and the sessions' budget, or why there is none ("" in a
// binary without cuda).
std::string gpu_summary();
// The device memory the cuda backend's sessions may take together (0: 90% of the GPU's);
// nothing in a binary without cuda.
void set_gpu_memory_budget(std::size_t bytes);
// The cuda backend's device memory now (its pool, backends/cuda/cuda_pool.h): bytes its
// kernels hold and bytes cached for the next, the raw allocations made and the takes a cached
// block served. All 0 in a binary without cuda or before a kernel was made.
struct GpuMemoryUse {
  std::size_t live = 0, cached = 0;
  uint64_t allocations = 0, reuses = 0;
  std::size_t budget = 0;  // what the sessions may take together (--gpu-memory-mb); 0: none
};
GpuMemoryUse gpu_memory_use();

}  // namespace tandem
