// The cuda backend as a module: libtandem-cuda.so holds backends/cuda and links CUDA's
// libraries; a binary loads it when cuda is asked for (as PyTorch loads CUDA lazily), so a
// CPU cloud neither needs nor maps them. The module exports one C entry point giving this
// table; the core it runs on is the loading binary's own (its symbols exported), so there is one
// tensor memory, one error type and one set of globals in the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/registry.h"
#include "core/backend.h"

namespace tandem {

struct CudaModule {
  // The build both sides come from (TANDEM_BUILD_STAMP, made when the build was configured):
  // a module of another build would run on another layout of tensors and backends.
  const char* build_stamp;
  std::unique_ptr<Backend> (*make_backend)(const BackendOptions& options);
  std::string (*device_problem)();
  std::string (*device_summary)();
  void (*set_memory_budget)(std::size_t bytes);
  GpuMemoryUse (*memory_use)();
};

// The module's file name, and the symbol of its entry point.
inline constexpr const char* kCudaModuleFile = "libtandem-cuda.so";
inline constexpr const char* kCudaModuleEntry = "tandem_cuda_module";

// The cuda backend of this process: the module's table, loaded on the first call (never
// unloaded); null with `problem` saying why when it cannot be (no module in this binary, the
// file missing or unloadable, another build's). Defined by backends/cuda_loader.cpp, which
// only the binaries that may serve on cuda link (tandem-cloud, tandem, the GPU benchmarks).
const CudaModule* load_cuda_module(std::string& problem);
// Whether this machine has a CUDA driver at all (libcuda.so.1 can be opened), without
// loading the module: a CPU machine's default backend is decided without mapping CUDA.
bool cuda_driver_present();

}  // namespace tandem

// The module's entry point, `extern "C" const tandem::CudaModule* tandem_cuda_module()`, is
// defined in backends/cuda/cuda_module.cpp (and declared weak where it is looked up).
