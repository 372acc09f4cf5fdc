// The cuda backend's passes over parameters and gradients (VectorKernel, core/backend.h): device
// kernels where every operand is a managed tensor, the host loops otherwise.
#pragma once

#include <memory>

#include "backends/cuda/cuda_context.h"
#include "core/backend.h"

namespace tandem::cuda {

std::unique_ptr<VectorKernel> make_vectors(std::shared_ptr<Context> ctx);

}  // namespace tandem::cuda
