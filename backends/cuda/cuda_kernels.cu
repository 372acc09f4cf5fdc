// Device kernels of the cuda backend (cuda_kernels.h). Elementwise kernels use grid-stride
// loops; row kernels (softmax, layer norm) one block a row with warp-shuffle reductions;
// pooling backward gathers from the windows that hold an input, deterministic like the
// reference backend's order-free sums.
#include "backends/cuda/cuda_kernels.h"

#include <algorithm>
#include <cfloat>

#include "core/activation_math.h"
#include "core/dropout_bits.h"
#include "core/pool_window.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;  // per block; a multiple of the warp
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

__device__ inline int64_t first_index() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(blockDim.x) * gridDim.x; }

struct Sum {
  static constexpr float kIdentity = 0.0f;
  __device__ static float apply(float a, float b) { return a + b; }
};
struct Max {
  static constexpr float kIdentity = -INFINITY;
  __device__ static float apply(float a, float b) { return fmaxf(a, b); }
};

template <typename Op>
__device__ inline float warp_reduce(float v) {
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The block's sum (or max) of v, in every thread. `shared` holds 32 floats.
template <typename Op>
__device__ float block_reduce(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_reduce<Op>(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? shared[threadIdx.x] : Op::kIdentity;
  if (warp == 0) v = warp_reduce<Op>(v);
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  const float r = shared[0];
  __syncthreads();  // `shared` may be reused at once
  return r;
}
__device__ inline float block_sum(float v, float* shared) { return block_reduce<Sum>(v, shared); }
__device__ inline float block_max(float v, float* shared) { return block_reduce<Max>(v, shared); }

template <ActivationKind K>
__device__ inline float act_forward(float x) {
  if constexpr (K == ActivationKind::Relu6) return act::relu6(x);
  if constexpr (K == ActivationKind::Hardswish) return act::hardswish(x);
  if constexpr (K == ActivationKind::Gelu) return act::gelu(x);
  if constexpr (K == ActivationKind::GeluTanh) return act::gelu_tanh(x);
  if constexpr (K == ActivationKind::Sigmoid) return act::sigmoid(x);
  if constexpr (K == ActivationKind::Tanh) return act::tanh_(x);
  if constexpr (K == ActivationKind::Silu) return act::silu(x);
  if constexpr (K == ActivationKind::Hardsigmoid) return act::hardsigmoid(x);
  return x;
}
template <ActivationKind K>
__device__ inline float act_backward(float x, float y, float dy) {
  if constexpr (K == ActivationKind::Relu6) return act::relu6_grad(x, y, dy);
  if constexpr (K == ActivationKind::Hardswish) return act::hardswish_grad(x, y, dy);
  if constexpr (K == ActivationKind::Gelu) return act::gelu_grad(x, y, dy);
  if constexpr (K == ActivationKind::GeluTanh) return act::gelu_tanh_grad(x, y, dy);
  if constexpr (K == ActivationKind::Sigmoid) return act::sigmoid_grad(x, y, dy);
  if constexpr (K == ActivationKind::Tanh) return act::tanh_grad(x, y, dy);
  if constexpr (K == ActivationKind::Silu) return act::silu_grad(x, y, dy);
  if constexpr (K == ActivationKind::Hardsigmoid) return act::hardsigmoid_grad(x, y, dy);
  return dy;
}

template <ActivationKind K>
__global__ void activation_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = act_forward<K>(x[i]);
}
template <ActivationKind K>
__global__ void activation_backward_kernel(const float* x, const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = act_backward<K>(x[i], y[i], dy[i]);
}

template <ActivationKind K>
cudaError_t launch_activation(bool forward, const float* x, const float* y, const float* dy, float* out, int64_t n,
                              cudaStream_t s) {
  if (forward)
    activation_forward_kernel<K><<<blocks_for(n), kThreads, 0, s>>>(x, out, n);
  else
    activation_backward_kernel<K><<<blocks_for(n), kThreads, 0, s>>>(x, y, dy, out, n);
  return cudaGetLastError();
}

cudaError_t dispatch_activation(ActivationKind kind, bool forward, const float* x, const float* y, const float* dy,
                                float* out, int64_t n, cudaStream_t s) {
  switch (kind) {
    case ActivationKind::Relu6: return launch_activation<ActivationKind::Relu6>(forward, x, y, dy, out, n, s);
    case ActivationKind::Hardswish: return launch_activation<ActivationKind::Hardswish>(forward, x, y, dy, out, n, s);
    case ActivationKind::Gelu: return launch_activation<ActivationKind::Gelu>(forward, x, y, dy, out, n, s);
    case ActivationKind::GeluTanh: return launch_activation<ActivationKind::GeluTanh>(forward, x, y, dy, out, n, s);
    case ActivationKind::Sigmoid: return launch_activation<ActivationKind::Sigmoid>(forward, x, y, dy, out, n, s);
    case ActivationKind::Tanh: return launch_activation<ActivationKind::Tanh>(forward, x, y, dy, out, n, s);
    case ActivationKind::Silu: return launch_activation<ActivationKind::Silu>(forward, x, y, dy, out, n, s);
    case ActivationKind::Hardsigmoid:
      return launch_activation<ActivationKind::Hardsigmoid>(forward, x, y, dy, out, n, s);
  }
  return cudaErrorInvalidValue;
}

__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = a[i] + b[i];
}
__global__ void bias_rows_kernel(const float* bias, float* y, int64_t rows, int64_t cols) {
  for (int64_t i = first_index(); i < rows * cols; i += grid_stride()) y[i] = bias[i % cols];
}
__global__ void fill_kernel(float* x, float value, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = value;
}

__global__ void softmax_forward_kernel(const float* x, float* y, int64_t cols) {
  __shared__ float shared[32];
  const float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  float top = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) top = fmaxf(top, xr[j]);
  top = block_max(top, shared);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(xr[j] - top);
  sum = block_sum(sum, shared);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = expf(xr[j] - top) / sum;
}
__global__ void softmax_backward_kernel(const float* y, const float* dy, float* dx, int64_t cols) {
  __shared__ float shared[32];
  const int64_t base = blockIdx.x * cols;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += dy[base + j] * y[base + j];
  dot = block_sum(dot, shared);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dx[base + j] = y[base + j] * (dy[base + j] - dot);
}

__global__ void global_avg_pool_forward_kernel(const float* x, float* y, int64_t batch, int64_t plane, int64_t c) {
  for (int64_t i = first_index(); i < batch * c; i += grid_stride()) {
    const int64_t n = i / c, k = i % c;
    float acc = 0.0f;
    for (int64_t p = 0; p < plane; ++p) acc += x[(n * plane + p) * c + k];
    y[i] = acc / static_cast<float>(plane);
  }
}
__global__ void global_avg_pool_backward_kernel(const float* dy, float* dx, int64_t batch, int64_t plane, int64_t c) {
  const float inv = 1.0f / static_cast<float>(plane);
  for (int64_t i = first_index(); i < batch * plane * c; i += grid_stride()) {
    const int64_t k = i % c, n = i / (plane * c);
    dx[i] = dy[n * c + k] * inv;
  }
}

// The range of output rows (or columns) whose window holds input position `at`.
struct WindowRange {
  int64_t lo, hi;  // inclusive; empty when lo > hi
};
__device__ inline WindowRange windows_holding(int64_t at, int64_t pad, int64_t kernel, int64_t stride, int64_t outs) {
  const int64_t first = at + pad - kernel + 1;
  const int64_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const int64_t hi = min((at + pad) / stride, outs - 1);
  return {lo, hi};
}

__global__ void max_pool_forward_kernel(Pool2dGeometry g, int64_t oh, int64_t ow, const float* x, float* y,
                                        int32_t* arg) {
  const int64_t total = g.batch * oh * ow * g.channels;
  for (int64_t o = first_index(); o < total; o += grid_stride()) {
    const int64_t c = o % g.channels, ox = o / g.channels % ow, oy = o / (g.channels * ow) % oh,
                  n = o / (g.channels * ow * oh);
    const WindowMax best = max_in_window(g, x, n, oy, ox, c);
    y[o] = best.value;
    arg[o] = best.at;
  }
}
__global__ void max_pool_backward_kernel(Pool2dGeometry g, int64_t oh, int64_t ow, const float* dy,
                                         const int32_t* arg, float* dx) {
  const int64_t total = g.batch * g.in_h * g.in_w * g.channels;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i % g.channels, ix = i / g.channels % g.in_w, iy = i / (g.channels * g.in_w) % g.in_h,
                  n = i / (g.channels * g.in_w * g.in_h);
    const WindowRange rows = windows_holding(iy, g.pad_h, g.kernel_h, g.stride_h, oh);
    const WindowRange cols = windows_holding(ix, g.pad_w, g.kernel_w, g.stride_w, ow);
    const int32_t here = static_cast<int32_t>(iy * g.in_w + ix);
    float acc = 0.0f;
    for (int64_t oy = rows.lo; oy <= rows.hi; ++oy)
      for (int64_t ox = cols.lo; ox <= cols.hi; ++ox) {
        const int64_t o = ((n * oh + oy) * ow + ox) * g.channels + c;
        if (arg[o] == here) acc += dy[o];
      }
    dx[i] = acc;
  }
}
__global__ void avg_pool_forward_kernel(Pool2dGeometry g, int64_t oh, int64_t ow, const float* x, float* y) {
  const int64_t total = g.batch * oh * ow * g.channels;
  const float inv = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
  for (int64_t o = first_index(); o < total; o += grid_stride()) {
    const int64_t c = o % g.channels, ox = o / g.channels % ow, oy = o / (g.channels * ow) % oh,
                  n = o / (g.channels * ow * oh);
    const int64_t y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
    float acc = 0.0f;
    for (int64_t iy = max(y0, int64_t{0}); iy < min(y0 + g.kernel_h, g.in_h); ++iy)
      for (int64_t ix = max(x0, int64_t{0}); ix < min(x0 + g.kernel_w, g.in_w); ++ix)
        acc += x[((n * g.in_h + iy) * g.in_w + ix) * g.channels + c];
    y[o] = acc * inv;
  }
}
__global__ void avg_pool_backward_kernel(Pool2dGeometry g, int64_t oh, int64_t ow, const float* dy, float* dx) {
  const int64_t total = g.batch * g.in_h * g.in_w * g.channels;
  const float inv = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i % g.channels, ix = i / g.channels % g.in_w, iy = i / (g.channels * g.in_w) % g.in_h,
                  n = i / (g.channels * g.in_w * g.in_h);
    const WindowRange rows = windows_holding(iy, g.pad_h, g.kernel_h, g.stride_h, oh);
    const WindowRange cols = windows_holding(ix, g.pad_w, g.kernel_w, g.stride_w, ow);
    float acc = 0.0f;
    for (int64_t oy = rows.lo; oy <= rows.hi; ++oy)
      for (int64_t ox = cols.lo; ox <= cols.hi; ++ox) acc += dy[((n * oh + oy) * ow + ox) * g.channels + c];
    dx[i] = acc * inv;
  }
}

__global__ void layer_norm_forward_kernel(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                          float* var, int64_t n, float eps) {
  __shared__ float shared[32];
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  const float m = block_sum(s, shared) / static_cast<float>(n);
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (xr[i] - m) * (xr[i] - m);
  const float v = block_sum(ss, shared) / static_cast<float>(n);
  const float rstd = 1.0f / sqrtf(v + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] - m) * rstd * gamma[i] + beta[i];
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    var[blockIdx.x] = v;
  }
}
__global__ void layer_norm_backward_data_kernel(const float* x, const float* dy, const float* gamma, const float* mean,
                                                const float* var, float* dx, int64_t n, float eps) {
  __shared__ float shared[32];
  const int64_t base = blockIdx.x * n;
  const float m = mean[blockIdx.x], rstd = 1.0f / sqrtf(var[blockIdx.x] + eps);
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float dxhat = dy[base + i] * gamma[i];
    s1 += dxhat;
    s2 += dxhat * (x[base + i] - m) * rstd;
  }
  s1 = block_sum(s1, shared);
  s2 = block_sum(s2, shared);
  const float fn = static_cast<float>(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float xhat = (x[base + i] - m) * rstd, dxhat = dy[base + i] * gamma[i];
    dx[base + i] = rstd / fn * (fn * dxhat - s1 - xhat * s2);
  }
}
__global__ void layer_norm_dy_xhat_kernel(const float* x, const float* dy, const float* mean, const float* var,
                                          float* out, int64_t rows, int64_t n, float eps) {
  for (int64_t i = first_index(); i < rows * n; i += grid_stride()) {
    const int64_t r = i / n;
    out[i] = dy[i] * (x[i] - mean[r]) / sqrtf(var[r] + eps);
  }
}

// One block a (sample, head, query) row of the scores.
__global__ void attention_softmax_kernel(float* scores, const float* mask, int64_t heads, int64_t tokens, float scale,
                                         bool causal) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, query = row % tokens, sample = row / (heads * tokens);
  float* s = scores + row * tokens;
  auto keep = [&](int64_t j) {
    return (mask == nullptr || mask[sample * tokens + j] != 0.0f) && (!causal || j <= query);
  };
  float top = -INFINITY;
  for (int64_t j = threadIdx.x; j < tokens; j += blockDim.x)
    if (keep(j)) top = fmaxf(top, s[j] * scale);
  top = block_max(top, shared);
  if (top == -INFINITY) {  // no key kept
    for (int64_t j = threadIdx.x; j < tokens; j += blockDim.x) s[j] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < tokens; j += blockDim.x) sum += keep(j) ? expf(s[j] * scale - top) : 0.0f;
  sum = block_sum(sum, shared);
  for (int64_t j = threadIdx.x; j < tokens; j += blockDim.x) s[j] = keep(j) ? expf(s[j] * scale - top) / sum : 0.0f;
}
__global__ void attention_softmax_backward_kernel(const float* probs, float* dprobs, int64_t tokens, float scale) {
  __shared__ float shared[32];
  const int64_t base = blockIdx.x * tokens;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < tokens; j += blockDim.x) dot += dprobs[base + j] * probs[base + j];
  dot = block_sum(dot, shared);
  for (int64_t j = threadIdx.x; j < tokens; j += blockDim.x)
    dprobs[base + j] = probs[base + j] * (dprobs[base + j] - dot) * scale;
}

// Row kernels take one block a row; the grid's x holds up to 2^31 - 1 of them, and a grid of
// none is an invalid launch: the launchers check both first.
unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows); }
// Success for no rows (nothing to launch), an error for more rows than a grid holds.
cudaError_t no_rows_or_too_many(int64_t rows) { return rows == 0 ? cudaSuccess : cudaErrorInvalidConfiguration; }

__global__ void dropout_forward_kernel(uint64_t base, uint64_t threshold, float scale, const float* x, float* y,
                                       uint8_t* keep, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const bool k = dropout_keeps(base, threshold, i);
    keep[i] = k;
    y[i] = k ? x[i] * scale : 0.0f;
  }
}

__global__ void dropout_backward_kernel(const uint8_t* keep, float scale, const float* dy, float* dx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
}

// One thread an output feature of a sample: its tokens in order, as the reference.
__global__ void token_pool_forward_kernel(const float* x, const float* w, float* y, int64_t batch, int64_t tokens,
                                          int64_t features) {
  for (int64_t i = first_index(); i < batch * features; i += grid_stride()) {
    const int64_t b = i / features, f = i % features;
    float sum = 0.0f;
    for (int64_t t = 0; t < tokens; ++t) {
      const float wt = w[b * tokens + t];
      if (wt != 0.0f) sum += wt * x[(b * tokens + t) * features + f];
    }
    y[i] = sum;
  }
}

__global__ void token_pool_backward_kernel(const float* dy, const float* w, float* dx, int64_t batch, int64_t tokens,
                                           int64_t features) {
  for (int64_t i = first_index(); i < batch * tokens * features; i += grid_stride()) {
    const int64_t f = i % features, bt = i / features;
    dx[i] = w[bt] * dy[(bt / tokens) * features + f];
  }
}

__global__ void mul_forward_kernel(const float* a, const float* b, float* y, int64_t batch, int64_t outer,
                                   int64_t inner) {
  for (int64_t i = first_index(); i < batch * outer * inner; i += grid_stride())
    y[i] = a[i] * b[(i / (outer * inner)) * inner + i % inner];
}
__global__ void mul_backward_a_kernel(const float* dy, const float* b, float* da, int64_t batch, int64_t outer,
                                      int64_t inner) {
  for (int64_t i = first_index(); i < batch * outer * inner; i += grid_stride())
    da[i] = dy[i] * b[(i / (outer * inner)) * inner + i % inner];
}
// One thread a (sample, inner) pair, summing over outer in order.
__global__ void mul_backward_b_kernel(const float* dy, const float* a, float* db, int64_t batch, int64_t outer,
                                      int64_t inner) {
  for (int64_t j = first_index(); j < batch * inner; j += grid_stride()) {
    const int64_t n = j / inner, c = j % inner;
    float sum = 0.0f;
    for (int64_t o = 0; o < outer; ++o) {
      const int64_t at = (n * outer + o) * inner + c;
      sum += dy[at] * a[at];
    }
    db[j] = sum;
  }
}

}  // namespace

bool activation_kind(std::string_view name, ActivationKind& kind) {
  struct Named {
    std::string_view name;
    ActivationKind kind;
  };
  for (const Named& n : {Named{"relu6", ActivationKind::Relu6}, Named{"hardswish", ActivationKind::Hardswish},
                         Named{"gelu", ActivationKind::Gelu}, Named{"gelu_tanh", ActivationKind::GeluTanh},
                         Named{"sigmoid", ActivationKind::Sigmoid}, Named{"tanh", ActivationKind::Tanh},
                         Named{"silu", ActivationKind::Silu}, Named{"hardsigmoid", ActivationKind::Hardsigmoid}})
    if (n.name == name) {
      kind = n.kind;
      return true;
    }
  return false;
}

cudaError_t activation_forward(ActivationKind kind, const float* x, float* y, int64_t n, cudaStream_t s) {
  return dispatch_activation(kind, true, x, nullptr, nullptr, y, n, s);
}
cudaError_t activation_backward(ActivationKind kind, const float* x, const float* y, const float* dy, float* dx,
                                int64_t n, cudaStream_t s) {
  return dispatch_activation(kind, false, x, y, dy, dx, n, s);
}
cudaError_t relu_forward(const float* x, float* y, int64_t n, cudaStream_t s) {
  relu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  return cudaGetLastError();
}
cudaError_t relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t s) {
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, dy, dx, n);
  return cudaGetLastError();
}
cudaError_t add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n);
  return cudaGetLastError();
}
cudaError_t bias_rows(const float* bias, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  bias_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(bias, y, rows, cols);
  return cudaGetLastError();
}
cudaError_t fill(float* x, float value, int64_t n, cudaStream_t s) {
  fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, value, n);
  return cudaGetLastError();
}
cudaError_t softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows == 0 || rows > INT32_MAX) return no_rows_or_too_many(rows);
  softmax_forward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(x, y, cols);
  return cudaGetLastError();
}
cudaError_t softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows == 0 || rows > INT32_MAX) return no_rows_or_too_many(rows);
  softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(y, dy, dx, cols);
  return cudaGetLastError();
}
cudaError_t global_avg_pool_forward(const float* x, float* y, int64_t batch, int64_t plane, int64_t channels,
                                    cudaStream_t s) {
  global_avg_pool_forward_kernel<<<blocks_for(batch * channels), kThreads, 0, s>>>(x, y, batch, plane, channels);
  return cudaGetLastError();
}
cudaError_t global_avg_pool_backward(const float* dy, float* dx, int64_t batch, int64_t plane, int64_t channels,
                                     cudaStream_t s) {
  global_avg_pool_backward_kernel<<<blocks_for(batch * plane * channels), kThreads, 0, s>>>(dy, dx, batch, plane,
                                                                                            channels);
  return cudaGetLastError();
}
cudaError_t max_pool_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* arg, cudaStream_t s) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  max_pool_forward_kernel<<<blocks_for(g.batch * oh * ow * g.channels), kThreads, 0, s>>>(g, oh, ow, x, y, arg);
  return cudaGetLastError();
}
cudaError_t max_pool_backward(const Pool2dGeometry& g, const float* dy, const int32_t* arg, float* dx, cudaStream_t s) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  max_pool_backward_kernel<<<blocks_for(g.batch * g.in_h * g.in_w * g.channels), kThreads, 0, s>>>(g, oh, ow, dy,
                                                                                                     arg, dx);
  return cudaGetLastError();
}
cudaError_t avg_pool_forward(const Pool2dGeometry& g, const float* x, float* y, cudaStream_t s) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  avg_pool_forward_kernel<<<blocks_for(g.batch * oh * ow * g.channels), kThreads, 0, s>>>(g, oh, ow, x, y);
  return cudaGetLastError();
}
cudaError_t avg_pool_backward(const Pool2dGeometry& g, const float* dy, float* dx, cudaStream_t s) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  avg_pool_backward_kernel<<<blocks_for(g.batch * g.in_h * g.in_w * g.channels), kThreads, 0, s>>>(g, oh, ow, dy,
                                                                                                     dx);
  return cudaGetLastError();
}
cudaError_t layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                               float* var, int64_t rows, int64_t features, float eps, cudaStream_t s) {
  if (rows == 0 || rows > INT32_MAX) return no_rows_or_too_many(rows);
  layer_norm_forward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(x, gamma, beta, y, mean, var, features, eps);
  return cudaGetLastError();
}
cudaError_t layer_norm_backward_data(const float* x, const float* dy, const float* gamma, const float* mean,
                                     const float* var, float* dx, int64_t rows, int64_t features, float eps,
                                     cudaStream_t s) {
  if (rows == 0 || rows > INT32_MAX) return no_rows_or_too_many(rows);
  layer_norm_backward_data_kernel<<<row_blocks(rows), kThreads, 0, s>>>(x, dy, gamma, mean, var, dx, features, eps);
  return cudaGetLastError();
}
cudaError_t layer_norm_dy_xhat(const float* x, const float* dy, const float* mean, const float* var, float* out,
                               int64_t rows, int64_t features, float eps, cudaStream_t s) {
  layer_norm_dy_xhat_kernel<<<blocks_for(rows * features), kThreads, 0, s>>>(x, dy, mean, var, out, rows, features,
                                                                             eps);
  return cudaGetLastError();
}
cudaError_t dropout_forward(uint64_t base, uint64_t threshold, float scale, const float* x, float* y, uint8_t* keep,
                            int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  dropout_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(base, threshold, scale, x, y, keep, n);
  return cudaGetLastError();
}
cudaError_t dropout_backward(const uint8_t* keep, float scale, const float* dy, float* dx, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  dropout_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(keep, scale, dy, dx, n);
  return cudaGetLastError();
}
cudaError_t token_pool_forward(const float* x, const float* w, float* y, int64_t batch, int64_t tokens,
                               int64_t features, cudaStream_t s) {
  if (batch * features == 0) return cudaSuccess;
  token_pool_forward_kernel<<<blocks_for(batch * features), kThreads, 0, s>>>(x, w, y, batch, tokens, features);
  return cudaGetLastError();
}
cudaError_t token_pool_backward(const float* dy, const float* w, float* dx, int64_t batch, int64_t tokens,
                                int64_t features, cudaStream_t s) {
  if (batch * tokens * features == 0) return cudaSuccess;
  token_pool_backward_kernel<<<blocks_for(batch * tokens * features), kThreads, 0, s>>>(dy, w, dx, batch, tokens,
                                                                                        features);
  return cudaGetLastError();
}
cudaError_t mul_forward(const float* a, const float* b, float* y, int64_t batch, int64_t outer, int64_t inner,
                        cudaStream_t s) {
  if (batch * outer * inner == 0) return cudaSuccess;
  mul_forward_kernel<<<blocks_for(batch * outer * inner), kThreads, 0, s>>>(a, b, y, batch, outer, inner);
  return cudaGetLastError();
}
cudaError_t mul_backward(const float* dy, const float* a, const float* b, float* da, float* db, int64_t batch,
                         int64_t outer, int64_t inner, cudaStream_t s) {
  if (batch * outer * inner == 0) return cudaSuccess;
  if (db) {
    mul_backward_b_kernel<<<blocks_for(batch * inner), kThreads, 0, s>>>(dy, a, db, batch, outer, inner);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (da) mul_backward_a_kernel<<<blocks_for(batch * outer * inner), kThreads, 0, s>>>(dy, b, da, batch, outer, inner);
  return cudaGetLastError();
}
cudaError_t attention_softmax(float* scores, const float* mask, int64_t batch, int64_t heads, int64_t tokens,
                              float scale, bool causal, cudaStream_t s) {
  if (const int64_t rows = batch * heads * tokens; rows == 0 || rows > INT32_MAX) return no_rows_or_too_many(rows);
  attention_softmax_kernel<<<row_blocks(batch * heads * tokens), kThreads, 0, s>>>(scores, mask, heads, tokens, scale,
                                                                                   causal);
  return cudaGetLastError();
}
cudaError_t attention_softmax_backward(const float* probs, float* dprobs, int64_t rows, int64_t tokens, float scale,
                                       cudaStream_t s) {
  if (rows == 0 || rows > INT32_MAX) return no_rows_or_too_many(rows);
  attention_softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(probs, dprobs, tokens, scale);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
