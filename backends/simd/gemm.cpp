#include "backends/simd/gemm.h"

#include <cstring>

#include "core/vector.h"

#if defined(__GNUC__) && !defined(__clang__)
// The vectors never cross a non-inlined call; the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace tandem::simd {
namespace {

// 8 floats: two SSE or wasm SIMD128 registers, one AVX or two NEON registers. A 4 x 8 tile
// keeps 4 accumulators and one B vector in registers on every target. gemm_native's 4 x 16
// tiles are one AVX-512 or two AVX registers a row.
using f32x8 = float __attribute__((vector_size(32), aligned(4)));
constexpr int64_t kRows = 4, kMaxCols = 16;

template <typename V>
constexpr int64_t cols_of = static_cast<int64_t>(sizeof(V) / sizeof(float));

template <typename V>
[[gnu::always_inline]] inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V>
[[gnu::always_inline]] inline void store(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

// Rows [i, i + R) by columns [j, j + width of V).
template <typename V, int R>
[[gnu::always_inline]] inline void tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                                        int64_t ldc, bool accumulate) {
  V acc[R];
  for (int r = 0; r < R; ++r) acc[r] = accumulate ? load<V>(c + r * ldc) : V{};
  for (int64_t p = 0; p < k; ++p) {
    const V bv = load<V>(b + p * ldb);
    for (int r = 0; r < R; ++r) acc[r] += a[r * lda + p] * bv;
  }
  for (int r = 0; r < R; ++r) store<V>(c + r * ldc, acc[r]);
}

// Rows [i, i + R) by the last columns (fewer than a vector), through a zero-padded copy of
// B's columns.
template <typename V, int R>
[[gnu::always_inline]] inline void edge_tile(int64_t k, int64_t cols, const float* a, int64_t lda, const float* b,
                                             int64_t ldb, float* c, int64_t ldc, bool accumulate, float* bpad) {
  constexpr int64_t w = cols_of<V>;
  float cpad[kRows * kMaxCols] = {};
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < cols; ++j) cpad[r * w + j] = accumulate ? c[r * ldc + j] : 0.0f;
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < w; ++j) bpad[p * w + j] = j < cols ? b[p * ldb + j] : 0.0f;
  tile<V, R>(k, a, lda, bpad, w, cpad, w, true);
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] = cpad[r * w + j];
}

template <typename V, int R>
[[gnu::always_inline]] inline void rows(int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                                        float* c, int64_t ldc, bool accumulate, float* bpad) {
  constexpr int64_t w = cols_of<V>;
  int64_t j = 0;
  for (; j + w <= n; j += w) tile<V, R>(k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  if (j < n) edge_tile<V, R>(k, n - j, a, lda, b + j, ldb, c + j, ldc, accumulate, bpad);
}

// Column blocks of B stay in cache while every row block of A passes over them.
template <typename V>
[[gnu::always_inline]] inline void gemm_with(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                             const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t kBlockK = 256;
  float bpad_small[kBlockK * kMaxCols];
  for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {
    const int64_t kb = k - p0 < kBlockK ? k - p0 : kBlockK;
    const bool acc = accumulate || p0 > 0;
    const float* ap = a + p0;
    const float* bp = b + p0 * ldb;
    int64_t i = 0;
    for (; i + kRows <= m; i += kRows)
      rows<V, kRows>(n, kb, ap + i * lda, lda, bp, ldb, c + i * ldc, ldc, acc, bpad_small);
    for (; i < m; ++i) rows<V, 1>(n, kb, ap + i * lda, lda, bp, ldb, c + i * ldc, ldc, acc, bpad_small);
  }
  if (k == 0 && !accumulate)
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace

void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate) {
  gemm_with<f32x8>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

TANDEM_SIMD_KERNEL void gemm_native(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                                    int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  gemm_with<f32x16>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void transpose(int64_t rows, int64_t cols, const float* in, int64_t ld_in, float* out) {
  constexpr int64_t kBlock = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlock)
    for (int64_t j0 = 0; j0 < cols; j0 += kBlock)
      for (int64_t i = i0; i < i0 + kBlock && i < rows; ++i)
        for (int64_t j = j0; j < j0 + kBlock && j < cols; ++j) out[j * rows + i] = in[i * ld_in + j];
}

}  // namespace tandem::simd
