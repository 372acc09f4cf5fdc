// The oneDNN kernels, one factory per op; each kernel creates its primitives and buffers once
// per shape and shares the backend's engine, stream and thread count (Context).
#pragma once

#include <memory>

#include "backends/onednn/onednn_common.h"
#include "core/backend.h"

namespace tandem::onednn {

std::unique_ptr<Conv2dKernel> make_conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g);
std::unique_ptr<LinearKernel> make_linear(std::shared_ptr<const Context> ctx, const LinearGeometry& g);
std::unique_ptr<ReluKernel> make_relu(std::shared_ptr<const Context> ctx, int64_t elements);
std::unique_ptr<MaxPool2dKernel> make_max_pool2d(std::shared_ptr<const Context> ctx, const Pool2dGeometry& g);
std::unique_ptr<AttentionKernel> make_attention(std::shared_ptr<const Context> ctx, const AttentionGeometry& g);
std::unique_ptr<GroupedLinearKernel> make_grouped_linear(std::shared_ptr<const Context> ctx,
                                                         const GroupedLinearGeometry& g);

}  // namespace tandem::onednn
