// Layer normalisation in float, vectorised over the features (16 at a time): the kernel the
// portable (browser) and xnnpack backends run, since neither library path has one.
#pragma once

#include <memory>

#include "core/backend.h"

namespace tandem::simd {

std::unique_ptr<LayerNormKernel> make_layer_norm(const LayerNormGeometry& g);

}  // namespace tandem::simd
