#include "backends/simd/winograd_conv2d.h"

#include <algorithm>

#include "backends/simd/column_sums.h"
#include "core/error.h"
#include "core/vector.h"

namespace tandem::simd {
namespace {

constexpr int64_t kChunkTiles = 64;  // V (16 x 64 x Cin) and M (16 x 64 x Cout) stay in L2
constexpr int64_t kRows = 4;         // GEMM rows (tiles) per register block

// U = G g G^T for a 3x3 kernel g (row-major), G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]. T: a
// float, or a vector of 16 kernels' values side by side.
template <typename T>
[[gnu::always_inline]] inline void transform_kernel(const T g[9], T u[16]) {
  T r[4][3];  // G g
  for (int j = 0; j < 3; ++j) {
    r[0][j] = g[j];
    r[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
    r[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
    r[3][j] = g[6 + j];
  }
  for (int a = 0; a < 4; ++a) {
    u[a * 4 + 0] = r[a][0];
    u[a * 4 + 1] = 0.5f * (r[a][0] + r[a][1] + r[a][2]);
    u[a * 4 + 2] = 0.5f * (r[a][0] - r[a][1] + r[a][2]);
    u[a * 4 + 3] = r[a][2];
  }
}

// U of every kernel of w [co][3][3][ci]: forward, U[xi][ci][co]; adjoint, U[xi][co][ci] of the
// kernel flipped (w[co][2-ky][2-kx][ci]). 16 input channels at a time: w's loads and the
// adjoint's stores are contiguous, the forward's stores go 16 to a vector's lanes.
TANDEM_SIMD_KERNEL void transform_kernels(const float* w, int64_t ci, int64_t co, bool adjoint, float* u) {
  for (int64_t o = 0; o < co; ++o)
    for (int64_t i = 0; i < ci; i += 16) {
      f32x16 g[9], v[16];
      for (int tap = 0; tap < 9; ++tap) g[tap] = load16(w + (o * 9 + (adjoint ? 8 - tap : tap)) * ci + i);
      transform_kernel(g, v);
      for (int xi = 0; xi < 16; ++xi) {
        if (adjoint) {
          store16(u + (xi * co + o) * ci + i, v[xi]);
        } else {
          for (int l = 0; l < 16; ++l) u[(xi * ci + i + l) * co + o] = v[xi][l];
        }
      }
    }
}

// V[xi][i][c] = (B^T d B)[xi] for tiles t0 .. t0 + nt, d the 4x4 input patch of the tile's
// 2x2 outputs (zero outside the image), B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
TANDEM_SIMD_KERNEL void transform_input(const float* x, int64_t h, int64_t w, int64_t c, int64_t tiles_h,
                                        int64_t tiles_w, int64_t t0, int64_t nt, float* v) {
  const f32x16 zero = {};
  for (int64_t i = 0; i < nt; ++i) {
    const int64_t t = t0 + i, n = t / (tiles_h * tiles_w), ty = t / tiles_w % tiles_h, tx = t % tiles_w;
    const float* img = x + n * h * w * c;
    for (int64_t c0 = 0; c0 < c; c0 += 16) {
      f32x16 d[4][4];
      for (int a = 0; a < 4; ++a) {
        const int64_t iy = 2 * ty - 1 + a;
        for (int b = 0; b < 4; ++b) {
          const int64_t ix = 2 * tx - 1 + b;
          d[a][b] = iy >= 0 && iy < h && ix >= 0 && ix < w ? load16(img + (iy * w + ix) * c + c0) : zero;
        }
      }
      f32x16 s[4][4];
      for (int b = 0; b < 4; ++b) {
        s[0][b] = d[0][b] - d[2][b];
        s[1][b] = d[1][b] + d[2][b];
        s[2][b] = d[2][b] - d[1][b];
        s[3][b] = d[1][b] - d[3][b];
      }
      for (int a = 0; a < 4; ++a) {
        float* out = v + ((a * 4) * nt + i) * c + c0;
        const int64_t step = nt * c;  // from one xi to the next
        store16(out, s[a][0] - s[a][2]);
        store16(out + step, s[a][1] + s[a][2]);
        store16(out + 2 * step, s[a][2] - s[a][1]);
        store16(out + 3 * step, s[a][1] - s[a][3]);
      }
    }
  }
}

// c[R][16 NV] = a b, a's R x k element (r, p) at a[r * a_row + p * a_step] (a row-major
// matrix, or a transposed one), b [k][16 NV] rows ldb apart, c's rows ldc apart. Accumulate:
// c += a b, the accumulators starting from c.
template <int R, int NV, bool Accumulate>
[[gnu::always_inline]] inline void block(const float* a, int64_t a_row, int64_t a_step, const float* b, int64_t ldb,
                                         int64_t k, float* c, int64_t ldc) {
  f32x16 acc[R][NV] = {};
  if constexpr (Accumulate)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NV; ++j) acc[r][j] = load16(c + r * ldc + 16 * j);
  for (int64_t p = 0; p < k; ++p) {
    f32x16 bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = load16(b + p * ldb + 16 * j);
    for (int r = 0; r < R; ++r) {
      const float av = a[r * a_row + p * a_step];
      for (int j = 0; j < NV; ++j) acc[r][j] += bv[j] * av;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) store16(c + r * ldc + 16 * j, acc[r][j]);
}

template <int R>
[[gnu::always_inline]] inline void rows(const float* a, const float* b, int64_t k, int64_t n, float* c) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) block<R, 4, false>(a, k, 1, b + j, n, k, c + j, n);
  for (; j + 32 <= n; j += 32) block<R, 2, false>(a, k, 1, b + j, n, k, c + j, n);
  for (; j < n; j += 16) block<R, 1, false>(a, k, 1, b + j, n, k, c + j, n);
}

// M[xi] = V[xi] U[xi] for the 16 xi: [nt][in_c] x [in_c][out_c] each.
TANDEM_SIMD_KERNEL void multiply(const float* v, const float* u, int64_t nt, int64_t in_c, int64_t out_c, float* m) {
  for (int xi = 0; xi < 16; ++xi) {
    const float* a = v + xi * nt * in_c;
    const float* b = u + xi * in_c * out_c;
    float* c = m + xi * nt * out_c;
    int64_t i = 0;
    for (; i + kRows <= nt; i += kRows) rows<kRows>(a + i * in_c, b, in_c, out_c, c + i * out_c);
    for (; i < nt; ++i) rows<1>(a + i * in_c, b, in_c, out_c, c + i * out_c);
  }
}

// y's 2x2 outputs of each tile = A^T M A (+ bias), A^T = [1 1 1 0; 0 1 -1 -1].
TANDEM_SIMD_KERNEL void transform_output(const float* m, const float* bias, int64_t h, int64_t w, int64_t c,
                                         int64_t tiles_h, int64_t tiles_w, int64_t t0, int64_t nt, float* y) {
  for (int64_t i = 0; i < nt; ++i) {
    const int64_t t = t0 + i, n = t / (tiles_h * tiles_w), ty = t / tiles_w % tiles_h, tx = t % tiles_w;
    float* img = y + n * h * w * c;
    for (int64_t c0 = 0; c0 < c; c0 += 16) {
      f32x16 p[16];
      for (int xi = 0; xi < 16; ++xi) p[xi] = load16(m + (xi * nt + i) * c + c0);
      f32x16 s[2][4];
      for (int b = 0; b < 4; ++b) {
        s[0][b] = p[b] + p[4 + b] + p[8 + b];
        s[1][b] = p[4 + b] - p[8 + b] - p[12 + b];
      }
      const f32x16 b0 = bias ? load16(bias + c0) : f32x16{};
      for (int a = 0; a < 2; ++a) {
        const int64_t oy = 2 * ty + a;
        if (oy >= h) break;
        store16(img + (oy * w + 2 * tx) * c + c0, s[a][0] + s[a][1] + s[a][2] + b0);
        if (2 * tx + 1 < w) store16(img + (oy * w + 2 * tx + 1) * c + c0, s[a][1] - s[a][2] - s[a][3] + b0);
      }
    }
  }
}

// Z[xi][i][c] = (A dY A^T)[xi] for tiles t0 .. t0 + nt, dY the tile's 2x2 output gradients
// (zero past the image's edge), A = [1 0; 1 1; 1 -1; 0 -1]: the adjoint of transform_output.
TANDEM_SIMD_KERNEL void transform_grad_output(const float* dy, int64_t h, int64_t w, int64_t c, int64_t tiles_h,
                                              int64_t tiles_w, int64_t t0, int64_t nt, float* z) {
  const f32x16 zero = {};
  for (int64_t i = 0; i < nt; ++i) {
    const int64_t t = t0 + i, n = t / (tiles_h * tiles_w), ty = t / tiles_w % tiles_h, tx = t % tiles_w;
    const float* img = dy + n * h * w * c;
    const bool down = 2 * ty + 1 < h, right = 2 * tx + 1 < w;
    for (int64_t c0 = 0; c0 < c; c0 += 16) {
      const float* p = img + (2 * ty * w + 2 * tx) * c + c0;
      const f32x16 y00 = load16(p), y01 = right ? load16(p + c) : zero;
      const f32x16 y10 = down ? load16(p + w * c) : zero, y11 = down && right ? load16(p + (w + 1) * c) : zero;
      // Rows: r[a][j] = (A dY)[a][j].
      const f32x16 r[4][2] = {{y00, y01}, {y00 + y10, y01 + y11}, {y00 - y10, y01 - y11}, {-y10, -y11}};
      const int64_t step = nt * c;  // from one xi to the next
      for (int a = 0; a < 4; ++a) {
        float* out = z + ((a * 4) * nt + i) * c + c0;
        store16(out, r[a][0]);
        store16(out + step, r[a][0] + r[a][1]);
        store16(out + 2 * step, r[a][0] - r[a][1]);
        store16(out + 3 * step, -r[a][1]);
      }
    }
  }
}

// c[rows][16 NV] += a[k][rows]^T b[k][16 NV] (a's rows lda apart) for a run-time row count
// 1..R: input channels by output channels in registers over a chunk's tiles.
template <int NV, int R>
[[gnu::always_inline]] inline void block_at_rows(int rows, const float* a, int64_t lda, const float* b, int64_t ldb,
                                                 int64_t k, float* c, int64_t ldc) {
  if constexpr (R >= 1) {
    if (rows == R) return block<R, NV, true>(a, 1, lda, b, ldb, k, c, ldc);
    block_at_rows<NV, R - 1>(rows, a, lda, b, ldb, k, c, ldc);
  }
}

// dU[xi] += V[xi]^T Z[xi] for the 16 xi: [nt][in_c]^T x [nt][out_c] each, into [in_c][out_c].
// Blocks of 6 rows x 64 channels or 12 x 32 / 16 (24 accumulators, as the direct kernels).
TANDEM_SIMD_KERNEL void multiply_accumulate_at(const float* v, const float* z, int64_t nt, int64_t in_c,
                                               int64_t out_c, float* du) {
  for (int xi = 0; xi < 16; ++xi) {
    const float* a = v + xi * nt * in_c;
    const float* b = z + xi * nt * out_c;
    float* c = du + xi * in_c * out_c;
    for (int64_t j = 0; j < out_c;) {
      const int64_t left = out_c - j;
      const int nv = left >= 64 ? 4 : left >= 32 ? 2 : 1;
      const int64_t rows_per = nv == 4 ? 6 : 12;
      for (int64_t i = 0; i < in_c; i += rows_per) {
        const int rows = static_cast<int>(std::min(rows_per, in_c - i));
        if (nv == 4) block_at_rows<4, 6>(rows, a + i, in_c, b + j, out_c, nt, c + i * out_c + j, out_c);
        else if (nv == 2) block_at_rows<2, 12>(rows, a + i, in_c, b + j, out_c, nt, c + i * out_c + j, out_c);
        else block_at_rows<1, 12>(rows, a + i, in_c, b + j, out_c, nt, c + i * out_c + j, out_c);
      }
      j += 16 * nv;
    }
  }
}

// g = G^T du G for a kernel's 16 products (row-major 4x4 in, 3x3 out): the adjoint of
// transform_kernel. T: a float, or a vector of 16 kernels' values side by side.
template <typename T>
[[gnu::always_inline]] inline void untransform_kernel(const T du[16], T g[9]) {
  T q[3][4];  // G^T du
  for (int b = 0; b < 4; ++b) {
    q[0][b] = du[b] + 0.5f * (du[4 + b] + du[8 + b]);
    q[1][b] = 0.5f * (du[4 + b] - du[8 + b]);
    q[2][b] = 0.5f * (du[4 + b] + du[8 + b]) + du[12 + b];
  }
  for (int a = 0; a < 3; ++a) {
    g[a * 3 + 0] = q[a][0] + 0.5f * (q[a][1] + q[a][2]);
    g[a * 3 + 1] = 0.5f * (q[a][1] - q[a][2]);
    g[a * 3 + 2] = 0.5f * (q[a][1] + q[a][2]) + q[a][3];
  }
}

// dw [co][3][3][ci] from dU [16][ci][co], 16 output channels at a time: dU's loads contiguous,
// dw's stores 16 to a vector's lanes (the 144 lines a block writes stay in L1 over i).
TANDEM_SIMD_KERNEL void untransform_kernels(const float* du, int64_t ci, int64_t co, float* dw) {
  for (int64_t o = 0; o < co; o += 16)
    for (int64_t i = 0; i < ci; ++i) {
      f32x16 u[16], g[9];
      for (int xi = 0; xi < 16; ++xi) u[xi] = load16(du + (xi * ci + i) * co + o);
      untransform_kernel(u, g);
      for (int tap = 0; tap < 9; ++tap)
        for (int l = 0; l < 16; ++l) dw[((o + l) * 9 + tap) * ci + i] = g[tap][l];
    }
}

}  // namespace

bool WinogradConv2d::supports(const Conv2dGeometry& g) {
  return g.groups == 1 && g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 &&
         g.pad_h == 1 && g.pad_w == 1 && g.dilation_h == 1 && g.dilation_w == 1 && g.in_c % 16 == 0 &&
         g.out_c % 16 == 0;
}

WinogradConv2d::WinogradConv2d(const Conv2dGeometry& g) : g_(g) {
  if (!supports(g)) fail("winograd", cat("not a 3x3, stride 1, pad 1 layer with channels in 16s: ", g.str()));
  tiles_h_ = (g.in_h + 1) / 2;
  tiles_w_ = (g.in_w + 1) / 2;
  tiles_ = g.batch * tiles_h_ * tiles_w_;
  add_scratch();
  fwd_.u = aligned_floats(static_cast<std::size_t>(16 * g.in_c * g.out_c));
  bwd_.u = aligned_floats(static_cast<std::size_t>(16 * g.in_c * g.out_c));
}

void WinogradConv2d::add_scratch() {
  const auto floats = static_cast<std::size_t>(16 * kChunkTiles * std::max(g_.in_c, g_.out_c));
  scratch_.push_back({aligned_floats(floats), aligned_floats(floats), nullptr});
}

void WinogradConv2d::set_parallel(int workers, ParallelFor parallel_for) {
  while (static_cast<int>(scratch_.size()) < workers) add_scratch();
  parallel_for_ = std::move(parallel_for);
}

// Chunks write disjoint output tiles and read the input only, so ranges of them run apart.
void WinogradConv2d::run(const float* in, int64_t in_c, const float* u, int64_t out_c, const float* bias, float* out) {
  const int64_t chunks = (tiles_ + kChunkTiles - 1) / kChunkTiles;
  const int64_t ranges = std::min(static_cast<int64_t>(scratch_.size()), chunks);
  const auto range = [&](int64_t r) {
    const Scratch& s = scratch_[static_cast<std::size_t>(r)];
    for (int64_t c = chunks * r / ranges; c < chunks * (r + 1) / ranges; ++c) {
      const int64_t t0 = c * kChunkTiles, nt = std::min(kChunkTiles, tiles_ - t0);
      transform_input(in, g_.in_h, g_.in_w, in_c, tiles_h_, tiles_w_, t0, nt, s.v.get());
      multiply(s.v.get(), u, nt, in_c, out_c, s.m.get());
      transform_output(s.m.get(), bias, g_.in_h, g_.in_w, out_c, tiles_h_, tiles_w_, t0, nt, out);
    }
  };
  run_pieces(parallel_for_, ranges, range);
}

void WinogradConv2d::transform(Transformed& t, const float* w, uint64_t version, bool adjoint) {
  if (t.of == w && t.version == version) return;
  // Forward: U[xi][ci][co] of w[co][ky][kx][ci]. Adjoint: U[xi][co][ci] of the kernel
  // flipped, w[co][2-ky][2-kx][ci] (the same convolution from Cout channels back to Cin).
  transform_kernels(w, g_.in_c, g_.out_c, adjoint, t.u.get());
  t.of = w;
  t.version = version;
}

void WinogradConv2d::forward(const float* x, const float* w, uint64_t version, const float* bias, float* y) {
  transform(fwd_, w, version, /*adjoint=*/false);
  run(x, g_.in_c, fwd_.u.get(), g_.out_c, bias, y);
}

void WinogradConv2d::backward_data(const float* dy, const float* w, uint64_t version, float* dx) {
  transform(bwd_, w, version, /*adjoint=*/true);
  run(dy, g_.out_c, bwd_.u.get(), g_.in_c, nullptr, dx);
}

// Forward is y = A^T [sum over ci of U (.) V] A per tile, so dU = sum over tiles of
// (A dY A^T) (.) V and dw = G^T dU G: 16 products a tile and channel pair where the direct
// weight gradient takes 36. Ranges of chunks sum into their own dU, added up at the end.
void WinogradConv2d::weight_grad(const float* x, const float* dy, float* dw, float* db) {
  const int64_t ci = g_.in_c, co = g_.out_c, chunks = (tiles_ + kChunkTiles - 1) / kChunkTiles;
  const int64_t ranges = std::min(static_cast<int64_t>(scratch_.size()), chunks);
  const auto du_floats = static_cast<std::size_t>(16 * ci * co);
  // Allocated here, not in the ranges: a failed allocation must not unwind through a pool.
  for (int64_t r = 0; r < ranges; ++r)
    if (Scratch& s = scratch_[static_cast<std::size_t>(r)]; !s.du) s.du = aligned_floats(du_floats);
  const auto range = [&](int64_t r) {
    Scratch& s = scratch_[static_cast<std::size_t>(r)];
    std::fill_n(s.du.get(), du_floats, 0.0f);
    for (int64_t c = chunks * r / ranges; c < chunks * (r + 1) / ranges; ++c) {
      const int64_t t0 = c * kChunkTiles, nt = std::min(kChunkTiles, tiles_ - t0);
      transform_input(x, g_.in_h, g_.in_w, ci, tiles_h_, tiles_w_, t0, nt, s.v.get());
      transform_grad_output(dy, g_.in_h, g_.in_w, co, tiles_h_, tiles_w_, t0, nt, s.m.get());
      multiply_accumulate_at(s.v.get(), s.m.get(), nt, ci, co, s.du.get());
    }
  };
  run_pieces(parallel_for_, ranges, range);
  float* du = scratch_[0].du.get();
  for (int64_t r = 1; r < ranges; ++r) {
    const float* other = scratch_[static_cast<std::size_t>(r)].du.get();
    for (std::size_t k = 0; k < du_floats; ++k) du[k] += other[k];
  }
  untransform_kernels(du, ci, co, dw);
  if (db) column_sums(dy, g_.batch * g_.in_h * g_.in_w, co, db);
}

}  // namespace tandem::simd
