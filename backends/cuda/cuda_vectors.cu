// Device kernels of the cuda backend's VectorKernel (cuda_vectors.h). The updates follow the
// host loops' formulas (core/host_vectors.cpp) element for element; nvcc may fuse a multiply
// and an add, so results can differ from the host's in the last bit.
#include "backends/cuda/cuda_vectors.h"

#include <algorithm>

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;    // per block; a power of two (the norm's tree sum)
constexpr int kNormBlocks = 256;  // the norm's partial sums at most

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 1 << 20)); }

#define TANDEM_EACH(i, n)                                                                                   \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

struct Permutation {
  int rank;
  int64_t out_dims[8], stride[8];  // the output's dimensions; each one's step in the input
};

// One thread an output element: its index taken apart along the output's axes.
__global__ void permute_kernel(float* to, const float* from, Permutation p, int64_t n) {
  TANDEM_EACH(i, n) {
    int64_t rest = i, src = 0;
    for (int a = p.rank - 1; a >= 0; --a) {
      src += (rest % p.out_dims[a]) * p.stride[a];
      rest /= p.out_dims[a];
    }
    to[i] = from[src];
  }
}

__global__ void sum_rows_kernel(float* to, const float* from, int64_t rows, int64_t width, float scale) {
  TANDEM_EACH(r, rows) {
    double sum = 0.0;
    for (int64_t j = 0; j < width; ++j) sum += from[r * width + j];
    to[r] = static_cast<float>(sum * scale);
  }
}

__global__ void spread_rows_kernel(float* to, const float* from, int64_t rows, int64_t width, float scale) {
  TANDEM_EACH(i, rows * width) to[i] = from[i / width] * scale;
}

__device__ float apply(Elementwise op, float a, float b, float c) {
  switch (op) {
    case Elementwise::add: return a + b;
    case Elementwise::sub: return a - b;
    case Elementwise::mul: return a * b;
    case Elementwise::div: return a / b;
    case Elementwise::div_right: return -a * b / (c * c);
    case Elementwise::select: return a != 0.0f ? b : c;
    case Elementwise::equal: return a == b ? 1.0f : 0.0f;
    case Elementwise::not_equal: return a != b ? 1.0f : 0.0f;
    case Elementwise::less: return a < b ? 1.0f : 0.0f;
    case Elementwise::greater: return a > b ? 1.0f : 0.0f;
    case Elementwise::less_equal: return a <= b ? 1.0f : 0.0f;
    case Elementwise::greater_equal: return a >= b ? 1.0f : 0.0f;
  }
  return 0.0f;
}

// One thread an output element: its index taken apart along the output's axes, each operand
// read at its own strides.
__global__ void elementwise_kernel(Elementwise op, float* to, const float* x0, const float* x1, const float* x2,
                                   Broadcast b, int64_t n) {
  TANDEM_EACH(i, n) {
    int64_t rest = i, o0 = 0, o1 = 0, o2 = 0;
    for (int a = b.rank - 1; a >= 0; --a) {
      const int64_t at = rest % b.dims[a];
      rest /= b.dims[a];
      o0 += at * b.strides[0][a], o1 += at * b.strides[1][a], o2 += at * b.strides[2][a];
    }
    to[i] = apply(op, x0 ? x0[o0] : 0.0f, x1 ? x1[o1] : 0.0f, x2 ? x2[o2] : 0.0f);
  }
}

// One thread an element of C: its product's operands found from its batch index, then a dot
// product in k's order (a plain kernel: the general matmul only runs where no fused op does).
__global__ void matmul_kernel(float* c, const float* a, const float* b, Matmul m, int64_t n) {
  TANDEM_EACH(e, n) {
    const int64_t j = e % m.n, i = (e / m.n) % m.m;
    int64_t rest = e / (m.m * m.n), ao = 0, bo = 0;
    for (int x = m.rank - 1; x >= 0; --x) {
      const int64_t at = rest % m.dims[x];
      rest /= m.dims[x];
      ao += at * m.a_steps[x], bo += at * m.b_steps[x];
    }
    float sum = 0.0f;
    for (int64_t l = 0; l < m.k; ++l) sum += a[ao + i * m.a_row + l * m.a_col] * b[bo + l * m.b_row + j * m.b_col];
    c[e] = sum;
  }
}

// A thread a row (as sum_rows): its maximum or minimum, NaN where the row holds one.
__global__ void extreme_rows_kernel(float* to, const float* from, int64_t rows, int64_t width, bool max) {
  TANDEM_EACH(r, rows) {
    const float* row = from + r * width;
    float best = row[0];
    for (int64_t j = 1; j < width && !isnan(best); ++j)
      if (isnan(row[j]) || (max ? row[j] > best : row[j] < best)) best = row[j];
    to[r] = best;
  }
}

__global__ void route_rows_kernel(float* to, const float* x, const float* y, const float* dy, int64_t rows, int64_t width) {
  TANDEM_EACH(r, rows) {
    const float* row = x + r * width;
    float* out = to + r * width;
    bool routed = false;
    for (int64_t j = 0; j < width; ++j) {
      const bool here = !routed && (row[j] == y[r] || (isnan(y[r]) && isnan(row[j])));
      out[j] = here ? dy[r] : 0.0f;
      routed = routed || here;
    }
  }
}

__global__ void accumulate_kernel(float* acc, const float* add, int64_t n) {
  TANDEM_EACH(i, n) acc[i] += add[i];
}

__global__ void scale_kernel(float* x, double factor, int64_t n) {
  TANDEM_EACH(i, n) x[i] = static_cast<float>(x[i] * factor);
}

// Each block's sum of squares, by a tree over its threads (a fixed order), into partials.
__global__ void squared_partials_kernel(const float* x, int64_t n, double* partials) {
  __shared__ double lane[kThreads];
  double sum = 0.0;
  TANDEM_EACH(i, n) sum += static_cast<double>(x[i]) * x[i];
  lane[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] += lane[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = lane[0];
}

__global__ void sum_partials_kernel(const double* partials, int count, double* total) {
  double sum = 0.0;
  for (int b = 0; b < count; ++b) sum += partials[b];
  *total = sum;
}

__global__ void sgd_kernel(SgdUpdate u, float* w, const float* g, float* buf, int64_t n) {
  TANDEM_EACH(i, n) {
    const float d = g[i] + u.weight_decay * w[i];
    if (!buf) {
      w[i] -= u.lr * d;
      continue;
    }
    const float b = u.first ? d : u.momentum * buf[i] + (1.0f - u.dampening) * d;
    buf[i] = b;
    w[i] -= u.lr * (u.nesterov ? d + u.momentum * b : b);
  }
}

__global__ void adam_kernel(AdamUpdate u, float* w, const float* g, float* m, float* v, int64_t n) {
  TANDEM_EACH(i, n) {
    float wi = w[i];
    if (u.decoupled) wi *= u.shrink;
    const float d = u.decoupled ? g[i] : g[i] + u.weight_decay * wi;
    const float mi = u.beta1 * m[i] + (1.0f - u.beta1) * d;
    const float vi = u.beta2 * v[i] + (1.0f - u.beta2) * d * d;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - u.step_size * mi / (sqrtf(vi) / u.root_c2 + u.eps);
  }
}

#undef TANDEM_EACH

}  // namespace

cudaError_t permute(float* to, const float* from, const int64_t* dims, const int* perm, int rank, cudaStream_t s) {
  if (rank < 1 || rank > 8) return cudaErrorInvalidValue;
  Permutation p{rank, {}, {}};
  int64_t in_stride[8] = {}, step = 1, n = 1;
  for (int i = rank - 1; i >= 0; --i) in_stride[i] = step, step *= dims[i];
  for (int i = 0; i < rank; ++i) p.out_dims[i] = dims[perm[i]], p.stride[i] = in_stride[perm[i]], n *= p.out_dims[i];
  if (n == 0) return cudaSuccess;
  permute_kernel<<<blocks_for(n), kThreads, 0, s>>>(to, from, p, n);
  return cudaGetLastError();
}

cudaError_t sum_rows(float* to, const float* from, int64_t rows, int64_t width, float scale, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  sum_rows_kernel<<<blocks_for(rows), kThreads, 0, s>>>(to, from, rows, width, scale);
  return cudaGetLastError();
}

cudaError_t spread_rows(float* to, const float* from, int64_t rows, int64_t width, float scale, cudaStream_t s) {
  if (rows == 0 || width == 0) return cudaSuccess;
  spread_rows_kernel<<<blocks_for(rows * width), kThreads, 0, s>>>(to, from, rows, width, scale);
  return cudaGetLastError();
}

cudaError_t elementwise(Elementwise op, float* to, const float* x0, const float* x1, const float* x2, const Broadcast& b,
                        cudaStream_t s) {
  int64_t n = 1;
  for (int i = 0; i < b.rank; ++i) n *= b.dims[i];
  if (n == 0) return cudaSuccess;
  elementwise_kernel<<<blocks_for(n), kThreads, 0, s>>>(op, to, x0, x1, x2, b, n);
  return cudaGetLastError();
}

cudaError_t matmul(float* c, const float* a, const float* b, const Matmul& m, cudaStream_t s) {
  int64_t n = m.m * m.n;
  for (int i = 0; i < m.rank; ++i) n *= m.dims[i];
  if (n == 0) return cudaSuccess;
  matmul_kernel<<<blocks_for(n), kThreads, 0, s>>>(c, a, b, m, n);
  return cudaGetLastError();
}

cudaError_t extreme_rows(float* to, const float* from, int64_t rows, int64_t width, bool max, cudaStream_t s) {
  if (rows == 0 || width == 0) return cudaSuccess;
  extreme_rows_kernel<<<blocks_for(rows), kThreads, 0, s>>>(to, from, rows, width, max);
  return cudaGetLastError();
}

cudaError_t route_rows(float* to, const float* x, const float* y, const float* dy, int64_t rows, int64_t width, cudaStream_t s) {
  if (rows == 0 || width == 0) return cudaSuccess;
  route_rows_kernel<<<blocks_for(rows), kThreads, 0, s>>>(to, x, y, dy, rows, width);
  return cudaGetLastError();
}

cudaError_t accumulate(float* acc, const float* add, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  accumulate_kernel<<<blocks_for(n), kThreads, 0, s>>>(acc, add, n);
  return cudaGetLastError();
}

cudaError_t scale(float* x, double factor, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, factor, n);
  return cudaGetLastError();
}

std::size_t squared_norm_scratch() { return kNormBlocks + 1; }

cudaError_t squared_norm(const float* x, int64_t n, double* scratch, cudaStream_t s) {
  const int blocks = static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kNormBlocks));
  squared_partials_kernel<<<blocks, kThreads, 0, s>>>(x, n, scratch);
  sum_partials_kernel<<<1, 1, 0, s>>>(scratch, blocks, scratch + kNormBlocks);
  return cudaGetLastError();
}

cudaError_t sgd(const SgdUpdate& u, float* w, const float* g, float* momentum, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  sgd_kernel<<<blocks_for(n), kThreads, 0, s>>>(u, w, g, momentum, n);
  return cudaGetLastError();
}

cudaError_t adam(const AdamUpdate& u, float* w, const float* g, float* m, float* v, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  adam_kernel<<<blocks_for(n), kThreads, 0, s>>>(u, w, g, m, v, n);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
