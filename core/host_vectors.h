// The host loops of VectorKernel (core/backend.h): what every CPU backend runs for gradient
// sums and the optimizers' updates, and what a GPU backend falls back to for host memory.
#pragma once

#include "core/backend.h"

namespace tandem {

// One stateless instance for the whole process.
VectorKernel& host_vectors();

}  // namespace tandem
