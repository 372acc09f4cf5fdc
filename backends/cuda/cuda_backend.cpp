// The cuda backend's kernels. Today tandem's tensors live in host memory (core/tensor.h), so
// each call copies its inputs to device buffers made with the kernel, runs there and copies
// its outputs back; weights are copied only when their version changes. What keeps weights,
// gradients and optimizer state on the device is the next step (issue 17's note).
#include "backends/cuda/cuda_backend.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "backends/cuda/cuda_batch_norm.h"
#include "backends/cuda/cuda_budget.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/cuda_conv2d.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_pool.h"
#include "core/error.h"

namespace tandem {
namespace {

using cuda::Context;
using cuda::DeviceBuffer;
using cuda::DeviceWeights;
using cuda::check;
using cuda::down;
using cuda::up;
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
    ctx_->use();
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    weights_.update(*ctx_, w);
    ctx_->put(x_.get(), x, x_.bytes());
    if (weights_.bias()) check(cuda::bias_rows(weights_.bias(), y_.f(), g_.batch, G * O, ctx_->stream()), "bias");
    // y_g[batch, O] = x_g[batch, I] w_g[O, I]^T
    ctx_->gemm(false, true, g_.batch, O, I, x_.f(), G * I, I, weights_.weight(), I, O * I,
               weights_.bias() ? 1.0f : 0.0f, y_.f(), G * O, O, G);
    ctx_->get(y, y_.get(), y_.bytes());
    ctx_->finish();
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    ctx_->use();
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    weights_.update(*ctx_, w);
    ctx_->put(y_.get(), dy, y_.bytes());
    // dx_g[batch, I] = dy_g[batch, O] w_g[O, I]
    ctx_->gemm(false, false, g_.batch, I, O, y_.f(), G * O, O, weights_.weight(), I, O * I, 0.0f, x_.f(), G * I, I, G);
    ctx_->get(dx, x_.get(), x_.bytes());
    ctx_->finish();
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    ctx_->use();
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    ctx_->put(x_.get(), x, x_.bytes());
    ctx_->put(y_.get(), dy, y_.bytes());
    // dw_g[O, I] = dy_g[batch, O]^T x_g[batch, I]
    ctx_->gemm(true, false, O, I, g_.batch, y_.f(), G * O, O, x_.f(), G * I, I, 0.0f, dw_.f(), I, O * I, G);
    ctx_->get(dw, dw_.get(), dw_.bytes());
    if (db) {
      ctx_->column_sums(y_.f(), ones_.f(), db_.f(), g_.batch, G * O);
      ctx_->get(db, db_.get(), db_.bytes());
    }
    ctx_->finish();
  }

 private:
  Shared ctx_;
  GroupedLinearGeometry g_;
  DeviceWeights weights_;
  DeviceBuffer x_, y_, dw_, db_, ones_;  // x_ also holds dx, y_ also dy
};

// Elementwise, row and pooling kernels: each call one staged call (Context::staged) through
// device buffers made with the kernel.
class CudaRelu final : public ReluKernel {
 public:
  CudaRelu(Shared ctx, int64_t n) : ctx_(cuda::bound(std::move(ctx))), n_(n), a_(floats(n)), b_(floats(n)), c_(floats(n)) {}
  void forward(const float* x, float* y) override {
    ctx_->staged({up(a_, x)}, [&] { check(cuda::relu_forward(a_.f(), b_.f(), n_, ctx_->stream()), "relu"); },
                 {down(y, b_)});
  }
  void backward(const float* y, const float* dy, float* dx) override {
    ctx_->staged({up(a_, y), up(b_, dy)},
                 [&] { check(cuda::relu_backward(a_.f(), b_.f(), c_.f(), n_, ctx_->stream()), "relu backward"); },
                 {down(dx, c_)});
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
    ctx_->staged({up(x_, x)},
                 [&] { check(cuda::activation_forward(kind_, x_.f(), y_.f(), n_, ctx_->stream()), "activation"); },
                 {down(y, y_)});
  }
  void backward(const float* x, const float* y, const float* dy, float* dx) override {
    ctx_->staged({up(x_, x), up(y_, y), up(dy_, dy)}, [&] {
      check(cuda::activation_backward(kind_, x_.f(), y_.f(), dy_.f(), dx_.f(), n_, ctx_->stream()), "activation backward");
    }, {down(dx, dx_)});
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
    ctx_->staged({up(a_, a), up(b_, b)},
                 [&] { check(cuda::add(a_.f(), b_.f(), a_.f(), n_, ctx_->stream()), "add"); }, {down(y, a_)});
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
    ctx_->staged({up(a_, x)},
                 [&] { check(cuda::softmax_forward(a_.f(), b_.f(), rows_, c_, ctx_->stream()), "softmax"); },
                 {down(y, b_)});
  }
  void backward(const float* y, const float* dy, float* dx) override {
    ctx_->staged({up(a_, y), up(b_, dy)}, [&] {
      check(cuda::softmax_backward(a_.f(), b_.f(), d_.f(), rows_, c_, ctx_->stream()), "softmax backward");
    }, {down(dx, d_)});
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
    ctx_->staged({up(x_, x)}, [&] {
      check(cuda::global_avg_pool_forward(x_.f(), y_.f(), g_.batch, g_.in_h * g_.in_w, g_.channels, ctx_->stream()),
            "global average pool");
    }, {down(y, y_)});
  }
  void backward(const float* dy, float* dx) override {
    ctx_->staged({up(y_, dy)}, [&] {
      check(cuda::global_avg_pool_backward(y_.f(), x_.f(), g_.batch, g_.in_h * g_.in_w, g_.channels, ctx_->stream()),
            "global average pool backward");
    }, {down(dx, x_)});
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
    ctx_->staged({up(x_, x)},
                 [&] { check(cuda::max_pool_forward(g_, x_.f(), y_.f(), arg_.i(), ctx_->stream()), "max pool"); },
                 {down(y, y_), down(stash, arg_)});
  }
  void backward(const float* dy, const void* stash, float* dx) override {
    ctx_->staged({up(y_, dy), up(arg_, stash)}, [&] {
      check(cuda::max_pool_backward(g_, y_.f(), arg_.i(), x_.f(), ctx_->stream()), "max pool backward");
    }, {down(dx, x_)});
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
    ctx_->staged({up(x_, x)},
                 [&] { check(cuda::avg_pool_forward(g_, x_.f(), y_.f(), ctx_->stream()), "average pool"); },
                 {down(y, y_)});
  }
  void backward(const float* dy, float* dx) override {
    ctx_->staged({up(y_, dy)},
                 [&] { check(cuda::avg_pool_backward(g_, y_.f(), x_.f(), ctx_->stream()), "average pool backward"); },
                 {down(dx, x_)});
  }

 private:
  Shared ctx_;
  Pool2dGeometry g_;
  DeviceBuffer x_, y_;
};

// Batch normalisation (cuda_batch_norm.cu): x and the per-channel vectors copied up, y (and in
// training the statistics) copied down; backward likewise with dy, dx and the parameter gradients.
class CudaBatchNorm final : public BatchNormKernel {
 public:
  CudaBatchNorm(Shared ctx, const BatchNormGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), x_(floats(g.rows * g.channels)), y_(floats(g.rows * g.channels)),
        dx_(floats(g.rows * g.channels)), gamma_(floats(g.channels)), beta_(floats(g.channels)),
        mean_(floats(g.channels)), inv_std_(floats(g.channels)), var_(floats(g.channels)),
        partials_(cuda::batch_norm_partials(g.rows, g.channels) * sizeof(double)) {}

  void forward(const float* x, const float* gamma, const float* beta, bool training, float* mean, float* inv_std,
               float* var, float* y) override {
    ctx_->use();
    ctx_->put(x_.get(), x, x_.bytes());
    ctx_->put(gamma_.get(), gamma, gamma_.bytes());
    ctx_->put(beta_.get(), beta, beta_.bytes());
    if (training) {
      check(cuda::batch_norm_statistics(x_.f(), static_cast<double*>(partials_.get()), mean_.f(), var_.f(),
                                        inv_std_.f(), g_.rows, g_.channels, g_.eps, ctx_->stream()),
            "batch norm statistics");
    } else {
      ctx_->put(mean_.get(), mean, mean_.bytes());
      ctx_->put(inv_std_.get(), inv_std, inv_std_.bytes());
    }
    check(cuda::batch_norm_normalize(x_.f(), mean_.f(), inv_std_.f(), gamma_.f(), beta_.f(), y_.f(), g_.rows,
                                     g_.channels, ctx_->stream()),
          "batch norm");
    ctx_->get(y, y_.get(), y_.bytes());
    if (training) {
      ctx_->get(mean, mean_.get(), mean_.bytes());
      ctx_->get(inv_std, inv_std_.get(), inv_std_.bytes());
      ctx_->get(var, var_.get(), var_.bytes());
    }
    ctx_->finish();
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* inv_std,
                bool training, float* dx, float* dgamma, float* dbeta) override {
    ctx_->use();
    ctx_->put(x_.get(), x, x_.bytes());
    ctx_->put(y_.get(), dy, y_.bytes());
    ctx_->put(gamma_.get(), gamma, gamma_.bytes());
    ctx_->put(mean_.get(), mean, mean_.bytes());
    ctx_->put(inv_std_.get(), inv_std, inv_std_.bytes());
    // dgamma into var_, dbeta into beta_: neither is read again in this call.
    check(cuda::batch_norm_backward(x_.f(), y_.f(), gamma_.f(), mean_.f(), inv_std_.f(), training,
                                    static_cast<double*>(partials_.get()), dx ? dx_.f() : nullptr, var_.f(), beta_.f(),
                                    g_.rows, g_.channels, ctx_->stream()),
          "batch norm backward");
    if (dx) ctx_->get(dx, dx_.get(), dx_.bytes());
    ctx_->get(dgamma, var_.get(), var_.bytes());
    ctx_->get(dbeta, beta_.get(), beta_.bytes());
    ctx_->finish();
  }

 private:
  Shared ctx_;
  BatchNormGeometry g_;
  DeviceBuffer x_, y_, dx_, gamma_, beta_, mean_, inv_std_, var_, partials_;
};

class CudaLayerNorm final : public LayerNormKernel {
 public:
  CudaLayerNorm(Shared ctx, const LayerNormGeometry& g)
      : ctx_(cuda::bound(std::move(ctx))), g_(g), x_(floats(g.rows * g.features)), y_(floats(g.rows * g.features)),
        dx_(floats(g.rows * g.features)), gamma_(floats(g.features)), beta_(floats(g.features)),
        mean_(floats(g.rows)), var_(floats(g.rows)), ones_(cuda::device_ones(*ctx_, g.rows)) {}
  void forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* var) override {
    ctx_->staged({up(x_, x), up(gamma_, gamma), up(beta_, beta)}, [&] {
      check(cuda::layer_norm_forward(x_.f(), gamma_.f(), beta_.f(), y_.f(), mean_.f(), var_.f(), g_.rows, g_.features,
                                     g_.eps, ctx_->stream()),
            "layer norm");
    }, {down(y, y_), down(mean, mean_), down(var, var_)});
  }
  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* var, float* dx,
                float* dgamma, float* dbeta) override {
    ctx_->use();
    ctx_->put(x_.get(), x, x_.bytes());
    ctx_->put(y_.get(), dy, y_.bytes());
    ctx_->put(gamma_.get(), gamma, gamma_.bytes());
    ctx_->put(mean_.get(), mean, mean_.bytes());
    ctx_->put(var_.get(), var, var_.bytes());
    if (dx) {
      check(cuda::layer_norm_backward_data(x_.f(), y_.f(), gamma_.f(), mean_.f(), var_.f(), dx_.f(), g_.rows,
                                           g_.features, g_.eps, ctx_->stream()),
            "layer norm backward");
      ctx_->get(dx, dx_.get(), dx_.bytes());
    }
    // dgamma: column sums of dy * xhat (made in x_, read no more), into gamma_ (likewise);
    // dbeta: dy's, into beta_. Stream order runs dx's kernel, which reads x_, first.
    check(cuda::layer_norm_dy_xhat(x_.f(), y_.f(), mean_.f(), var_.f(), x_.f(), g_.rows, g_.features, g_.eps,
                                   ctx_->stream()),
          "layer norm parameter gradients");
    ctx_->column_sums(x_.f(), ones_.f(), gamma_.f(), g_.rows, g_.features);
    ctx_->column_sums(y_.f(), ones_.f(), beta_.f(), g_.rows, g_.features);
    ctx_->get(dgamma, gamma_.get(), gamma_.bytes());
    ctx_->get(dbeta, beta_.get(), beta_.bytes());
    ctx_->finish();
  }

 private:
  Shared ctx_;
  LayerNormGeometry g_;
  DeviceBuffer x_, y_, dx_, gamma_, beta_, mean_, var_, ones_;
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
    ctx_->use();
    ctx_->put(q_.get(), q, q_.bytes());
    ctx_->put(k_.get(), k, k_.bytes());
    ctx_->put(v_.get(), v, v_.bytes());
    if (mask) ctx_->put(mask_.get(), mask, mask_.bytes());
    per_sample(T, T, dh, {q_.f(), Tokens, false}, {k_.f(), Tokens, true}, p_.f(), Scores);  // q k^T
    check(cuda::attention_softmax(p_.f(), mask ? mask_.f() : nullptr, g_.batch, g_.heads, T, scale(), g_.causal,
                                  ctx_->stream()),
          "attention softmax");
    per_sample(T, dh, T, {p_.f(), Scores, false}, {v_.f(), Tokens, false}, out_.f(), Tokens);  // P v
    ctx_->get(out, out_.get(), out_.bytes());
    ctx_->get(probs, p_.get(), p_.bytes());
    ctx_->finish();
  }

  void backward(const float* q, const float* k, const float* v, const float* probs, const float* dout, float* dq,
                float* dk, float* dv) override {
    const int64_t T = g_.tokens, dh = g_.head_dim;
    ctx_->use();
    ctx_->put(q_.get(), q, q_.bytes());
    ctx_->put(k_.get(), k, k_.bytes());
    ctx_->put(v_.get(), v, v_.bytes());
    ctx_->put(p_.get(), probs, p_.bytes());
    ctx_->put(out_.get(), dout, out_.bytes());
    // Each gradient asked for: computed into the spare buffer, copied out, waited for.
    auto gradient = [&](float* host, Operand a, Operand b) {
      if (!host) return;
      per_sample(T, dh, T, a, b, spare().f(), Tokens);
      ctx_->get(host, spare().get(), spare().bytes());
      ctx_->finish();
    };
    per_sample(T, T, dh, {out_.f(), Tokens, false}, {v_.f(), Tokens, true}, dp_.f(), Scores);  // dP = dout v^T
    gradient(dv, {p_.f(), Scores, true}, {out_.f(), Tokens, false});                          // P^T dout
    check(cuda::attention_softmax_backward(p_.f(), dp_.f(), g_.batch * g_.heads * T, T, scale(), ctx_->stream()),
          "attention softmax backward");                                                       // dP -> dS
    gradient(dq, {dp_.f(), Scores, false}, {k_.f(), Tokens, false});                          // dS k
    gradient(dk, {dp_.f(), Scores, true}, {q_.f(), Tokens, false});                           // dS^T q
    ctx_->finish();  // reports an error of the work above when no gradient was asked
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
  // One device buffer of q's size for a gradient on its way out (each is copied back and
  // waited for before the next reuses it); made on first use.
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
  CudaBackend() : ctx_(std::make_shared<Context>()) {}
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

 private:
  Shared ctx_;
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
             " MiB), sessions' memory budget ", budget ? cat(budget >> 20, " MiB") : std::string("none"));
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

namespace {

// Large tensors page-locked (core/tensor.h), so that the staged copies of every kernel above
// run by DMA. TANDEM_CUDA_PIN=0 leaves them pageable (to measure the difference). The thread
// that makes a tensor may never have used the GPU: it registers on the chosen device, not on
// device 0 by default, and portably (for every context).
bool pin_host(void* p, std::size_t bytes) {
  if (cudaSetDevice(cuda::chosen_device()) == cudaSuccess &&
      cudaHostRegister(p, bytes, cudaHostRegisterPortable) == cudaSuccess)
    return true;
  cudaGetLastError();  // not sticky, but clear it: the next launch's check must not see it
  return false;
}
void unpin_host(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}
constexpr TensorPinning kPinning{pin_host, unpin_host};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  if (const std::string why = cuda_device_problem(); !why.empty())
    fail("cuda", cat(why, "; this machine can train on onednn (--backend onednn)"));
  auto backend = std::make_unique<CudaBackend>();
  // From the first cuda backend on, for the rest of the process (a cloud serves on one backend).
  if (const char* pin = std::getenv("TANDEM_CUDA_PIN"); !pin || std::string_view(pin) != "0") set_tensor_pinning(&kPinning);
  return backend;
}

}  // namespace tandem
