// The cuda backend's batch normalisation kernels (BatchNormKernel's contract, core/backend.h)
// on [rows, channels]: per-channel sums in double over blocks of rows, combined in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::cuda {

// How many doubles of device scratch (`partials`) the calls below take for this shape.
std::size_t batch_norm_partials(int64_t rows, int64_t channels);

// Training's statistics: each channel's mean, biased variance and inv_std = 1/sqrt(var + eps).
cudaError_t batch_norm_statistics(const float* x, double* partials, float* mean, float* var, float* inv_std,
                                  int64_t rows, int64_t channels, float eps, cudaStream_t s);
// y = (x - mean) * inv_std * gamma + beta per channel.
cudaError_t batch_norm_normalize(const float* x, const float* mean, const float* inv_std, const float* gamma,
                                 const float* beta, float* y, int64_t rows, int64_t channels, cudaStream_t s);
// dgamma, dbeta and (when not null) dx, as the reference backend's.
cudaError_t batch_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                                const float* inv_std, bool training, double* partials, float* dx, float* dgamma,
                                float* dbeta, int64_t rows, int64_t channels, cudaStream_t s);

}  // namespace tandem::cuda
