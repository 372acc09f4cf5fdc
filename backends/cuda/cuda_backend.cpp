// The cuda backend's kernels. A kernel gets pointers to tensors: those in managed memory
// (TANDEM_CUDA_MEMORY=managed, cuda_memory.h) it uses in place; any other operand it copies
// to a device buffer made with the kernel and its outputs back (cuda::Call); weights are
// copied only when their version changes. Gradient sums and the optimizers' updates run on the
// device for managed tensors (cuda_vector_kernel.h).
#include "backends/cuda/cuda_backend.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "backends/cuda/cuda_batch_norm.h"
#include "backends/cuda/cuda_budget.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/cuda_conv2d.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_memory.h"
#include "backends/cuda/cuda_pool.h"
#include "backends/cuda/cuda_vector_kernel.h"
#include "core/dropout_bits.h"
#include "core/error.h"

namespace tandem {
namespace {

using cuda::Call;
using cuda::Context;
using cuda::DeviceBuffer;
using cuda::DeviceWeights;
using cuda::check;
using Shared = std::shared_ptr<Context>;

std::size_t floats(int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); }

// G linear layers side by side (GroupedLinearGeometry; a plain linear is G = 1): one strided
// batched GEMM a pass, the bias as the rows a forward GEMM adds onto, its gradient as column sums.
class CudaGroupedLinear final : public LinearKernel, public GroupedLinearKernel {
 public:
  CudaGroupedLinear(Shared ctx, const GroupedLinearGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), weights_(static_cast<std::size_t>(g.groups * g.out_features * g.in_features),
                                             g.bias ? static_cast<std::size_t>(g.groups * g.out_features) : 0),
        x_(floats(g.batch * g.groups * g.in_features)), y_(floats(g.batch * g.groups * g.out_features)),
        dw_(floats(g.groups * g.out_features * g.in_features)), db_(floats(g.groups * g.out_features)),
        ones_(g.bias ? cuda::device_ones(*ctx_, g.batch) : DeviceBuffer()) {}

  void forward(const float* x, const WeightsView& w, float* y) override {
    Call call(*ctx_);
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    weights_.update(call, w);
    const float* dx = call.in(x, x_);
    float* dy = call.out(y, y_);
    if (weights_.bias()) check(cuda::bias_rows(weights_.bias(), dy, g_.batch, G * O, ctx_->stream()), "bias");
    // y_g[batch, O] = x_g[batch, I] w_g[O, I]^T
    ctx_->gemm(false, true, g_.batch, O, I, dx, G * I, I, weights_.weight(), I, O * I, weights_.bias() ? 1.0f : 0.0f, dy,
               G * O, O, G);
    call.end();
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    Call call(*ctx_);
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    weights_.update(call, w);
    const float* d_dy = call.in(dy, y_);
    float* d_dx = call.out(dx, x_);
    // dx_g[batch, I] = dy_g[batch, O] w_g[O, I]
    ctx_->gemm(false, false, g_.batch, I, O, d_dy, G * O, O, weights_.weight(), I, O * I, 0.0f, d_dx, G * I, I, G);
    call.end();
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    Call call(*ctx_);
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    const float* d_x = call.in(x, x_);
    const float* d_dy = call.in(dy, y_);
    // dw_g[O, I] = dy_g[batch, O]^T x_g[batch, I]
    ctx_->gemm(true, false, O, I, g_.batch, d_dy, G * O, O, d_x, G * I, I, 0.0f, call.out(dw, dw_), I, O * I, G);
    if (db) ctx_->column_sums(d_dy, ones_.f(), call.out(db, db_), g_.batch, G * O);
    call.end();
  }

 private:
  Shared ctx_;
  GroupedLinearGeometry g_;
  DeviceWeights weights_;
  DeviceBuffer x_, y_, dw_, db_, ones_;  // x_ also stages dx, y_ also dy
};

// Elementwise, row and pooling kernels: each call's operands in place or staged (cuda::Call)
// through device buffers made with the kernel.
class CudaRelu final : public ReluKernel {
 public:
  CudaRelu(Shared ctx, int64_t n) : ctx_(cuda::bound(std::move(ctx))), n_(n), a_(floats(n)), b_(floats(n)), c_(floats(n)) {}
  void forward(const float* x, float* y) override {
    Call call(*ctx_);
    const float* dx = call.in(x, a_);
    check(cuda::relu_forward(dx, call.out(y, b_), n_, ctx_->stream()), "relu");
    call.end();
  }
  void backward(const float* y, const float* dy, float* dx) override {
    Call call(*ctx_);
    const float* d_y = call.in(y, a_);
    const float* d_dy = call.in(dy, b_);
    check(cuda::relu_backward(d_y, d_dy, call.out(dx, c_), n_, ctx_->stream()), "relu backward");
    call.end();
  }

 private:
  Shared ctx_;
  int64_t n_;
  DeviceBuffer a_, b_, c_;
};

class CudaActivation final : public ActivationKernel {
 public:
  CudaActivation(Shared ctx, cuda::ActivationKind kind, int64_t n)
      : ctx_(cuda::bound(std::move(ctx))), kind_(kind), n_(n), x_(floats(n)), y_(floats(n)), dy_(floats(n)),
        dx_(floats(n)) {}
  void forward(const float* x, float* y) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    check(cuda::activation_forward(kind_, d_x, call.out(y, y_), n_, ctx_->stream()), "activation");
    call.end();
  }
  void backward(const float* x, const float* y, const float* dy, float* dx) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    const float* d_y = call.in(y, y_);
    const float* d_dy = call.in(dy, dy_);
    check(cuda::activation_backward(kind_, d_x, d_y, d_dy, call.out(dx, dx_), n_, ctx_->stream()), "activation backward");
    call.end();
  }

 private:
  Shared ctx_;
  cuda::ActivationKind kind_;
  int64_t n_;
  DeviceBuffer x_, y_, dy_, dx_;
};

class CudaAdd final : public AddKernel {
 public:
  CudaAdd(Shared ctx, int64_t n) : ctx_(cuda::bound(std::move(ctx))), n_(n), a_(floats(n)), b_(floats(n)) {}
  void forward(const float* a, const float* b, float* y) override {
    Call call(*ctx_);
    const float* d_a = call.in(a, a_);
    const float* d_b = call.in(b, b_);
    // A staged y is written over a_ (elementwise: each element read before it is written).
    check(cuda::add(d_a, d_b, call.out(y, a_), n_, ctx_->stream()), "add");
    call.end();
  }

 private:
  Shared ctx_;
  int64_t n_;
  DeviceBuffer a_, b_;
};

class CudaSoftmax final : public SoftmaxKernel {
 public:
  CudaSoftmax(Shared ctx, int64_t rows, int64_t channels)
      : ctx_(cuda::bound(std::move(ctx))), rows_(rows), c_(channels), a_(floats(rows * channels)),
        b_(floats(rows * channels)), d_(floats(rows * channels)) {}
  void forward(const float* x, float* y) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, a_);
    check(cuda::softmax_forward(d_x, call.out(y, b_), rows_, c_, ctx_->stream()), "softmax");
    call.end();
  }
  void backward(const float* y, const float* dy, float* dx) override {
    Call call(*ctx_);
    const float* d_y = call.in(y, a_);
    const float* d_dy = call.in(dy, b_);
    check(cuda::softmax_backward(d_y, d_dy, call.out(dx, d_), rows_, c_, ctx_->stream()), "softmax backward");
    call.end();
  }

 private:
  Shared ctx_;
  int64_t rows_, c_;
  DeviceBuffer a_, b_, d_;
};

class CudaGlobalAvgPool final : public GlobalAvgPoolKernel {
 public:
  CudaGlobalAvgPool(Shared ctx, const GlobalPoolGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), x_(floats(g.batch * g.in_h * g.in_w * g.channels)),
        y_(floats(g.batch * g.channels)) {}
  void forward(const float* x, float* y) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    check(cuda::global_avg_pool_forward(d_x, call.out(y, y_), g_.batch, g_.in_h * g_.in_w, g_.channels, ctx_->stream()),
          "global average pool");
    call.end();
  }
  void backward(const float* dy, float* dx) override {
    Call call(*ctx_);
    const float* d_dy = call.in(dy, y_);
    check(cuda::global_avg_pool_backward(d_dy, call.out(dx, x_), g_.batch, g_.in_h * g_.in_w, g_.channels,
                                         ctx_->stream()),
          "global average pool backward");
    call.end();
  }

 private:
  Shared ctx_;
  GlobalPoolGeometry g_;
  DeviceBuffer x_, y_;
};

// The stash holds each output's argmax as the reference backend's (int32, iy * in_w + ix).
class CudaMaxPool2d final : public MaxPool2dKernel {
 public:
  CudaMaxPool2d(Shared ctx, const Pool2dGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), outputs_(g.batch * g.out_h() * g.out_w() * g.channels),
        x_(floats(g.batch * g.in_h * g.in_w * g.channels)), y_(floats(outputs_)),
        arg_(static_cast<std::size_t>(outputs_) * sizeof(int32_t)) {}
  std::size_t stash_bytes() const override { return arg_.bytes(); }
  void forward(const float* x, float* y, void* stash) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    float* d_y = call.out(y, y_);
    check(cuda::max_pool_forward(g_, d_x, d_y, call.out(static_cast<int32_t*>(stash), arg_), ctx_->stream()),
          "max pool");
    call.end();
  }
  void backward(const float* dy, const void* stash, float* dx) override {
    Call call(*ctx_);
    const float* d_dy = call.in(dy, y_);
    const int32_t* arg = call.in(static_cast<const int32_t*>(stash), arg_);
    check(cuda::max_pool_backward(g_, d_dy, arg, call.out(dx, x_), ctx_->stream()), "max pool backward");
    call.end();
  }

 private:
  Shared ctx_;
  Pool2dGeometry g_;
  int64_t outputs_;
  DeviceBuffer x_, y_, arg_;
};

class CudaAvgPool2d final : public AvgPool2dKernel {
 public:
  CudaAvgPool2d(Shared ctx, const Pool2dGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), x_(floats(g.batch * g.in_h * g.in_w * g.channels)),
        y_(floats(g.batch * g.out_h() * g.out_w() * g.channels)) {}
  void forward(const float* x, float* y) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    check(cuda::avg_pool_forward(g_, d_x, call.out(y, y_), ctx_->stream()), "average pool");
    call.end();
  }
  void backward(const float* dy, float* dx) override {
    Call call(*ctx_);
    const float* d_dy = call.in(dy, y_);
    check(cuda::avg_pool_backward(g_, d_dy, call.out(dx, x_), ctx_->stream()), "average pool backward");
    call.end();
  }

 private:
  Shared ctx_;
  Pool2dGeometry g_;
  DeviceBuffer x_, y_;
};

// Batch normalisation (cuda_batch_norm.cu). The statistics are inputs in evaluation and outputs
// in training; backward's parameter gradients are staged through dgamma_ and dbeta_.
class CudaBatchNorm final : public BatchNormKernel {
 public:
  CudaBatchNorm(Shared ctx, const BatchNormGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), x_(floats(g.rows * g.channels)), y_(floats(g.rows * g.channels)),
        dx_(floats(g.rows * g.channels)), gamma_(floats(g.channels)), beta_(floats(g.channels)),
        mean_(floats(g.channels)), inv_std_(floats(g.channels)), var_(floats(g.channels)),
        dgamma_(floats(g.channels)), dbeta_(floats(g.channels)),
        partials_(cuda::batch_norm_partials(g.rows, g.channels) * sizeof(double)) {}

  void forward(const float* x, const float* gamma, const float* beta, bool training, float* mean, float* inv_std,
               float* var, float* y) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    const float* d_gamma = call.in(gamma, gamma_);
    const float* d_beta = call.in(beta, beta_);
    const float* d_mean;
    const float* d_inv_std;
    if (training) {
      float* m = call.out(mean, mean_);
      float* s = call.out(inv_std, inv_std_);
      check(cuda::batch_norm_statistics(d_x, static_cast<double*>(partials_.get()), m, call.out(var, var_), s, g_.rows,
                                        g_.channels, g_.eps, ctx_->stream()),
            "batch norm statistics");
      d_mean = m;
      d_inv_std = s;
    } else {
      d_mean = call.in(mean, mean_);
      d_inv_std = call.in(inv_std, inv_std_);
    }
    check(cuda::batch_norm_normalize(d_x, d_mean, d_inv_std, d_gamma, d_beta, call.out(y, y_), g_.rows, g_.channels,
                                     ctx_->stream()),
          "batch norm");
    call.end();
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* inv_std,
                bool training, float* dx, float* dgamma, float* dbeta) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    const float* d_dy = call.in(dy, y_);
    const float* d_gamma = call.in(gamma, gamma_);
    const float* d_mean = call.in(mean, mean_);
    const float* d_inv_std = call.in(inv_std, inv_std_);
    check(cuda::batch_norm_backward(d_x, d_dy, d_gamma, d_mean, d_inv_std, training,
                                    static_cast<double*>(partials_.get()), call.out(dx, dx_),
                                    call.out(dgamma, dgamma_), call.out(dbeta, dbeta_), g_.rows, g_.channels,
                                    ctx_->stream()),
          "batch norm backward");
    call.end();
  }

 private:
  Shared ctx_;
  BatchNormGeometry g_;
  DeviceBuffer x_, y_, dx_, gamma_, beta_, mean_, inv_std_, var_, dgamma_, dbeta_, partials_;
};

class CudaLayerNorm final : public LayerNormKernel {
 public:
  CudaLayerNorm(Shared ctx, const LayerNormGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), x_(floats(g.rows * g.features)), y_(floats(g.rows * g.features)),
        dx_(floats(g.rows * g.features)), dy_xhat_(floats(g.rows * g.features)), gamma_(floats(g.features)),
        beta_(floats(g.features)), dgamma_(floats(g.features)), dbeta_(floats(g.features)), mean_(floats(g.rows)),
        var_(floats(g.rows)), ones_(cuda::device_ones(*ctx_, g.rows)) {}
  void forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* var) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    const float* d_gamma = call.in(gamma, gamma_);
    const float* d_beta = call.in(beta, beta_);
    check(cuda::layer_norm_forward(d_x, d_gamma, d_beta, call.out(y, y_), call.out(mean, mean_), call.out(var, var_),
                                   g_.rows, g_.features, g_.eps, ctx_->stream()),
          "layer norm");
    call.end();
  }
  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* var, float* dx,
                float* dgamma, float* dbeta) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    const float* d_dy = call.in(dy, y_);
    const float* d_gamma = call.in(gamma, gamma_);
    const float* d_mean = call.in(mean, mean_);
    const float* d_var = call.in(var, var_);
    if (dx)
      check(cuda::layer_norm_backward_data(d_x, d_dy, d_gamma, d_mean, d_var, call.out(dx, dx_), g_.rows, g_.features,
                                           g_.eps, ctx_->stream()),
            "layer norm backward");
    // dgamma: column sums of dy * xhat (the kernel's own scratch: x may be the caller's
    // tensor, used in place); dbeta: dy's.
    check(cuda::layer_norm_dy_xhat(d_x, d_dy, d_mean, d_var, dy_xhat_.f(), g_.rows, g_.features, g_.eps,
                                   ctx_->stream()),
          "layer norm parameter gradients");
    ctx_->column_sums(dy_xhat_.f(), ones_.f(), call.out(dgamma, dgamma_), g_.rows, g_.features);
    ctx_->column_sums(d_dy, ones_.f(), call.out(dbeta, dbeta_), g_.rows, g_.features);
    call.end();
  }

 private:
  Shared ctx_;
  LayerNormGeometry g_;
  DeviceBuffer x_, y_, dx_, dy_xhat_, gamma_, beta_, dgamma_, dbeta_, mean_, var_, ones_;
};

// The mask is made on the device from core/dropout_bits.h's stream (the reference's bits) and
// copied down to the caller's stash; backward copies it up again.
class CudaDropout final : public DropoutKernel {
 public:
  CudaDropout(Shared ctx, int64_t n)
      : ctx_(cuda::bound(std::move(ctx))), n_(n), x_(floats(n)), y_(floats(n)),
        keep_(static_cast<std::size_t>(n)) {}
  void forward(uint64_t seed, uint64_t call, float p, const float* x, float* y, uint8_t* keep) override {
    Call call_(*ctx_);
    const float* d_x = call_.in(x, x_);
    float* d_y = call_.out(y, y_);
    check(cuda::dropout_forward(dropout_base(seed, call), dropout_threshold(p), 1.0f / (1.0f - p), d_x, d_y,
                                call_.out(keep, keep_), n_, ctx_->stream()),
          "dropout");
    call_.end();
  }
  void backward(const uint8_t* keep, float scale, const float* dy, float* dx) override {
    Call call(*ctx_);
    const uint8_t* d_keep = call.in(keep, keep_);
    const float* d_dy = call.in(dy, y_);
    check(cuda::dropout_backward(d_keep, scale, d_dy, call.out(dx, x_), n_, ctx_->stream()), "dropout backward");
    call.end();
  }

 private:
  Shared ctx_;
  int64_t n_;
  DeviceBuffer x_, y_, keep_;  // x_ also stages dx, y_ also dy
};

class CudaTokenPool final : public TokenPoolKernel {
 public:
  CudaTokenPool(Shared ctx, const TokenPoolGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), x_(floats(g.batch * g.tokens * g.features)),
        w_(floats(g.batch * g.tokens)), y_(floats(g.batch * g.features)) {}
  void forward(const float* x, const float* w, float* y) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    const float* d_w = call.in(w, w_);
    check(cuda::token_pool_forward(d_x, d_w, call.out(y, y_), g_.batch, g_.tokens, g_.features, ctx_->stream()),
          "token pool");
    call.end();
  }
  void backward(const float* dy, const float* w, float* dx) override {
    Call call(*ctx_);
    const float* d_dy = call.in(dy, y_);
    const float* d_w = call.in(w, w_);
    check(cuda::token_pool_backward(d_dy, d_w, call.out(dx, x_), g_.batch, g_.tokens, g_.features, ctx_->stream()),
          "token pool backward");
    call.end();
  }

 private:
  Shared ctx_;
  TokenPoolGeometry g_;
  DeviceBuffer x_, w_, y_;  // x_ also stages dx, y_ also dy
};

class CudaMul final : public MulKernel {
 public:
  CudaMul(Shared ctx, const MulGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), a_(floats(g.batch * g.outer * g.inner)), b_(floats(g.batch * g.inner)),
        y_(floats(g.batch * g.outer * g.inner)), da_(floats(g.batch * g.outer * g.inner)), db_(floats(g.batch * g.inner)) {}
  void forward(const float* a, const float* b, float* y) override {
    Call call(*ctx_);
    const float* d_a = call.in(a, a_);
    const float* d_b = call.in(b, b_);
    check(cuda::mul_forward(d_a, d_b, call.out(y, y_), g_.batch, g_.outer, g_.inner, ctx_->stream()), "mul");
    call.end();
  }
  void backward(const float* dy, const float* a, const float* b, float* da, float* db) override {
    Call call(*ctx_);
    const float* d_dy = call.in(dy, y_);
    const float* d_a = call.in(a, a_);
    const float* d_b = call.in(b, b_);
    check(cuda::mul_backward(d_dy, d_a, d_b, da ? call.out(da, da_) : nullptr, db ? call.out(db, db_) : nullptr, g_.batch,
                             g_.outer, g_.inner, ctx_->stream()),
          "mul backward");
    call.end();
  }

 private:
  Shared ctx_;
  MulGeometry g_;
  DeviceBuffer a_, b_, y_, da_, db_;  // y_ also stages dy
};

// Per sample, the heads in one strided batched GEMM each way: scores = q k^T, then the masked
// softmax in place, out = P v; backward dP = dout v^T, dv = P^T dout, dS, dq = dS k, dk = dS^T q.
class CudaAttention final : public AttentionKernel {
 public:
  CudaAttention(Shared ctx, const AttentionGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), values_(g.batch * g.tokens * g.features()),
        scores_(g.batch * g.heads * g.tokens * g.tokens), q_(floats(values_)), k_(floats(values_)),
        v_(floats(values_)), out_(floats(values_)), mask_(floats(g.batch * g.tokens)), p_(floats(scores_)),
        dp_(floats(scores_)) {}

  void forward(const float* q, const float* k, const float* v, const float* mask, float* out, float* probs) override {
    const int64_t T = g_.tokens, dh = g_.head_dim;
    Call call(*ctx_);
    const float* d_q = call.in(q, q_);
    const float* d_k = call.in(k, k_);
    const float* d_v = call.in(v, v_);
    const float* d_mask = call.in(mask, mask_);
    float* p = call.out(probs, p_);  // the scores, then P in place
    per_sample(T, T, dh, {d_q, Tokens, false}, {d_k, Tokens, true}, p, Scores);  // q k^T
    check(cuda::attention_softmax(p, d_mask, g_.batch, g_.heads, T, scale(), g_.causal, ctx_->stream()),
          "attention softmax");
    per_sample(T, dh, T, {p, Scores, false}, {d_v, Tokens, false}, call.out(out, out_), Tokens);  // P v
    call.end();
  }

  void backward(const float* q, const float* k, const float* v, const float* probs, const float* dout, float* dq,
                float* dk, float* dv) override {
    const int64_t T = g_.tokens, dh = g_.head_dim;
    Call call(*ctx_);
    const float* d_q = call.in(q, q_);
    const float* d_k = call.in(k, k_);
    const float* d_v = call.in(v, v_);
    const float* d_p = call.in(probs, p_);
    const float* d_dout = call.in(dout, out_);
    // A gradient staged through the spare buffer is copied out and waited for before the next
    // reuses it; one in place is written where it belongs.
    auto gradient = [&](float* host, Operand a, Operand b) {
      if (!host) return;
      Call one(*ctx_);
      per_sample(T, dh, T, a, b, one.out(host, spare()), Tokens);
      one.end();
    };
    per_sample(T, T, dh, {d_dout, Tokens, false}, {d_v, Tokens, true}, dp_.f(), Scores);  // dP = dout v^T
    gradient(dv, {d_p, Scores, true}, {d_dout, Tokens, false});                           // P^T dout
    check(cuda::attention_softmax_backward(d_p, dp_.f(), g_.batch * g_.heads * T, T, scale(), ctx_->stream()),
          "attention softmax backward");                                                  // dP -> dS
    gradient(dq, {dp_.f(), Scores, false}, {d_k, Tokens, false});                         // dS k
    gradient(dk, {dp_.f(), Scores, true}, {d_q, Tokens, false});                          // dS^T q
    call.end();  // reports an error of the work above when no gradient was asked
  }

 private:
  // A GEMM operand of one sample's heads: a [tokens, heads * head_dim] matrix (Tokens: a head
  // head_dim floats after the one before, a sample tokens * features after) or the scores
  // [heads, tokens, tokens] (Scores), maybe transposed.
  enum Layout { Tokens, Scores };
  struct Operand {
    const float* p;
    Layout layout;
    bool trans;
  };
  int64_t ld(Layout l) const { return l == Tokens ? g_.features() : g_.tokens; }
  int64_t head_stride(Layout l) const { return l == Tokens ? g_.head_dim : g_.tokens * g_.tokens; }
  int64_t sample_stride(Layout l) const {
    return l == Tokens ? g_.tokens * g_.features() : g_.heads * g_.tokens * g_.tokens;
  }
  // C = op(A) op(B) for every head of every sample: one strided batched GEMM a sample.
  void per_sample(int64_t m, int64_t n, int64_t k, Operand a, Operand b, float* c, Layout c_layout) const {
    for (int64_t s = 0; s < g_.batch; ++s)
      ctx_->gemm(a.trans, b.trans, m, n, k, a.p + s * sample_stride(a.layout), ld(a.layout), head_stride(a.layout),
                 b.p + s * sample_stride(b.layout), ld(b.layout), head_stride(b.layout), 0.0f,
                 c + s * sample_stride(c_layout), ld(c_layout), head_stride(c_layout), g_.heads);
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(g_.head_dim)); }
  // One device buffer of q's size for a gradient on its way out; made on first use.
  DeviceBuffer& spare() {
    if (!spare_.get()) spare_ = DeviceBuffer(floats(values_));
    return spare_;
  }

  Shared ctx_;
  AttentionGeometry g_;
  int64_t values_, scores_;
  DeviceBuffer q_, k_, v_, out_, mask_, p_, dp_, spare_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() : ctx_(std::make_shared<Context>()), vectors_(cuda::make_vectors(ctx_)) {}
  std::string_view name() const override { return "cuda"; }

  Support supports(std::string_view op, std::span<const Shape> inputs) const override {
    cuda::ActivationKind kind;
    if (find_activation(op) && !cuda::activation_kind(op, kind))
      return Support::no(cat("the cuda backend has no kernel for the activation '", op, "' yet; use onednn"));
    return Backend::supports(op, inputs);
  }

  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dGeometry& g) override { return cuda::make_conv2d(ctx_, g); }
  std::unique_ptr<LinearKernel> linear(const LinearGeometry& g) override {
    return std::make_unique<CudaGroupedLinear>(ctx_, GroupedLinearGeometry{g.batch, 1, g.in_features, g.out_features,
                                                                           g.bias});
  }
  std::unique_ptr<GroupedLinearKernel> grouped_linear(const GroupedLinearGeometry& g) override {
    return std::make_unique<CudaGroupedLinear>(ctx_, g);
  }
  std::unique_ptr<ReluKernel> relu(int64_t elements) override { return std::make_unique<CudaRelu>(ctx_, elements); }
  std::unique_ptr<ActivationKernel> activation(const Activation& a, int64_t elements) override {
    cuda::ActivationKind kind;
    if (!cuda::activation_kind(a.name, kind))
      fail("cuda", cat("the cuda backend has no kernel for the activation '", a.name, "' yet; use onednn"));
    return std::make_unique<CudaActivation>(ctx_, kind, elements);
  }
  std::unique_ptr<MaxPool2dKernel> max_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<CudaMaxPool2d>(ctx_, g);
  }
  std::unique_ptr<AvgPool2dKernel> avg_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<CudaAvgPool2d>(ctx_, g);
  }
  std::unique_ptr<GlobalAvgPoolKernel> global_avg_pool(const GlobalPoolGeometry& g) override {
    return std::make_unique<CudaGlobalAvgPool>(ctx_, g);
  }
  std::unique_ptr<SoftmaxKernel> softmax(int64_t rows, int64_t channels) override {
    return std::make_unique<CudaSoftmax>(ctx_, rows, channels);
  }
  std::unique_ptr<AddKernel> add(int64_t elements) override { return std::make_unique<CudaAdd>(ctx_, elements); }
  std::unique_ptr<BatchNormKernel> batch_norm(const BatchNormGeometry& g) override {
    return std::make_unique<CudaBatchNorm>(ctx_, g);
  }
  std::unique_ptr<LayerNormKernel> layer_norm(const LayerNormGeometry& g) override {
    return std::make_unique<CudaLayerNorm>(ctx_, g);
  }
  std::unique_ptr<AttentionKernel> attention(const AttentionGeometry& g) override {
    return std::make_unique<CudaAttention>(ctx_, g);
  }
  std::unique_ptr<TokenPoolKernel> token_pool(const TokenPoolGeometry& g) override {
    return std::make_unique<CudaTokenPool>(ctx_, g);
  }
  std::unique_ptr<MulKernel> mul(const MulGeometry& g) override { return std::make_unique<CudaMul>(ctx_, g); }
  std::unique_ptr<DropoutKernel> dropout(int64_t elements) override {
    return std::make_unique<CudaDropout>(ctx_, elements);
  }
  VectorKernel& vectors() override { return *vectors_; }
  void wait() override { ctx_->wait(); }

 private:
  Shared ctx_;
  std::unique_ptr<VectorKernel> vectors_;
};

}  // namespace

std::string cuda_device_problem() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return cat("no CUDA device: ", cudaGetErrorString(e));
  if (count == 0) return "no CUDA device: the driver sees none";
  return "";
}

std::string cuda_device_summary() {
  if (const std::string why = cuda_device_problem(); !why.empty()) return why;
  const int device = cuda::chosen_device();
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  const std::size_t budget = cuda::device_budget().limit();
  return cat(p.name, " (device ", device, ", sm_", p.major, p.minor, ", ", static_cast<long long>(p.totalGlobalMem >> 20),
             " MiB), sessions' memory budget ", budget ? cat(budget >> 20, " MiB") : std::string("none"), "; ",
             cuda::placement_summary());
}

void set_cuda_memory_budget(std::size_t bytes) {
  if (bytes == 0) {
    if (const std::string why = cuda_device_problem(); !why.empty()) fail("cuda", why);
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, cuda::chosen_device()), "cudaGetDeviceProperties");
    bytes = p.totalGlobalMem / 10 * 9;
  }
  cuda::device_budget().set_limit(bytes);
}

GpuMemoryUse cuda_memory_use() {
  const cuda::DevicePool::Use u = cuda::device_pool().use();
  return {u.live, u.cached, u.allocations, u.reuses, cuda::device_budget().limit()};
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  if (const std::string why = cuda_device_problem(); !why.empty())
    fail("cuda", cat(why, "; this machine can train on onednn (--backend onednn)"));
  cuda::chosen_placement();  // an unknown TANDEM_CUDA_MEMORY fails before anything is made
  auto backend = std::make_unique<CudaBackend>();
  // From the first cuda backend on, for the rest of the process (a cloud serves on one backend):
  // tensors made from now on are page-locked or managed (cuda_memory.h).
  cuda::install_tensor_memory();
  return backend;
}

}  // namespace tandem
