// What the cuda backend's kernels share: the device, one stream, the cuBLAS and cuDNN handles
// on it, device buffers, copies to and from the host, and a row-major GEMM on cuBLAS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/backend.h"

namespace tandem::cuda {

// Throw Error("[cuda] WHAT: the library's message") on failure.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);
void check(cudnnStatus_t status, const char* what);

// Gives device memory back to device_pool() (cuda_pool.h), which caches it, once `stream` (the
// one its kernel's work is queued on) has nothing left queued.
struct DeviceFree {
  cudaStream_t stream = nullptr;
  void operator()(void* p) const;
};

// Device memory of a fixed size, taken from device_pool() (within device_budget()) and given
// back with the object: sessions that come and go reuse it without cudaMalloc or cudaFree. It
// belongs to the stream of the context the thread bound last (bound(), Context::use), which
// must outlive it: a kernel's context is its first member, its buffers come after.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  float* f() const { return static_cast<float*>(ptr_.get()); }
  int32_t* i() const { return static_cast<int32_t*>(ptr_.get()); }
  void* get() const { return ptr_.get(); }
  std::size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<void, DeviceFree> ptr_;
  std::size_t bytes_ = 0;
};

// One host-to-device or device-to-host copy of a staged call (Context::staged).
struct Copy {
  void* to;
  const void* from;
  std::size_t bytes;
};
// `host` copied into all of `device`; all of `device` copied out to `host`.
inline Copy up(const DeviceBuffer& device, const void* host) { return {device.get(), host, device.bytes()}; }
inline Copy down(void* host, const DeviceBuffer& device) { return {host, device.get(), device.bytes()}; }

class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Makes this context's device the calling thread's (CUDA's current device is per thread,
  // and a session's kernels run on a thread other than the one that made its backend).
  void use() const;
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  cudnnHandle_t dnn() const { return dnn_; }

  // Host memory to the device and back, in stream order; finish() waits for the stream (the
  // host may then read what get() copied).
  void put(void* device, const void* host, std::size_t bytes) const;
  void get(void* host, const void* device, std::size_t bytes) const;
  void finish() const;

  // One kernel call on host tensors: this device made the thread's, `in` copied up, `work`
  // queued on the stream, `out` copied down, and the stream waited for.
  template <typename Work>
  void staged(std::initializer_list<Copy> in, Work&& work, std::initializer_list<Copy> out) const {
    use();
    for (const Copy& c : in) put(c.to, c.from, c.bytes);
    work();
    for (const Copy& c : out) get(c.to, c.from, c.bytes);
    finish();
  }

  // out[c] = sum over r of x[r, c] for x [rows, cols] (a bias gradient): cuBLAS' GEMV with
  // `ones` (at least `rows` ones on the device), deterministic, unlike atomics.
  void column_sums(const float* x, const float* ones, float* out, int64_t rows, int64_t cols) const;

  // Row-major C[M, N] = op(A)[M, K] op(B)[K, N] + beta C, `count` times at the given element
  // strides (cuBLAS is column-major: it computes C^T = op(B)^T op(A)^T, operands swapped).
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
            int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
            int64_t stride_c, int64_t count = 1) const;

 private:
  void destroy();

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
};

// `ctx` with its device made this thread's: what a kernel's constructor takes first, so that
// the device buffers it allocates next land on that device.
std::shared_ptr<Context> bound(std::shared_ptr<Context> ctx);

// The device the backend runs on: TANDEM_CUDA_DEVICE, else 0.
int chosen_device();

// `count` ones on the device (the right-hand side of column sums).
DeviceBuffer device_ones(const Context& ctx, int64_t count);

// A layer's weight and bias on the device, copied again only when their version changes
// (once per optimizer step: WeightsView::version, as XNNPACK repacks).
class DeviceWeights {
 public:
  DeviceWeights(std::size_t weight_count, std::size_t bias_count);
  // Device pointers to `w`'s values (bias null when `w` has none).
  void update(const Context& ctx, const WeightsView& w);
  const float* weight() const { return weight_.f(); }
  const float* bias() const { return has_bias_ ? bias_.f() : nullptr; }

 private:
  DeviceBuffer weight_, bias_;
  std::size_t weight_count_, bias_count_;
  const float* seen_weight_ = nullptr;
  uint64_t seen_version_ = 0;
  bool has_bias_ = false;
};

}  // namespace tandem::cuda
