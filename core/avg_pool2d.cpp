#include "core/avg_pool2d.h"

#include <algorithm>

namespace tandem {
namespace {

// Visits every (output position, input position inside its window) pair of one image.
template <typename Visit>
void for_each_window(const Pool2dGeometry& g, Visit&& visit) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  for (int64_t oy = 0; oy < oh; ++oy)
    for (int64_t ox = 0; ox < ow; ++ox) {
      const int64_t y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
      for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y0 + g.kernel_h, g.in_h); ++iy)
        for (int64_t ix = std::max<int64_t>(x0, 0); ix < std::min(x0 + g.kernel_w, g.in_w); ++ix)
          visit(oy * ow + ox, iy * g.in_w + ix);
    }
}

}  // namespace

void avg_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y) {
  const int64_t c = g.channels, in_plane = g.in_h * g.in_w, out_plane = g.out_h() * g.out_w();
  const float inv = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
  std::fill(y, y + g.batch * out_plane * c, 0.0f);
  for (int64_t n = 0; n < g.batch; ++n) {
    const float* xn = x + n * in_plane * c;
    float* yn = y + n * out_plane * c;
    for_each_window(g, [&](int64_t o, int64_t i) {
      float* __restrict d = yn + o * c;
      const float* __restrict s = xn + i * c;
      for (int64_t k = 0; k < c; ++k) d[k] += s[k];
    });
    for (int64_t i = 0; i < out_plane * c; ++i) yn[i] *= inv;
  }
}

void avg_pool2d_backward(const Pool2dGeometry& g, const float* dy, float* dx) {
  const int64_t c = g.channels, in_plane = g.in_h * g.in_w, out_plane = g.out_h() * g.out_w();
  const float inv = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
  std::fill(dx, dx + g.batch * in_plane * c, 0.0f);
  for (int64_t n = 0; n < g.batch; ++n) {
    const float* dyn = dy + n * out_plane * c;
    float* dxn = dx + n * in_plane * c;
    for_each_window(g, [&](int64_t o, int64_t i) {
      float* __restrict d = dxn + i * c;
      const float* __restrict s = dyn + o * c;
      for (int64_t k = 0; k < c; ++k) d[k] += s[k] * inv;
    });
  }
}

}  // namespace tandem
