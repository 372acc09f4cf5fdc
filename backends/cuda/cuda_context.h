// What the cuda backend's kernels share: the device, one stream, the cuBLAS and cuDNN handles
// on it, device buffers, copies to and from the host, and a row-major GEMM on cuBLAS.
#pragma once

#include <cstddef>
#include <array>
#include <cstdint>
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
  // finish() for a host read after calls that may have run ahead (Backend::wait): its error
  // says that the failing kernel may be any queued since the last wait.
  void wait() const;

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

// One kernel call's operands. A pointer into a tensor in managed memory (resident_ranges(),
// TANDEM_CUDA_MEMORY=managed) is used in place; any other (host memory: a received frame, a
// small tensor, a stash) is staged through one of the kernel's buffers: copied up before the
// work (in) or down after it (out, queued by end()), as many bytes as the buffer holds. Null
// stays null. end() waits for the stream, so the host may read what the call wrote; with
// TANDEM_CUDA_ASYNC=1 (calls_run_ahead()) a call that staged nothing returns without waiting,
// and the network waits where the host reads (Backend::wait).
class Call {
 public:
  explicit Call(const Context& ctx) : ctx_(ctx) { ctx.use(); }
  // `bytes` of host memory to the device, in stream order; the call then ends waiting.
  void put(void* device, const void* host, std::size_t bytes);
  template <typename T>
  const T* in(const T* host, const DeviceBuffer& staging) {
    return static_cast<const T*>(stage_in(host, staging));
  }
  template <typename T>
  T* out(T* host, const DeviceBuffer& staging) {
    return static_cast<T*>(stage_out(host, staging));
  }
  void end();

 private:
  const void* stage_in(const void* host, const DeviceBuffer& staging);
  void* stage_out(void* host, const DeviceBuffer& staging);
  struct Down {
    void* host;
    const void* device;
    std::size_t bytes;
  };
  const Context& ctx_;
  std::array<Down, 8> downs_{};  // no kernel writes more outputs; fixed, so a call allocates nothing
  std::size_t down_count_ = 0;
  bool staged_ = false;  // host memory was read or is to be written: end() must wait
};

// Whether kernel calls and vector passes on managed tensors may return before their work has
// run (TANDEM_CUDA_ASYNC=1 with TANDEM_CUDA_MEMORY=managed installed; cuda_memory.cpp).
bool calls_run_ahead();

// `ctx` with its device made this thread's: what a kernel's constructor takes first, so that
// the device buffers it allocates next land on that device.
std::shared_ptr<Context> bound(std::shared_ptr<Context> ctx);

// The device the backend runs on: TANDEM_CUDA_DEVICE, else 0.
int chosen_device();

// `count` ones on the device (the right-hand side of column sums).
DeviceBuffer device_ones(const Context& ctx, int64_t count);

// A layer's weight and bias on the device: used in place when they are managed tensors, else
// copied again only when their version changes (once per optimizer step: WeightsView::version,
// as XNNPACK repacks).
class DeviceWeights {
 public:
  DeviceWeights(std::size_t weight_count, std::size_t bias_count);
  // Device pointers to `w`'s values (bias null when `w` has none); copies go through `call`.
  void update(Call& call, const WeightsView& w);
  const float* weight() const { return weight_ptr_; }
  const float* bias() const { return bias_ptr_; }

 private:
  DeviceBuffer weight_, bias_;  // bias_ empty for a layer without one
  const float* seen_weight_ = nullptr;
  uint64_t seen_version_ = 0;
  const float* weight_ptr_ = nullptr;
  const float* bias_ptr_ = nullptr;
};

}  // namespace tandem::cuda
