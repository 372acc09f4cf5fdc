// Batch normalisation on the device (cuda_batch_norm.h). A channel's sums run over every row,
// so one block a channel would leave most of the GPU idle (ResNet's 128 channels: 4 blocks).
// Instead a grid of (32 channels) x (a chunk of rows) blocks writes partial sums in double, one
// thread a channel combines them in chunk order (the same sums every run, unlike atomics), and
// an elementwise pass applies the result. Double sums make the one-pass variance
// E[x^2] - E[x]^2 safe for float data (the reference takes two passes in double).
#include "backends/cuda/cuda_batch_norm.h"

#include <algorithm>

namespace tandem::cuda {
namespace {

constexpr int kChannels = 32;  // a block's channels: one warp's coalesced read of a row
constexpr int kLanes = 8;      // a block's row lanes
constexpr int64_t kChunkRows = 64, kMaxChunks = 512;
constexpr int kThreads = 256;

int64_t chunks_for(int64_t rows) { return std::clamp<int64_t>((rows + kChunkRows - 1) / kChunkRows, 1, kMaxChunks); }
unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 1 << 20)); }

// The block's 8 lanes' values for its thread's channel, summed in lane order.
__device__ double lanes_sum(double v, double (*shared)[kChannels]) {
  shared[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  double total = 0.0;
  for (int l = 0; l < kLanes; ++l) total += shared[l][threadIdx.x];
  __syncthreads();
  return total;
}

// partials[chunk][0][k], [1][k]: the chunk's sums of x and x^2 (forward), or of dy and
// dy * xhat (backward: mean and inv_std given).
template <bool Backward>
__global__ void partial_sums_kernel(const float* x, const float* dy, const float* mean, const float* inv_std,
                                    double* partials, int64_t rows, int64_t c, int64_t chunk_rows) {
  __shared__ double shared[kLanes][kChannels];
  const int64_t k = blockIdx.x * static_cast<int64_t>(kChannels) + threadIdx.x, chunk = blockIdx.y;
  const int64_t first = chunk * chunk_rows, last = first + chunk_rows < rows ? first + chunk_rows : rows;
  double a = 0.0, b = 0.0;
  if (k < c) {
    const float m = Backward ? mean[k] : 0.0f, s = Backward ? inv_std[k] : 0.0f;
    for (int64_t r = first + threadIdx.y; r < last; r += kLanes) {
      const float v = x[r * c + k];
      if (Backward) {
        const double xhat = (v - m) * s, g = dy[r * c + k];
        a += g;
        b += g * xhat;
      } else {
        a += v;
        b += static_cast<double>(v) * v;
      }
    }
  }
  a = lanes_sum(a, shared);
  b = lanes_sum(b, shared);
  if (k < c && threadIdx.y == 0) {
    partials[(chunk * 2) * c + k] = a;
    partials[(chunk * 2 + 1) * c + k] = b;
  }
}

// Channel k's two sums over every chunk, in chunk order.
__device__ void combine(const double* partials, int64_t chunks, int64_t c, int64_t k, double& a, double& b) {
  a = b = 0.0;
  for (int64_t i = 0; i < chunks; ++i) {
    a += partials[(i * 2) * c + k];
    b += partials[(i * 2 + 1) * c + k];
  }
}

__global__ void statistics_kernel(const double* partials, int64_t chunks, float* mean, float* var, float* inv_std,
                                  int64_t rows, int64_t c, float eps) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= c) return;
  double s, ss;
  combine(partials, chunks, c, k, s, ss);
  const double n = static_cast<double>(rows), m = s / n, v = fmax(ss / n - m * m, 0.0);
  mean[k] = static_cast<float>(m);
  var[k] = static_cast<float>(v);
  inv_std[k] = static_cast<float>(1.0 / sqrt(v + eps));
}

// dgamma, dbeta; the double sums kept in `sums` [2][c] for dx.
__global__ void gradient_sums_kernel(const double* partials, int64_t chunks, double* sums, float* dgamma, float* dbeta,
                                     int64_t c) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= c) return;
  double sdy, sdyx;
  combine(partials, chunks, c, k, sdy, sdyx);
  sums[k] = sdy;
  sums[c + k] = sdyx;
  dgamma[k] = static_cast<float>(sdyx);
  dbeta[k] = static_cast<float>(sdy);
}

__global__ void normalize_kernel(const float* x, const float* mean, const float* inv_std, const float* gamma,
                                 const float* beta, float* y, int64_t n, int64_t c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t k = i % c;
    y[i] = (x[i] - mean[k]) * inv_std[k] * gamma[k] + beta[k];
  }
}

__global__ void input_gradient_kernel(const float* x, const float* dy, const float* gamma, const float* mean,
                                      const float* inv_std, const double* sums, bool training, float* dx, int64_t rows,
                                      int64_t c) {
  const double n = static_cast<double>(rows);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * c;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t k = i % c;
    const double xhat = (x[i] - mean[k]) * inv_std[k];
    const double v = training ? (n * dy[i] - sums[k] - xhat * sums[c + k]) / n : dy[i];
    dx[i] = static_cast<float>(gamma[k] * inv_std[k] * v);
  }
}

dim3 partial_grid(int64_t rows, int64_t c) {
  return dim3(static_cast<unsigned>((c + kChannels - 1) / kChannels), static_cast<unsigned>(chunks_for(rows)));
}
int64_t chunk_rows(int64_t rows) { return (rows + chunks_for(rows) - 1) / chunks_for(rows); }
unsigned channel_blocks(int64_t c) { return static_cast<unsigned>((c + kThreads - 1) / kThreads); }

}  // namespace

std::size_t batch_norm_partials(int64_t rows, int64_t channels) {
  return static_cast<std::size_t>((chunks_for(rows) * 2 + 2) * channels);
}

cudaError_t batch_norm_statistics(const float* x, double* partials, float* mean, float* var, float* inv_std,
                                  int64_t rows, int64_t channels, float eps, cudaStream_t s) {
  if (rows == 0 || channels == 0) return cudaSuccess;
  partial_sums_kernel<false><<<partial_grid(rows, channels), dim3(kChannels, kLanes), 0, s>>>(
      x, nullptr, nullptr, nullptr, partials, rows, channels, chunk_rows(rows));
  statistics_kernel<<<channel_blocks(channels), kThreads, 0, s>>>(partials, chunks_for(rows), mean, var, inv_std, rows,
                                                                  channels, eps);
  return cudaGetLastError();
}

cudaError_t batch_norm_normalize(const float* x, const float* mean, const float* inv_std, const float* gamma,
                                 const float* beta, float* y, int64_t rows, int64_t channels, cudaStream_t s) {
  if (rows == 0 || channels == 0) return cudaSuccess;
  normalize_kernel<<<blocks_for(rows * channels), kThreads, 0, s>>>(x, mean, inv_std, gamma, beta, y, rows * channels,
                                                                    channels);
  return cudaGetLastError();
}

cudaError_t batch_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                                const float* inv_std, bool training, double* partials, float* dx, float* dgamma,
                                float* dbeta, int64_t rows, int64_t channels, cudaStream_t s) {
  if (rows == 0 || channels == 0) return cudaSuccess;
  const int64_t chunks = chunks_for(rows);
  double* sums = partials + chunks * 2 * channels;
  partial_sums_kernel<true><<<partial_grid(rows, channels), dim3(kChannels, kLanes), 0, s>>>(
      x, dy, mean, inv_std, partials, rows, channels, chunk_rows(rows));
  gradient_sums_kernel<<<channel_blocks(channels), kThreads, 0, s>>>(partials, chunks, sums, dgamma, dbeta, channels);
  if (dx)
    input_gradient_kernel<<<blocks_for(rows * channels), kThreads, 0, s>>>(x, dy, gamma, mean, inv_std, sums, training,
                                                                           dx, rows, channels);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
