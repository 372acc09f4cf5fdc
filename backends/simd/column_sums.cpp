#include "backends/simd/column_sums.h"

#include "core/vector.h"

namespace tandem::simd {

TANDEM_SIMD_KERNEL
void column_sums(const float* x, int64_t rows, int64_t cols, float* out) {
  int64_t c = 0;
  // Four vectors of columns held in registers over all the rows (a conv's 64 channels at once).
  for (; c + 64 <= cols; c += 64) {
    f32x16 a = {}, b = {}, d = {}, e = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = x + r * cols + c;
      a += load16(p);
      b += load16(p + 16);
      d += load16(p + 32);
      e += load16(p + 48);
    }
    store16(out + c, a);
    store16(out + c + 16, b);
    store16(out + c + 32, d);
    store16(out + c + 48, e);
  }
  for (; c + 16 <= cols; c += 16) {
    f32x16 a = {};
    for (int64_t r = 0; r < rows; ++r) a += load16(x + r * cols + c);
    store16(out + c, a);
  }
  for (; c < cols; ++c) {
    float s = 0.0f;
    for (int64_t r = 0; r < rows; ++r) s += x[r * cols + c];
    out[c] = s;
  }
}

}  // namespace tandem::simd
