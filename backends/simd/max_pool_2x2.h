// 2x2, stride 2 max pooling over NHWC with the winner's place in its window (a byte each),
// vectorised over channels: the first maximum in row order wins, as in the reference backend.
#pragma once

#include <cstdint>

namespace tandem::simd {

// y [N][H/2][W/2][C] and where [same]: the winner as kx * 2 + ky (column-major in the
// window, XNNPACK's argmax convention). H and W must be even. A byte, not an index: the
// stash is kept for every micro-batch in flight, and its size is memory traffic.
void max_pool_2x2(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, float* y, uint8_t* where);

// dx [N][H][W][C] (every element written): dy at each window's winner, 0 elsewhere.
void max_unpool_2x2(const float* dy, const uint8_t* where, int64_t n, int64_t h, int64_t w, int64_t c, float* dx);

}  // namespace tandem::simd
