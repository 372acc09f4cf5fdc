// Pieces shared by the XNNPACK kernels: owners of XNNPACK's C handles, the backend's context
// (thread pool), status checking, and the few memory-bound hand loops (transposes) the
// backward passes need around XNNPACK's operators.
#pragma once

#include <xnnpack.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/backend.h"
#include "core/error.h"
#include "backends/simd/parallel_for.h"
#include "core/tensor.h"

namespace tandem::xnn {

struct OperatorDeleter {
  void operator()(xnn_operator_t op) const {
    if (op != nullptr) xnn_delete_operator(op);
  }
};
using Operator = std::unique_ptr<xnn_operator, OperatorDeleter>;

struct ThreadpoolDeleter {
  void operator()(pthreadpool_t pool) const {
    if (pool != nullptr) pthreadpool_destroy(pool);
  }
};
using Threadpool = std::unique_ptr<pthreadpool, ThreadpoolDeleter>;

// An operator that packed a layer's weights when it was created, and which weights those were:
// it is re-created only when the weights (pointer or version) change, once per optimizer step.
struct PackedOperator {
  Operator op;
  const float* weight = nullptr;
  const float* bias = nullptr;
  uint64_t version = 0;

  bool holds(const WeightsView& w, bool uses_bias) const {
    return op && w.weight == weight && w.version == version && (!uses_bias || w.bias == bias);
  }
  void reset(xnn_operator_t created, const WeightsView& w) {
    op.reset(created);
    weight = w.weight;
    bias = w.bias;
    version = w.version;
  }
};

// What a backend shares with its kernels; kernels hold it by shared_ptr, so a kernel that
// outlives its backend still has a thread pool.
struct Context {
  Threadpool pool;  // null: run on the caller's thread
  // A linear layer's packed weights, shared by its kernels at every row count (micro-batch
  // sizes, length buckets) through LinearGeometry::weights_id: a new weights version packs
  // once, not once per kernel. Entries live while a kernel holds them.
  struct LinearPacking {
    PackedOperator forward, backward_data;
  };
  std::shared_ptr<LinearPacking> linear_packing(uint64_t weights_id) const {
    if (weights_id == 0) return std::make_shared<LinearPacking>();
    const std::lock_guard<std::mutex> lock(packing_mutex_);
    std::weak_ptr<LinearPacking>& entry = packings_[weights_id];
    std::shared_ptr<LinearPacking> p = entry.lock();
    if (!p) entry = p = std::make_shared<LinearPacking>();
    for (auto it = packings_.begin(); it != packings_.end();)  // forget the expired
      it = it->second.expired() ? packings_.erase(it) : std::next(it);
    return p;
  }
  pthreadpool_t threadpool() const { return pool.get(); }
  // The pool's threads (1 without one), and core's kernels' way onto them.
  int threads() const { return pool ? static_cast<int>(pthreadpool_get_threads_count(pool.get())) : 1; }
  simd::ParallelFor parallel_for() const {
    using Body = std::function<void(int64_t)>;
    return [p = pool.get()](int64_t count, const Body& body) {
      auto piece = [](void* f, size_t i) { (*static_cast<const Body*>(f))(static_cast<int64_t>(i)); };
      pthreadpool_parallelize_1d(p, piece, const_cast<Body*>(&body), static_cast<size_t>(count), 0);
    };
  }

 private:
  mutable std::mutex packing_mutex_;
  mutable std::map<uint64_t, std::weak_ptr<LinearPacking>> packings_;
};


// xnn_initialize, once per process; throws Error when XNNPACK refuses (e.g. unsupported CPU).
void initialize();

// Throws Error("[xnnpack] <call> failed: status N for <where>") unless status is success.
[[noreturn]] void fail_status(const char* call, xnn_status status, const std::string& where);
inline void check(xnn_status status, const char* call, const std::string& where) {
  if (status != xnn_status_success) [[unlikely]]
    fail_status(call, status, where);
}

// Scratch that XNNPACK reads as an operator's input: aligned, with the XNN_EXTRA_BYTES that
// its kernels may read past the end.
inline std::unique_ptr<float, AlignedFree> input_scratch(int64_t count) {
  return aligned_floats(static_cast<size_t>(count) + XNN_EXTRA_BYTES / sizeof(float));
}

// dst[c * rows + r] = src[r * cols + c] (src is [rows, cols], dst is [cols, rows]).
void transpose(const float* src, int64_t rows, int64_t cols, float* dst);

// sums[c] = sum over r of src[r * cols + c].
void column_sums(const float* src, int64_t rows, int64_t cols, float* sums);

// The weighted kernels (xnnpack_conv2d.cpp, xnnpack_linear.cpp).
std::unique_ptr<Conv2dKernel> make_conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g);
std::unique_ptr<Conv2dKernel> make_grouped_conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g);
std::unique_ptr<LinearKernel> make_linear(std::shared_ptr<const Context> ctx, const LinearGeometry& g);

}  // namespace tandem::xnn
