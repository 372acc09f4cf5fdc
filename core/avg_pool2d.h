// Average pooling over NHWC windows as torch.nn.AvgPool2d's default (count_include_pad: a
// window always divides by kernel_h * kernel_w, padded positions counting as zeros): the
// portable loops the reference backend runs and other backends use where they have none.
#pragma once

#include "core/geometry.h"

namespace tandem {

void avg_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y);
// dx[N, H, W, C] (overwritten) from dy[N, OH, OW, C].
void avg_pool2d_backward(const Pool2dGeometry& g, const float* dy, float* dx);

}  // namespace tandem
