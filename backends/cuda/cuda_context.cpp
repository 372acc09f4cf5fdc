#include "backends/cuda/cuda_context.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/cuda_budget.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_pool.h"
#include "backends/cuda/resident_ranges.h"
#include "core/error.h"

namespace tandem::cuda {

namespace {

// A kernel call that fails may have queued copies into page-locked host tensors (they run
// asynchronously) before its finish(): wait for the device before the error unwinds, so no
// copy writes into a tensor the caller then frees. An error path only.
[[noreturn]] void fail_after_device_wait(std::string message) {
  cudaDeviceSynchronize();
  fail("cuda", message);
}

}  // namespace

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail_after_device_wait(cat(what, ": ", cudaGetErrorString(status)));
}
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail_after_device_wait(cat(what, ": ", cublasGetStatusString(status)));
}
void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) fail_after_device_wait(cat(what, ": ", cudnnGetErrorString(status)));
}

DevicePool& device_pool() {
  static DevicePool* pool = new DevicePool(
      {[](std::size_t bytes) {
         void* p = nullptr;
         if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
           cudaGetLastError();  // clear it: the next launch's check must not report this failure
           check(e, cat("cudaMalloc of ", bytes, " bytes").c_str());
         }
         return p;
       },
       [](void* p) { cudaFree(p); }},
      device_budget());
  return *pool;
}

namespace {

// The stream of the context a thread bound last (Context::use): a kernel's buffers are made
// right after its context is bound, and are given back on it.
thread_local cudaStream_t t_stream = nullptr;

}  // namespace

void DeviceFree::operator()(void* p) const {
  // What the stream still has queued may use the block (a call that threw before its
  // finish()): wait for it before another stream can take the block from the cache. Without
  // a stream, every stream (what cudaFree would do).
  if (stream)
    cudaStreamSynchronize(stream);
  else
    cudaDeviceSynchronize();
  if (!device_pool().give(p)) std::fprintf(stderr, "tandem-cloud: [cuda] a device block the pool did not make; left alone\n");
}

DeviceBuffer::DeviceBuffer(std::size_t bytes)
    : ptr_(device_pool().take(bytes, "a kernel's buffers"), DeviceFree{t_stream}), bytes_(bytes) {}

int chosen_device() {
  const char* chosen = std::getenv("TANDEM_CUDA_DEVICE");
  return chosen && *chosen ? std::atoi(chosen) : 0;
}

Context::Context() : device_(chosen_device()) {
  try {
    use();
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cublasCreate(&blas_), "cublasCreate");
    check(cublasSetStream(blas_, stream_), "cublasSetStream");
    // Full f32 products (no TF32 tensor cores): results within the reference backend's
    // tolerances, as PyTorch's default for matmul.
    check(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    check(cudnnCreate(&dnn_), "cudnnCreate");
    check(cudnnSetStream(dnn_, stream_), "cudnnSetStream");
  } catch (...) {
    destroy();
    throw;
  }
}

Context::~Context() { destroy(); }

void Context::destroy() {
  if (dnn_) cudnnDestroy(dnn_);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
  dnn_ = nullptr;
  blas_ = nullptr;
  stream_ = nullptr;
}

void Context::use() const {
  check(cudaSetDevice(device_), "cudaSetDevice");
  t_stream = stream_;
}

std::shared_ptr<Context> bound(std::shared_ptr<Context> ctx) {
  ctx->use();
  return ctx;
}

void Context::put(void* device, const void* host, std::size_t bytes) const {
  // cudaMemcpyDefault: the driver tells host from device (and managed) memory by address.
  if (bytes > 0) check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyDefault, stream_), "copy to the device");
}
void Context::get(void* host, const void* device, std::size_t bytes) const {
  if (bytes > 0) check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDefault, stream_), "copy from the device");
}
void Context::finish() const { check(cudaStreamSynchronize(stream_), "the stream's work"); }

void Context::wait() const {
  use();
  check(cudaStreamSynchronize(stream_),
        calls_run_ahead() ? "the kernels queued since the last wait (TANDEM_CUDA_ASYNC=1: any of them may have failed; "
                            "run without it to see which)"
                          : "the stream's work");
}

void Context::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                   int64_t stride_c, int64_t count) const {
  for (int64_t v : {m, n, k, lda, ldb, ldc, count})
    if (v > INT_MAX) fail("cuda", cat("a GEMM dimension of ", v, " is past cuBLAS' int range"));
  const float alpha = 1.0f;
  check(cublasSgemmStridedBatched(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                  static_cast<int>(ldb), stride_b, a, static_cast<int>(lda), stride_a, &beta, c,
                                  static_cast<int>(ldc), stride_c, static_cast<int>(count)),
        "cublasSgemmStridedBatched");
}

void Context::column_sums(const float* x, const float* ones, float* out, int64_t rows, int64_t cols) const {
  if (rows > INT_MAX || cols > INT_MAX) fail("cuda", cat("column sums of ", rows, " x ", cols, " are past cuBLAS' int range"));
  const float one = 1.0f, zero = 0.0f;
  // x row-major [rows, cols] is column-major [cols, rows] with leading dimension cols.
  check(cublasSgemv(blas_, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(rows), &one, x, static_cast<int>(cols),
                    ones, 1, &zero, out, 1),
        "cublasSgemv (column sums)");
}

DeviceBuffer device_ones(const Context& ctx, int64_t count) {
  DeviceBuffer ones(static_cast<std::size_t>(count) * sizeof(float));
  check(fill(ones.f(), 1.0f, count, ctx.stream()), "filling ones");
  return ones;
}

void Call::put(void* device, const void* host, std::size_t bytes) {
  ctx_.put(device, host, bytes);
  staged_ = true;
}

const void* Call::stage_in(const void* host, const DeviceBuffer& staging) {
  if (!host || resident_ranges().contains(host, staging.bytes())) return host;
  put(staging.get(), host, staging.bytes());
  return staging.get();
}

void* Call::stage_out(void* host, const DeviceBuffer& staging) {
  if (!host || resident_ranges().contains(host, staging.bytes())) return host;
  if (down_count_ == downs_.size()) fail("cuda", "a kernel call staged more outputs than Call holds");
  downs_[down_count_++] = {host, staging.get(), staging.bytes()};
  staged_ = true;
  return staging.get();
}

void Call::end() {
  for (std::size_t i = 0; i < down_count_; ++i) ctx_.get(downs_[i].host, downs_[i].device, downs_[i].bytes);
  down_count_ = 0;
  // A copy from host memory may still be queued (page-locked memory is copied asynchronously),
  // and one to it surely is: only a call on managed tensors alone may run ahead.
  if (staged_ || !calls_run_ahead()) ctx_.finish();
  staged_ = false;
}

DeviceWeights::DeviceWeights(std::size_t weight_count, std::size_t bias_count)
    : weight_(weight_count * sizeof(float)), bias_(bias_count * sizeof(float)) {}

void DeviceWeights::update(Call& call, const WeightsView& w) {
  const bool has_bias = w.bias != nullptr && bias_.bytes() > 0;
  const bool weight_resident = resident_ranges().contains(w.weight, weight_.bytes());
  const bool bias_resident = has_bias && resident_ranges().contains(w.bias, bias_.bytes());
  if (w.weight != seen_weight_ || w.version != seen_version_) {
    if (!weight_resident) call.put(weight_.get(), w.weight, weight_.bytes());
    if (has_bias && !bias_resident) call.put(bias_.get(), w.bias, bias_.bytes());
    seen_weight_ = w.weight;
    seen_version_ = w.version;
  }
  weight_ptr_ = weight_resident ? w.weight : weight_.f();
  bias_ptr_ = !has_bias ? nullptr : bias_resident ? w.bias : bias_.f();
}

}  // namespace tandem::cuda
