#include "backends/simd/max_pool_2x2.h"

#include "core/vector.h"

namespace tandem::simd {

TANDEM_SIMD_KERNEL
void max_pool_2x2(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, float* y, uint32_t* where) {
  const int64_t oh = h / 2, ow = w / 2, row = w * c;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < oh; ++oy) {
      const float* top = x + (b * h + 2 * oy) * row;
      const float* bottom = top + row;
      float* yo = y + (b * oh + oy) * ow * c;
      uint32_t* wo = where + (b * oh + oy) * ow * c;
      for (int64_t ox = 0; ox < ow; ++ox) {
        const float* __restrict p00 = top + 2 * ox * c;
        const float* __restrict p01 = p00 + c;
        const float* __restrict p10 = bottom + 2 * ox * c;
        const float* __restrict p11 = p10 + c;
        float* __restrict out = yo + ox * c;
        uint32_t* __restrict at = wo + ox * c;
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
          store16u(at + k, i);
        }
        for (; k < c; ++k) {
          // Row order (0,0), (0,1), (1,0), (1,1); strictly greater, so the first maximum stays.
          float m = p00[k];
          uint32_t i = 0;
          i = p01[k] > m ? 2u : i;
          m = p01[k] > m ? p01[k] : m;
          i = p10[k] > m ? 1u : i;
          m = p10[k] > m ? p10[k] : m;
          i = p11[k] > m ? 3u : i;
          m = p11[k] > m ? p11[k] : m;
          out[k] = m;
          at[k] = i;
        }
      }
    }
}

}  // namespace tandem::simd
