// Linear through XNNPACK's fully connected operator (all three passes are one GEMM each).
#include <limits>

#include "backends/xnnpack/xnnpack_common.h"

namespace tandem::xnn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// dy^T for backward_weights, read only inside the call: every linear kernel a thread runs
// shares one, grown to the largest asked for, instead of each trained layer keeping its own
// per row count (spam-bert's front: 18 MiB at 8 mails of 128 tokens).
float* transposed_dy_scratch(int64_t floats) {
  thread_local std::unique_ptr<float, AlignedFree> scratch;
  thread_local int64_t capacity = 0;
  if (floats > capacity) {
    scratch.reset();
    scratch = input_scratch(floats);
    capacity = floats;
  }
  return scratch.get();
}

class XnnLinear final : public LinearKernel {
 public:
  XnnLinear(std::shared_ptr<const Context> ctx, const LinearGeometry& g)
      : ctx_(std::move(ctx)), g_(g), where_(g.str()), packing_(ctx_->linear_packing(g.weights_id)) {
    if (g.batch < 1 || g.in_features < 1 || g.out_features < 1) fail("xnnpack", cat("invalid geometry: ", where_));
  }

  // y[N, O] = x[N, I] W[O, I]^T + b: weights in XNNPACK's own [out, in] layout.
  void forward(const float* x, const WeightsView& w, float* y) override {
    PackedOperator& fwd = packing_->forward;
    if (!fwd.holds(w, /*uses_bias=*/true)) {
      require_weights(w);
      fwd.op.reset();  // free the old packing before making the new one
      xnn_operator_t op = nullptr;
      check(xnn_create_fully_connected_nc_f32(in(), out(), in(), out(), w.weight, w.bias, -kInf, kInf, 0, &op),
            "xnn_create_fully_connected_nc_f32 (forward)", where_);
      fwd.reset(op, w);
    }
    run(fwd.op.get(), batch(), x, y, "forward");
  }

  // dx[N, I] = dy[N, O] W[O, I]: W read as [in = O, out = I] (XNN_FLAG_TRANSPOSE_WEIGHTS).
  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    PackedOperator& bwd = packing_->backward_data;
    if (!bwd.holds(w, /*uses_bias=*/false)) {
      require_weights(w);
      bwd.op.reset();
      xnn_operator_t op = nullptr;
      check(xnn_create_fully_connected_nc_f32(out(), in(), out(), in(), w.weight, nullptr, -kInf, kInf,
                                              XNN_FLAG_TRANSPOSE_WEIGHTS, &op),
            "xnn_create_fully_connected_nc_f32 (backward_data)", where_);
      bwd.reset(op, w);
    }
    run(bwd.op.get(), batch(), dy, dx, "backward_data");
  }

  // dW[O, I] = dy^T[O, N] x[N, I]: dy transposed by hand, x packed as weights [in = N, out = I]
  // (so the operator is made per call: x changes every call). db = column sums of dy.
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    float* dyt = transposed_dy_scratch(g_.out_features * g_.batch);
    transpose(dy, g_.batch, g_.out_features, dyt);
    xnn_operator_t created = nullptr;
    check(xnn_create_fully_connected_nc_f32(batch(), in(), batch(), in(), x, nullptr, -kInf, kInf,
                                            XNN_FLAG_TRANSPOSE_WEIGHTS, &created),
          "xnn_create_fully_connected_nc_f32 (backward_weights)", where_);
    Operator op(created);
    run(op.get(), out(), dyt, dw, "backward_weights");
    if (db) column_sums(dy, g_.batch, g_.out_features, db);
  }

 private:
  size_t batch() const { return static_cast<size_t>(g_.batch); }
  size_t in() const { return static_cast<size_t>(g_.in_features); }
  size_t out() const { return static_cast<size_t>(g_.out_features); }

  void require_weights(const WeightsView& w) const {
    if (w.weight == nullptr) fail("xnnpack", cat("no weights given for ", where_));
  }

  void run(xnn_operator_t op, size_t rows, const float* input, float* output, const char* pass) const {
    pthreadpool_t pool = ctx_->threadpool();
    xnn_status status = xnn_setup_fully_connected_nc_f32(op, rows, input, output, pool);
    if (status != xnn_status_success) [[unlikely]]
      fail_status(cat("xnn_setup_fully_connected_nc_f32 (", pass, ")").c_str(), status, where_);
    status = xnn_run_operator(op, pool);
    if (status != xnn_status_success) [[unlikely]]
      fail_status(cat("xnn_run_operator (linear ", pass, ")").c_str(), status, where_);
  }

  std::shared_ptr<const Context> ctx_;
  LinearGeometry g_;
  std::string where_;
  // The layer's packed weights, shared with its kernels at other row counts (each run sets
  // the operator up for its own rows).
  std::shared_ptr<Context::LinearPacking> packing_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(std::shared_ptr<const Context> ctx, const LinearGeometry& g) {
  return std::make_unique<XnnLinear>(std::move(ctx), g);
}

}  // namespace tandem::xnn
