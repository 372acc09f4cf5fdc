// The cuda backend's VectorKernel: on the device when every operand is a managed tensor
// (resident_ranges()), so that gradient sums and optimizer updates never pull them to the host;
// the host loops (host_vectors()) for anything else, which the host can always reach. On the
// kernels' stream, so in order with them; each waits for it unless calls_run_ahead().
#include "backends/cuda/cuda_vector_kernel.h"

#include <mutex>
#include <vector>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_vectors.h"
#include "backends/cuda/resident_ranges.h"
#include "core/host_vectors.h"

namespace tandem::cuda {
namespace {

bool resident(const float* p, int64_t n) {
  return resident_ranges().contains(p, static_cast<std::size_t>(n) * sizeof(float));
}

class CudaVectors final : public VectorKernel {
 public:
  explicit CudaVectors(std::shared_ptr<Context> ctx)
      : ctx_(bound(std::move(ctx))), scratch_(squared_norm_scratch() * sizeof(double)) {}

  void fill(float* x, float value, int64_t n) override {
    if (!resident(x, n)) return host().fill(x, value, n);
    ctx_->use();
    check(cuda::fill(x, value, n, ctx_->stream()), "fill");
    done();
  }

  void copy(float* to, const float* from, int64_t n) override {
    if (to == from || n == 0) return;
    if (!resident(to, n) && !resident(from, n)) return host().copy(to, from, n);
    ctx_->use();
    check(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDefault, ctx_->stream()),
          "copy");
    resident(to, n) && resident(from, n) ? done() : ctx_->finish();
  }

  // One strided copy (cudaMemcpy2DAsync) where either side is a managed tensor.
  void copy_rows(float* to, int64_t to_stride, const float* from, int64_t from_stride, int64_t width,
                 int64_t rows) override {
    if (rows == 0 || width == 0) return;
    const int64_t to_span = (rows - 1) * to_stride + width, from_span = (rows - 1) * from_stride + width;
    if (!resident(to, to_span) && !resident(from, from_span))
      return host().copy_rows(to, to_stride, from, from_stride, width, rows);
    ctx_->use();
    constexpr auto f = sizeof(float);
    check(cudaMemcpy2DAsync(to, static_cast<std::size_t>(to_stride) * f, from, static_cast<std::size_t>(from_stride) * f,
                            static_cast<std::size_t>(width) * f, static_cast<std::size_t>(rows), cudaMemcpyDefault,
                            ctx_->stream()),
          "strided copy");
    resident(to, to_span) && resident(from, from_span) ? done() : ctx_->finish();
  }

  // A device kernel where both tensors are managed; else the host loop once the device is done.
  void permute(float* to, const float* from, const int64_t* dims, const int* perm, int rank) override {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    if (n == 0) return;
    if (!resident(to, n) || !resident(from, n)) {
      if (resident(to, n) || resident(from, n)) ctx_->finish();
      return host().permute(to, from, dims, perm, rank);
    }
    ctx_->use();
    check(cuda::permute(to, from, dims, perm, rank, ctx_->stream()), "permute");
    done();
  }

  void sum_rows(float* to, const float* from, int64_t rows, int64_t width, float scale) override {
    if (rows == 0) return;
    if (!resident(to, rows) || !resident(from, rows * width)) {
      if (resident(to, rows) || resident(from, rows * width)) ctx_->finish();
      return host().sum_rows(to, from, rows, width, scale);
    }
    ctx_->use();
    check(cuda::sum_rows(to, from, rows, width, scale, ctx_->stream()), "sum of rows");
    done();
  }

  void spread_rows(float* to, const float* from, int64_t rows, int64_t width, float scale) override {
    if (rows == 0 || width == 0) return;
    if (!resident(to, rows * width) || !resident(from, rows)) {
      if (resident(to, rows * width) || resident(from, rows)) ctx_->finish();
      return host().spread_rows(to, from, rows, width, scale);
    }
    ctx_->use();
    check(cuda::spread_rows(to, from, rows, width, scale, ctx_->stream()), "spread of rows");
    done();
  }

  // A device kernel where every operand is a managed tensor; else the host loop once the
  // device is done.
  void elementwise(Elementwise op, float* to, const float* x0, const float* x1, const float* x2,
                   const Broadcast& b) override {
    int64_t n = 1;
    for (int i = 0; i < b.rank; ++i) n *= b.dims[i];
    if (n == 0) return;
    const float* x[3] = {x0, x1, x2};
    bool all = resident(to, n), any = all;
    for (int k = 0; k < 3; ++k) {
      if (!x[k]) continue;
      int64_t span = 1;  // the operand's reach: its last element's offset, plus one
      for (int i = 0; i < b.rank; ++i) span += (b.dims[i] - 1) * b.strides[k][i];
      const bool r = resident(x[k], span);
      all = all && r;
      any = any || r;
    }
    if (!all) {
      if (any) ctx_->finish();
      return host().elementwise(op, to, x0, x1, x2, b);
    }
    ctx_->use();
    check(cuda::elementwise(op, to, x0, x1, x2, b, ctx_->stream()), "elementwise");
    done();
  }

  void matmul(float* c, const float* a, const float* b, const Matmul& m) override {
    int64_t n = m.m * m.n;
    int64_t a_span = 1 + (m.m - 1) * m.a_row + (m.k - 1) * m.a_col, b_span = 1 + (m.k - 1) * m.b_row + (m.n - 1) * m.b_col;
    for (int i = 0; i < m.rank; ++i) {
      n *= m.dims[i];
      a_span += (m.dims[i] - 1) * m.a_steps[i];
      b_span += (m.dims[i] - 1) * m.b_steps[i];
    }
    if (n == 0) return;
    if (!resident(c, n) || !resident(a, a_span) || !resident(b, b_span)) {
      if (resident(c, n) || resident(a, a_span) || resident(b, b_span)) ctx_->finish();
      return host().matmul(c, a, b, m);
    }
    ctx_->use();
    check(cuda::matmul(c, a, b, m, ctx_->stream()), "matmul");
    done();
  }

  void extreme_rows(float* to, const float* from, int64_t rows, int64_t width, bool max) override {
    if (rows == 0 || width == 0) return;
    if (!resident(to, rows) || !resident(from, rows * width)) {
      if (resident(to, rows) || resident(from, rows * width)) ctx_->finish();
      return host().extreme_rows(to, from, rows, width, max);
    }
    ctx_->use();
    check(cuda::extreme_rows(to, from, rows, width, max, ctx_->stream()), "extremes of rows");
    done();
  }

  void route_rows(float* to, const float* x, const float* y, const float* dy, int64_t rows, int64_t width) override {
    if (rows == 0 || width == 0) return;
    const bool all = resident(to, rows * width) && resident(x, rows * width) && resident(y, rows) && resident(dy, rows);
    if (!all) {
      if (resident(to, rows * width) || resident(x, rows * width) || resident(y, rows) || resident(dy, rows)) ctx_->finish();
      return host().route_rows(to, x, y, dy, rows, width);
    }
    ctx_->use();
    check(cuda::route_rows(to, x, y, dy, rows, width, ctx_->stream()), "route of rows");
    done();
  }

  void accumulate(float* acc, const float* add, int64_t n) override {
    if (!resident(acc, n) || !resident(add, n)) return host().accumulate(acc, add, n);
    ctx_->use();
    check(cuda::accumulate(acc, add, n, ctx_->stream()), "accumulate");
    done();
  }

  void scale(float* x, double factor, int64_t n) override {
    if (!resident(x, n)) return host().scale(x, factor, n);
    ctx_->use();
    check(cuda::scale(x, factor, n, ctx_->stream()), "scale");
    done();
  }

  double squared_norm(const float* x, int64_t n) override {
    if (n == 0) return 0.0;
    if (!resident(x, n)) return host().squared_norm(x, n);
    std::lock_guard lock(scratch_mu_);  // one scratch for the backend; its threads take turns
    ctx_->use();
    check(cuda::squared_norm(x, n, static_cast<double*>(scratch_.get()), ctx_->stream()), "squared norm");
    double total = 0.0;
    ctx_->get(&total, static_cast<const double*>(scratch_.get()) + squared_norm_scratch() - 1, sizeof total);
    ctx_->finish();
    return total;
  }

  // Each managed array summed on the device into its own slot of norms_, the totals copied down
  // in one strided copy after one wait; the rest by the host loops.
  void squared_norms(const float* const* x, const int64_t* n, int count, double* out) override {
    if (count <= 0) return;
    std::lock_guard lock(scratch_mu_);
    ctx_->use();
    const std::size_t per = squared_norm_scratch(), slots = static_cast<std::size_t>(count);
    if (norms_.bytes() < slots * per * sizeof(double)) norms_ = DeviceBuffer(slots * per * sizeof(double));
    if (totals_.size() < slots) totals_.resize(slots);  // the first step's, then reused
    if (on_device_.size() < slots) on_device_.resize(slots);
    auto* base = static_cast<double*>(norms_.get());
    for (std::size_t i = 0; i < slots; ++i) {
      on_device_[i] = n[i] > 0 && resident(x[i], n[i]);
      if (on_device_[i]) check(cuda::squared_norm(x[i], n[i], base + i * per, ctx_->stream()), "squared norm");
    }
    check(cudaMemcpy2DAsync(totals_.data(), sizeof(double), base + per - 1, per * sizeof(double), sizeof(double), slots,
                            cudaMemcpyDeviceToHost, ctx_->stream()),
          "copying the squared norms");
    ctx_->finish();
    for (std::size_t i = 0; i < slots; ++i) out[i] = on_device_[i] ? totals_[i] : host_vectors().squared_norm(x[i], n[i]);
  }

  void sgd(const SgdUpdate& u, float* w, const float* g, float* momentum, int64_t n) override {
    if (!resident(w, n) || !resident(g, n) || (momentum && !resident(momentum, n)))
      return host().sgd(u, w, g, momentum, n);
    ctx_->use();
    check(cuda::sgd(u, w, g, momentum, n, ctx_->stream()), "sgd");
    done();
  }

  void adam(const AdamUpdate& u, float* w, const float* g, float* m, float* v, int64_t n) override {
    if (!resident(w, n) || !resident(g, n) || !resident(m, n) || !resident(v, n))
      return host().adam(u, w, g, m, v, n);
    ctx_->use();
    check(cuda::adam(u, w, g, m, v, n, ctx_->stream()), "adam");
    done();
  }

  void wait() override { ctx_->wait(); }

 private:
  // The host loops, for operands not all managed. A managed one among them may still be
  // written or read by calls queued ahead (calls_run_ahead()): those finish first.
  VectorKernel& host() const {
    if (calls_run_ahead()) ctx_->finish();
    return host_vectors();
  }
  // The end of a pass on managed tensors alone: it may run ahead (calls_run_ahead()).
  void done() const {
    if (!calls_run_ahead()) ctx_->finish();
  }

  std::shared_ptr<Context> ctx_;
  std::mutex scratch_mu_;
  DeviceBuffer scratch_;  // the norm's partial sums and total
  DeviceBuffer norms_;    // squared_norms' slots, grown to the most arrays asked at once
  std::vector<double> totals_;
  std::vector<char> on_device_;
};

}  // namespace

std::unique_ptr<VectorKernel> make_vectors(std::shared_ptr<Context> ctx) {
  return std::make_unique<CudaVectors>(std::move(ctx));
}

}  // namespace tandem::cuda
