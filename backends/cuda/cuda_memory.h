// Where tensors' storage lives once a cuda backend serves (core/tensor.h, TensorMemory), chosen
// by TANDEM_CUDA_MEMORY: pinned, managed or pageable. Installed once, for the whole process.
#pragma once

#include <string>

namespace tandem::cuda {

enum class TensorPlacement {
  pageable,  // core's own host memory: every kernel call copies through the driver's staging
  pinned,    // page-locked host memory (cudaHostRegister): the copies run by DMA (the default)
  managed,   // CUDA managed memory: kernels use tensors in place, only what the host reads moves
};

// TANDEM_CUDA_MEMORY (pinned | managed | pageable; TANDEM_CUDA_PIN=0 still means pageable);
// throws Error naming the choices for anything else.
TensorPlacement chosen_placement();

// Installs the chosen placement's TensorMemory (the first call does; later ones keep it).
// Managed memory needs a device where host and device may touch it concurrently
// (concurrentManagedAccess); elsewhere it falls back to pinned and says so on stderr.
void install_tensor_memory();
// The placement in words, for the start-up line: the installed one, else the chosen one.
std::string placement_summary();

}  // namespace tandem::cuda
