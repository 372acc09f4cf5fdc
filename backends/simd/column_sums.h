// out[c] = the sum over rows of x[r][c] for x [rows][cols]: a bias gradient, vectorised over
// columns (16 at a time, the rest one by one), rows summed in order.
#pragma once

#include <cstdint>

namespace tandem::simd {

void column_sums(const float* x, int64_t rows, int64_t cols, float* out);

}  // namespace tandem::simd
