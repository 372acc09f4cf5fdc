// The cuda backend's passes over parameters and gradients (VectorKernel, core/backend.h) as
// device kernels: elementwise updates, and a squared norm summed in double in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/vector_kernel.h"

namespace tandem::cuda {

// VectorKernel::permute on device memory (rank at most 8).
cudaError_t permute(float* to, const float* from, const int64_t* dims, const int* perm, int rank, cudaStream_t s);
// VectorKernel::sum_rows (a thread a row, in double) and spread_rows on device memory.
cudaError_t sum_rows(float* to, const float* from, int64_t rows, int64_t width, float scale, cudaStream_t s);
cudaError_t spread_rows(float* to, const float* from, int64_t rows, int64_t width, float scale, cudaStream_t s);
// VectorKernel::elementwise on device memory (a thread an output element).
cudaError_t elementwise(Elementwise op, float* to, const float* x0, const float* x1, const float* x2, const Broadcast& b,
                        cudaStream_t s);
// VectorKernel::matmul on device memory (a thread an element of C).
cudaError_t matmul(float* c, const float* a, const float* b, const Matmul& m, cudaStream_t s);
// VectorKernel::extreme_rows and route_rows on device memory (a thread a row).
cudaError_t extreme_rows(float* to, const float* from, int64_t rows, int64_t width, bool max, cudaStream_t s);
cudaError_t route_rows(float* to, const float* x, const float* y, const float* dy, int64_t rows, int64_t width, cudaStream_t s);
cudaError_t accumulate(float* acc, const float* add, int64_t n, cudaStream_t s);
cudaError_t scale(float* x, double factor, int64_t n, cudaStream_t s);
// How many doubles of device scratch squared_norm takes (its blocks' partial sums and the total).
std::size_t squared_norm_scratch();
// The sum of x[i]^2 in double into scratch[squared_norm_scratch() - 1]; the same order every
// run for a given n.
cudaError_t squared_norm(const float* x, int64_t n, double* scratch, cudaStream_t s);
cudaError_t sgd(const SgdUpdate& u, float* w, const float* g, float* momentum, int64_t n, cudaStream_t s);
cudaError_t adam(const AdamUpdate& u, float* w, const float* g, float* m, float* v, int64_t n, cudaStream_t s);

}  // namespace tandem::cuda
