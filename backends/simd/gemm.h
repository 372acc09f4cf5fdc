// A portable single-precision GEMM in vector-extension C++: no intrinsics, no target
// attributes, so g++, aarch64-linux-gnu-g++ and em++ -msimd128 each lower it to their SIMD.
#pragma once

#include <cstdint>

namespace tandem::simd {

// C[M][N] = (accumulate ? C : 0) + A[M][K] * B[K][N]; row-major with leading dimensions.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate);

// The same product compiled for this machine's widest vectors (AVX-512 or AVX2+FMA clones
// picked at load, core/vector.h) for the native kernels that need not match the browser's
// build (attention); gemm stays baseline, the code the wasm GEMM bar compares with.
void gemm_native(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                 int64_t ldc, bool accumulate);

// out[cols][rows] = in[rows][cols] (leading dimension ld_in).
void transpose(int64_t rows, int64_t cols, const float* in, int64_t ld_in, float* out);

}  // namespace tandem::simd
