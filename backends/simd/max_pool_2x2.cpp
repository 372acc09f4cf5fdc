#include "backends/simd/max_pool_2x2.h"

#include "core/vector.h"

namespace tandem::simd {
namespace {

using u8x16 = uint8_t __attribute__((vector_size(16), aligned(1)));

[[gnu::always_inline]] inline void store_bytes(uint8_t* p, u32x16 v) {
  const u8x16 b = __builtin_convertvector(v, u8x16);
  std::memcpy(p, &b, sizeof b);
}

[[gnu::always_inline]] inline i32x16 load_bytes(const uint8_t* p) {
  u8x16 b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, i32x16);
}

}  // namespace

TANDEM_SIMD_KERNEL
void max_pool_2x2(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, float* y, uint8_t* where) {
  const int64_t oh = h / 2, ow = w / 2, row = w * c;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < oh; ++oy) {
      const float* top = x + (b * h + 2 * oy) * row;
      const float* bottom = top + row;
      float* yo = y + (b * oh + oy) * ow * c;
      uint8_t* wo = where + (b * oh + oy) * ow * c;
      for (int64_t ox = 0; ox < ow; ++ox) {
        const float* __restrict p00 = top + 2 * ox * c;
        const float* __restrict p01 = p00 + c;
        const float* __restrict p10 = bottom + 2 * ox * c;
        const float* __restrict p11 = p10 + c;
        float* __restrict out = yo + ox * c;
        uint8_t* __restrict at = wo + ox * c;
        int64_t k = 0;
        for (; k + 16 <= c; k += 16) {
          const f32x16 a = load16(p00 + k), b = load16(p01 + k), d = load16(p10 + k), e = load16(p11 + k);
          f32x16 m = a;
          u32x16 i = u32x16{} + 0u;
          i32x16 gt = b > m;
          i = gt ? u32x16{} + 2u : i;
          m = gt ? b : m;
          gt = d > m;
          i = gt ? u32x16{} + 1u : i;
          m = gt ? d : m;
          gt = e > m;
          i = gt ? u32x16{} + 3u : i;
          m = gt ? e : m;
          store16(out + k, m);
          store_bytes(at + k, i);
        }
        for (; k < c; ++k) {
          // Row order (0,0), (0,1), (1,0), (1,1); strictly greater, so the first maximum stays.
          float m = p00[k];
          uint8_t i = 0;
          i = p01[k] > m ? 2 : i;
          m = p01[k] > m ? p01[k] : m;
          i = p10[k] > m ? 1 : i;
          m = p10[k] > m ? p10[k] : m;
          i = p11[k] > m ? 3 : i;
          m = p11[k] > m ? p11[k] : m;
          out[k] = m;
          at[k] = i;
        }
      }
    }
}

TANDEM_SIMD_KERNEL
void max_unpool_2x2(const float* dy, const uint8_t* where, int64_t n, int64_t h, int64_t w, int64_t c, float* dx) {
  const int64_t oh = h / 2, ow = w / 2, row = w * c;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < oh; ++oy) {
      float* top = dx + (b * h + 2 * oy) * row;
      float* bottom = top + row;
      const float* d_row = dy + (b * oh + oy) * ow * c;
      const uint8_t* w_row = where + (b * oh + oy) * ow * c;
      for (int64_t ox = 0; ox < ow; ++ox) {
        float* __restrict q00 = top + 2 * ox * c;
        float* __restrict q01 = q00 + c;
        float* __restrict q10 = bottom + 2 * ox * c;
        float* __restrict q11 = q10 + c;
        const float* __restrict d = d_row + ox * c;
        const uint8_t* __restrict at = w_row + ox * c;
        int64_t k = 0;
        for (; k + 16 <= c; k += 16) {
          const f32x16 g = load16(d + k), zero = {};
          const i32x16 i = load_bytes(at + k);
          store16(q00 + k, select16(i == 0, g, zero));
          store16(q10 + k, select16(i == 1, g, zero));
          store16(q01 + k, select16(i == 2, g, zero));
          store16(q11 + k, select16(i == 3, g, zero));
        }
        for (; k < c; ++k) {
          q00[k] = at[k] == 0 ? d[k] : 0.0f;
          q10[k] = at[k] == 1 ? d[k] : 0.0f;
          q01[k] = at[k] == 2 ? d[k] : 0.0f;
          q11[k] = at[k] == 3 ? d[k] : 0.0f;
        }
      }
    }
}

}  // namespace tandem::simd
