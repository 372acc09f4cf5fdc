// The portable backend: the reference backend's loops, with linear and dense convolution
// layers on a vectorised GEMM (backends/simd/gemm.h). What the browser (wasm) edge trains with.
#pragma once

#include <memory>

#include "core/backend.h"

namespace tandem {

std::unique_ptr<Backend> make_portable_backend(const BackendOptions& options);

}  // namespace tandem
