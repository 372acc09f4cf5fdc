// The module's entry point (backends/cuda_module.h): the cuda backend's functions as a table,
// for the binary that loads libtandem-cuda.so (or links these objects, as the tests do).
#include "backends/cuda_module.h"

#include "backends/cuda/cuda_backend.h"

#ifndef TANDEM_BUILD_STAMP
#error "TANDEM_BUILD_STAMP is set by the build (backends/CMakeLists.txt)"
#endif

extern "C" [[gnu::visibility("default")]] const tandem::CudaModule* tandem_cuda_module() {
  static const tandem::CudaModule module{
      TANDEM_BUILD_STAMP,          tandem::make_cuda_backend,      tandem::cuda_device_problem,
      tandem::cuda_device_summary, tandem::set_cuda_memory_budget, tandem::cuda_memory_use};
  return &module;
}
