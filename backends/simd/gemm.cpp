#include "backends/simd/gemm.h"

#include <cstring>

#if defined(__GNUC__) && !defined(__clang__)
// The vectors never cross a non-inlined call; the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace tandem::simd {
namespace {

// 8 floats: two SSE or wasm SIMD128 registers, one AVX or two NEON registers. A 4 x 8 tile
// keeps 4 accumulators and one B vector in registers on every target.
using f32x8 = float __attribute__((vector_size(32), aligned(4)));
constexpr int64_t kRows = 4, kCols = 8;

inline f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }

// Rows [i, i + R) by columns [j, j + 8).
template <int R>
inline void tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                 bool accumulate) {
  f32x8 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = accumulate ? load8(c + r * ldc) : f32x8{};
  for (int64_t p = 0; p < k; ++p) {
    const f32x8 bv = load8(b + p * ldb);
    for (int r = 0; r < R; ++r) acc[r] += a[r * lda + p] * bv;
  }
  for (int r = 0; r < R; ++r) store8(c + r * ldc, acc[r]);
}

// Rows [i, i + R) by the last n % 8 columns, through a zero-padded 8-wide copy of B's columns.
template <int R>
inline void edge_tile(int64_t k, int64_t cols, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                      int64_t ldc, bool accumulate, float* bpad) {
  float cpad[kRows * kCols] = {};
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < cols; ++j) cpad[r * kCols + j] = accumulate ? c[r * ldc + j] : 0.0f;
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < kCols; ++j) bpad[p * kCols + j] = j < cols ? b[p * ldb + j] : 0.0f;
  tile<R>(k, a, lda, bpad, kCols, cpad, kCols, true);
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] = cpad[r * kCols + j];
}

template <int R>
void rows(int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
          bool accumulate, float* bpad) {
  int64_t j = 0;
  for (; j + kCols <= n; j += kCols) tile<R>(k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  if (j < n) edge_tile<R>(k, n - j, a, lda, b + j, ldb, c + j, ldc, accumulate, bpad);
}

}  // namespace

void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate) {
  // Column blocks of B stay in cache while every row block of A passes over them.
  constexpr int64_t kBlockK = 256;
  float bpad_small[kBlockK * kCols];
  for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {
    const int64_t kb = k - p0 < kBlockK ? k - p0 : kBlockK;
    const bool acc = accumulate || p0 > 0;
    const float* ap = a + p0;
    const float* bp = b + p0 * ldb;
    int64_t i = 0;
    for (; i + kRows <= m; i += kRows) rows<kRows>(n, kb, ap + i * lda, lda, bp, ldb, c + i * ldc, ldc, acc, bpad_small);
    for (; i < m; ++i) rows<1>(n, kb, ap + i * lda, lda, bp, ldb, c + i * ldc, ldc, acc, bpad_small);
  }
  if (k == 0 && !accumulate)
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, static_cast<std::size_t>(n) * sizeof(float));
}

void transpose(int64_t rows, int64_t cols, const float* in, int64_t ld_in, float* out) {
  constexpr int64_t kBlock = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlock)
    for (int64_t j0 = 0; j0 < cols; j0 += kBlock)
      for (int64_t i = i0; i < i0 + kBlock && i < rows; ++i)
        for (int64_t j = j0; j < j0 + kBlock && j < cols; ++j) out[j * rows + i] = in[i * ld_in + j];
}

}  // namespace tandem::simd
