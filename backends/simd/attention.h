// Multi-head attention in float on the vectorised GEMM (simd/gemm.h, gemm_native): four products per head
// and a masked, numerically safe softmax; the kernel of the portable (browser) and xnnpack
// backends, since neither library has an attention with a backward.
#pragma once

#include <memory>

#include "core/backend.h"

namespace tandem::simd {

std::unique_ptr<AttentionKernel> make_attention(const AttentionGeometry& g);

// Softmax of one row of `n` scores in place over the keys `keep` allows (others get 0); a row
// with no kept key becomes all 0. Shared with backends that multiply on a library (onednn).
void masked_softmax_row(float* s, int64_t n, float scale, const float* mask, int64_t causal_last);

// dS = P * (dP - sum(dP * P)) * scale for one row, in place over dP.
void softmax_backward_row(const float* p, float* dp, int64_t n, float scale);

}  // namespace tandem::simd
