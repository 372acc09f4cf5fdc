// The cuda backend's convolution: cuDNN's convolution forward, backward data and backward
// filter on NHWC tensors and OHWI filters (tandem's layouts), grouped and depthwise too.
#pragma once

#include <memory>

#include "backends/cuda/cuda_context.h"
#include "core/backend.h"

namespace tandem::cuda {

std::unique_ptr<Conv2dKernel> make_conv2d(std::shared_ptr<Context> ctx, const Conv2dGeometry& g);

}  // namespace tandem::cuda
