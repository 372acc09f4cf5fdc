// Vectorised activations for the backends whose libraries lack them (portable, the browser's,
// and xnnpack: XNNPACK 2022 has no GELU): GELU's erf form, forward and backward.
#pragma once

#include <memory>

#include "core/activation.h"
#include "core/backend.h"

namespace tandem::simd {

// A vector kernel for `kind` when there is one (gelu), else null: the caller keeps its loop.
std::unique_ptr<ActivationKernel> make_activation(const Activation& kind, int64_t elements);

}  // namespace tandem::simd
