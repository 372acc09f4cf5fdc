// The reference backend: portable C++ loops, the oracle every other backend is tested
// against. Builds anywhere core builds (g++, aarch64-linux-gnu-g++, em++).
#pragma once

#include <memory>

#include "core/backend.h"

namespace tandem {

std::unique_ptr<Backend> make_reference_backend(const BackendOptions& options);
// The portable convolution loops (any groups), for backends that lack a pass.
std::unique_ptr<Conv2dKernel> make_reference_conv2d(const Conv2dGeometry& g);
// Batch normalisation's loops (reference_batch_norm.cpp): every CPU backend's kernel.
std::unique_ptr<BatchNormKernel> make_reference_batch_norm(const BatchNormGeometry& g);
// Token pooling's loops (reference_token_pool.cpp): every CPU backend's kernel.
std::unique_ptr<TokenPoolKernel> make_reference_token_pool(const TokenPoolGeometry& g);
std::unique_ptr<MulKernel> make_reference_mul(const MulGeometry& g);
// Dropout's loops (reference_dropout.cpp): every CPU backend's kernel.
std::unique_ptr<DropoutKernel> make_reference_dropout(int64_t elements);
// The activation op's own loops (core/activation.h), for backends without a kernel for it.
std::unique_ptr<ActivationKernel> make_reference_activation(const Activation& kind, int64_t elements);

}  // namespace tandem
