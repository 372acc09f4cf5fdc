#include "backends/simd/direct_conv2d.h"

#include <algorithm>
#include <cstring>

#include "backends/simd/column_sums.h"
#include "core/error.h"
#include "core/vector.h"

namespace tandem::simd {
namespace {

// Output positions per chunk: its dy rows (chunk x Cout floats) stay in L1 while every
// block of K rows passes over them.
constexpr int64_t kChunk = 64;

struct TileArgs {
  const float* x;          // (padded) input
  const int64_t* pixel;    // per position
  const int64_t* offset;   // per k row of the tile
  const float* dy;         // dy + first column of the tile
  int64_t cout;            // dy row stride and acc row stride
  int64_t m0, m1;          // positions
  float* acc;              // acc + first k row * cout + first column
};

// acc[r][16 v + j] += sum over m of x[pixel[m] + offset[r]] * dy[m][16 v + j], with the
// R x NV accumulators in registers for the whole chunk.
template <int R, int NV>
[[gnu::always_inline]] inline void tile(const TileArgs& t) {
  f32x16 a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) a[r][v] = load16(t.acc + r * t.cout + 16 * v);
  for (int64_t m = t.m0; m < t.m1; ++m) {
    const float* xm = t.x + t.pixel[m];
    const float* d = t.dy + m * t.cout;
    f32x16 dv[NV];
    for (int v = 0; v < NV; ++v) dv[v] = load16(d + 16 * v);
    for (int r = 0; r < R; ++r) {
      const float b = xm[t.offset[r]];
      for (int v = 0; v < NV; ++v) a[r][v] += b * dv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store16(t.acc + r * t.cout + 16 * v, a[r][v]);
}

// tile<rows, NV> for a run-time row count 1..R.
template <int NV, int R>
[[gnu::always_inline]] inline void tile_rows(int rows, const TileArgs& t) {
  if constexpr (R >= 1) {
    if (rows == R) return tile<R, NV>(t);
    tile_rows<NV, R - 1>(rows, t);
  }
}

// Row blocks of 24 / NV accumulator vectors: 6 rows of 64 channels, 12 of 32 or of 16.
template <int NV>
[[gnu::always_inline]] inline void all_rows(TileArgs t, int64_t k, const int64_t* tap_offset, float* acc_col) {
  constexpr int kRows = NV == 4 ? 6 : 12;
  for (int64_t k0 = 0; k0 < k; k0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, k - k0));
    t.offset = tap_offset + k0;
    t.acc = acc_col + k0 * t.cout;
    tile_rows<NV, kRows>(rows, t);
  }
}

TANDEM_SIMD_KERNEL
void accumulate(const float* x, const int64_t* pixel, const int64_t* tap_offset, const float* dy, int64_t m,
                int64_t k, int64_t cout, float* acc) {
  for (int64_t m0 = 0; m0 < m; m0 += kChunk) {
    TileArgs t{x, pixel, nullptr, nullptr, cout, m0, std::min(m, m0 + kChunk), nullptr};
    for (int64_t c0 = 0; c0 < cout;) {
      t.dy = dy + c0;
      const int64_t left = cout - c0;
      if (left >= 64) {
        all_rows<4>(t, k, tap_offset, acc + c0);
        c0 += 64;
      } else if (left >= 32) {
        all_rows<2>(t, k, tap_offset, acc + c0);
        c0 += 32;
      } else {
        all_rows<1>(t, k, tap_offset, acc + c0);
        c0 += 16;
      }
    }
  }
}

// Forward: y[m][16 v + j] = bias + sum over k of x[pixel[m] + offset[k]] * wt[k][16 v + j] for
// R positions x NV vectors of channels, accumulated over all K in registers.
template <int R, int NV>
[[gnu::always_inline]] inline void forward_tile(const float* x, const int64_t* pixel, const int64_t* offset, int64_t k,
                                                const float* wt, const float* bias, int64_t cout, float* y) {
  f32x16 a[R][NV];
  for (int v = 0; v < NV; ++v) {
    const f32x16 b = bias ? load16(bias + 16 * v) : f32x16{};
    for (int r = 0; r < R; ++r) a[r][v] = b;
  }
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x + pixel[r];
  for (int64_t kk = 0; kk < k; ++kk) {
    f32x16 w[NV];
    for (int v = 0; v < NV; ++v) w[v] = load16(wt + kk * cout + 16 * v);
    const int64_t o = offset[kk];
    for (int r = 0; r < R; ++r) {
      const float b = xr[r][o];
      for (int v = 0; v < NV; ++v) a[r][v] += b * w[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store16(y + r * cout + 16 * v, a[r][v]);
}

template <int NV, int R>
[[gnu::always_inline]] inline void forward_rows(int rows, const float* x, const int64_t* pixel, const int64_t* offset,
                                                int64_t k, const float* wt, const float* bias, int64_t cout, float* y) {
  if constexpr (R >= 1) {
    if (rows == R) return forward_tile<R, NV>(x, pixel, offset, k, wt, bias, cout, y);
    forward_rows<NV, R - 1>(rows, x, pixel, offset, k, wt, bias, cout, y);
  }
}

template <int NV>
[[gnu::always_inline]] inline void forward_columns(const float* x, const int64_t* pixel, const int64_t* offset,
                                                   int64_t m, int64_t k, const float* wt, const float* bias,
                                                   int64_t cout, float* y) {
  constexpr int kRows = NV == 4 ? 6 : 12;
  for (int64_t m0 = 0; m0 < m; m0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, m - m0));
    forward_rows<NV, kRows>(rows, x, pixel + m0, offset, k, wt, bias, cout, y + m0 * cout);
  }
}

TANDEM_SIMD_KERNEL
void convolve(const float* x, const int64_t* pixel, const int64_t* offset, int64_t m, int64_t k, const float* wt,
              const float* bias, int64_t cout, float* y) {
  for (int64_t c0 = 0; c0 < cout;) {
    const int64_t left = cout - c0;
    const float* b = bias ? bias + c0 : nullptr;
    if (left >= 64) {
      forward_columns<4>(x, pixel, offset, m, k, wt + c0, b, cout, y + c0);
      c0 += 64;
    } else if (left >= 32) {
      forward_columns<2>(x, pixel, offset, m, k, wt + c0, b, cout, y + c0);
      c0 += 32;
    } else {
      forward_columns<1>(x, pixel, offset, m, k, wt + c0, b, cout, y + c0);
      c0 += 16;
    }
  }
}

}  // namespace

DirectConv2d::DirectConv2d(const Conv2dGeometry& g) : g_(g) {
  if (!supports(g)) fail("simd", cat("direct conv2d needs out_c % 16 == 0: ", g.str()));
  const int64_t oh = g.out_h(), ow = g.out_w();
  padded_ = g.pad_h > 0 || g.pad_w > 0;
  hp_ = g.in_h + 2 * g.pad_h;
  wp_ = g.in_w + 2 * g.pad_w;
  k_ = g.kernel_h * g.kernel_w * g.in_c;
  m_ = g.batch * oh * ow;
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox)
        pixel_.push_back(((n * hp_ + oy * g.stride_h) * wp_ + ox * g.stride_w) * g.in_c);
  for (int64_t ky = 0; ky < g.kernel_h; ++ky)
    for (int64_t kx = 0; kx < g.kernel_w; ++kx)
      for (int64_t ci = 0; ci < g.in_c; ++ci)
        tap_offset_.push_back((ky * g.dilation_h * wp_ + kx * g.dilation_w) * g.in_c + ci);
  if (padded_) {
    const auto count = static_cast<std::size_t>(g.batch * hp_ * wp_ * g.in_c);
    xpad_ = aligned_floats(count);
    std::fill_n(xpad_.get(), count, 0.0f);  // the border stays zero; run() fills the inside
  }
  acc_ = aligned_floats(static_cast<std::size_t>(k_ * g.out_c));
  wt_ = aligned_floats(static_cast<std::size_t>(k_ * g.out_c));
}

const float* DirectConv2d::padded(const float* x) {
  const Conv2dGeometry& g = g_;
  if (!padded_) return x;
  const int64_t row = g.in_w * g.in_c;
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t iy = 0; iy < g.in_h; ++iy)
      std::memcpy(xpad_.get() + ((n * hp_ + iy + g.pad_h) * wp_ + g.pad_w) * g.in_c, x + (n * g.in_h + iy) * row,
                  static_cast<std::size_t>(row) * sizeof(float));
  return xpad_.get();
}

void DirectConv2d::forward(const float* x, const float* w, uint64_t version, const float* bias, float* y) {
  const Conv2dGeometry& g = g_;
  float* wt = wt_.get();
  if (w != wt_of_ || version != wt_version_) {
    for (int64_t co = 0; co < g.out_c; ++co)
      for (int64_t k = 0; k < k_; ++k) wt[k * g.out_c + co] = w[co * k_ + k];
    wt_of_ = w;
    wt_version_ = version;
  }
  convolve(padded(x), pixel_.data(), tap_offset_.data(), m_, k_, wt, g.bias ? bias : nullptr, g.out_c, y);
}

void DirectConv2d::weight_grad(const float* x, const float* dy, float* dw, float* db) {
  const Conv2dGeometry& g = g_;
  const float* src = padded(x);
  float* acc = acc_.get();
  std::fill_n(acc, k_ * g.out_c, 0.0f);
  // Ranges of K rows in whole row blocks (12: 6 rows of 64 channels, 12 of 32 or 16).
  constexpr int64_t kBlock = 12;
  const int64_t blocks = (k_ + kBlock - 1) / kBlock;
  const int64_t ranges = std::min<int64_t>(parallel_for_ ? workers_ : 1, blocks);
  run_pieces(parallel_for_, ranges, [&](int64_t r) {
    const int64_t k0 = blocks * r / ranges * kBlock, k1 = std::min(k_, blocks * (r + 1) / ranges * kBlock);
    accumulate(src, pixel_.data(), tap_offset_.data() + k0, dy, m_, k1 - k0, g.out_c, acc + k0 * g.out_c);
  });
  for (int64_t co = 0; co < g.out_c; ++co)
    for (int64_t k = 0; k < k_; ++k) dw[co * k_ + k] = acc[k * g.out_c + co];
  if (db) column_sums(dy, m_, g.out_c, db);
}

}  // namespace tandem::simd
