// One max-pooling window, as the reference backend and the cuda backend's kernel compute it:
// its largest value and where that is (iy * in_w + ix; the first of equal values wins, -1
// when the window holds only padding). Host and device.
#pragma once

#include <math.h>

#include <cstdint>

#include "core/geometry.h"
#include "core/host_device.h"

namespace tandem {

struct WindowMax {
  float value;
  int32_t at;
};

// The window of output (oy, ox) of image n, channel c, over NHWC `x`.
TANDEM_HOST_DEVICE inline WindowMax max_in_window(const Pool2dGeometry& g, const float* x, int64_t n, int64_t oy,
                                                  int64_t ox, int64_t c) {
  WindowMax best{-INFINITY, -1};
  for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
    const int64_t iy = oy * g.stride_h - g.pad_h + ky;
    if (iy < 0 || iy >= g.in_h) continue;
    for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
      const int64_t ix = ox * g.stride_w - g.pad_w + kx;
      if (ix < 0 || ix >= g.in_w) continue;
      const float v = x[((n * g.in_h + iy) * g.in_w + ix) * g.channels + c];
      if (best.at < 0 || v > best.value) best = {v, static_cast<int32_t>(iy * g.in_w + ix)};
    }
  }
  return best;
}

}  // namespace tandem
