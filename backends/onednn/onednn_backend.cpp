#include "backends/onednn/onednn_backend.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "backends/onednn/onednn_kernels.h"
#include "backends/reference/reference_backend.h"

#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#endif

namespace tandem {
namespace onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

// A forward primitive (src -> dst) and its backward (diff_dst -> diff_src), with the
// backward reading one tensor of the forward (`saved`: DNNL_ARG_SRC or DNNL_ARG_DST) or none
// (0); the memories wrap the caller's buffers per call. Shared by the unary kernels below.
class UnaryPasses {
 public:
  void build(const Context& c, const dnnl::primitive_desc_base& fwd_pd, const dnnl::primitive_desc_base& bwd_pd,
             const memory::desc& in_md, const memory::desc& out_md, int saved) {
    x_ = wrapper(c, in_md), y_ = wrapper(c, out_md), dy_ = wrapper(c, out_md), dx_ = wrapper(c, in_md);
    fwd_ = Step(c, fwd_pd, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, y_}});
    if (saved == 0) {
      bwd_ = Step(c, bwd_pd, {{DNNL_ARG_DIFF_DST, dy_}, {DNNL_ARG_DIFF_SRC, dx_}});
      return;
    }
    saved_ = wrapper(c, saved == DNNL_ARG_SRC ? in_md : out_md);
    bwd_ = Step(c, bwd_pd, {{saved, saved_}, {DNNL_ARG_DIFF_DST, dy_}, {DNNL_ARG_DIFF_SRC, dx_}});
  }
  void forward(const Context& c, const float* x, float* y) const {
    bind(x_, x);
    bind(y_, y);
    fwd_.run(c);
  }
  // `saved`: the forward's input or output, as built (ignored when the backward reads none).
  void backward(const Context& c, const float* saved, const float* dy, float* dx) const {
    if (saved_) bind(saved_, saved);
    bind(dy_, dy);
    bind(dx_, dx);
    bwd_.run(c);
  }

 private:
  memory x_, y_, saved_, dy_, dx_;
  Step fwd_, bwd_;
};

struct ReluShape {
  int64_t elements;
  std::string str() const { return cat("relu [", elements, "]"); }
};

// eltwise relu; the backward reads the forward's output (relu_use_dst_for_bwd):
// dx = dy where y > 0, else 0.
class Relu final : public ReluKernel {
 public:
  Relu(std::shared_ptr<const Context> ctx, int64_t elements) : ctx_(std::move(ctx)), shape_{elements} {
    guarded(*ctx_, "relu setup", shape_, [&] {
      const Context& c = *ctx_;
      const memory::desc md({elements}, f32, tag::x);
      const auto alg = dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
      const dnnl::primitive_attr attr = user_scratchpad();
      dnnl::eltwise_forward::primitive_desc fwd_pd({dnnl::prop_kind::forward_training, alg, md, 0.0f}, attr, c.engine);
      dnnl::eltwise_backward::primitive_desc bwd_pd({alg, md, md, 0.0f}, attr, c.engine, fwd_pd);
      passes_.build(c, fwd_pd, bwd_pd, md, md, DNNL_ARG_DST);
    });
  }

  void forward(const float* x, float* y) override {
    guarded(*ctx_, "relu forward", shape_, [&] { passes_.forward(*ctx_, x, y); });
  }

  void backward(const float* y, const float* dy, float* dx) override {
    guarded(*ctx_, "relu backward", shape_, [&] { passes_.backward(*ctx_, y, dy, dx); });
  }

 private:
  std::shared_ptr<const Context> ctx_;
  ReluShape shape_;
  UnaryPasses passes_;
};

struct ActivationShape {
  const Activation* kind;
  int64_t elements;
  std::string str() const { return cat(kind->name, " [", elements, "]"); }
};

// oneDNN's eltwise algorithm for an activation op, if it has one: relu6 is clip [0, 6], gelu
// the erf form (gelu_tanh its tanh approximation), silu swish with alpha 1.
struct Eltwise {
  dnnl::algorithm alg;
  float alpha = 0.0f, beta = 0.0f;
};

std::optional<Eltwise> eltwise_for(std::string_view name) {
  using dnnl::algorithm;
  if (name == "relu6") return Eltwise{algorithm::eltwise_clip, 0.0f, 6.0f};
  if (name == "hardswish") return Eltwise{algorithm::eltwise_hardswish};
  if (name == "gelu") return Eltwise{algorithm::eltwise_gelu_erf};
  if (name == "gelu_tanh") return Eltwise{algorithm::eltwise_gelu_tanh};
  if (name == "sigmoid") return Eltwise{algorithm::eltwise_logistic};
  if (name == "tanh") return Eltwise{algorithm::eltwise_tanh};
  if (name == "silu") return Eltwise{algorithm::eltwise_swish, 1.0f};  // x * sigmoid(alpha x)
  return std::nullopt;
}

// An activation as a oneDNN eltwise primitive; backward from the forward's input.
class OnednnActivation final : public ActivationKernel {
 public:
  OnednnActivation(std::shared_ptr<const Context> ctx, const Activation& kind, Eltwise e, int64_t elements)
      : ctx_(std::move(ctx)), shape_{&kind, elements} {
    guarded(*ctx_, "activation setup", shape_, [&] {
      const Context& c = *ctx_;
      const memory::desc md({elements}, f32, tag::x);
      const auto [alg, alpha, beta] = e;
      const dnnl::primitive_attr attr = user_scratchpad();
      dnnl::eltwise_forward::primitive_desc fwd_pd({dnnl::prop_kind::forward_training, alg, md, alpha, beta}, attr,
                                                   c.engine);
      dnnl::eltwise_backward::primitive_desc bwd_pd({alg, md, md, alpha, beta}, attr, c.engine, fwd_pd);
      passes_.build(c, fwd_pd, bwd_pd, md, md, DNNL_ARG_SRC);
    });
  }

  void forward(const float* x, float* y) override {
    guarded(*ctx_, "activation forward", shape_, [&] { passes_.forward(*ctx_, x, y); });
  }

  void backward(const float* x, const float*, const float* dy, float* dx) override {
    guarded(*ctx_, "activation backward", shape_, [&] { passes_.backward(*ctx_, x, dy, dx); });
  }

 private:
  std::shared_ptr<const Context> ctx_;
  ActivationShape shape_;
  UnaryPasses passes_;
};

struct AddShape {
  int64_t elements;
  std::string str() const { return cat("add [", elements, "]"); }
};

// oneDNN binary add over one flat dimension.
class Add final : public AddKernel {
 public:
  Add(std::shared_ptr<const Context> ctx, int64_t elements) : ctx_(std::move(ctx)), shape_{elements} {
    guarded(*ctx_, "add setup", shape_, [&] {
      const Context& c = *ctx_;
      const memory::desc md({elements}, f32, tag::x);
      dnnl::binary::primitive_desc pd({dnnl::algorithm::binary_add, md, md, md}, user_scratchpad(), c.engine);
      a_ = wrapper(c, md), b_ = wrapper(c, md), y_ = wrapper(c, md);
      step_ = Step(c, pd, {{DNNL_ARG_SRC_0, a_}, {DNNL_ARG_SRC_1, b_}, {DNNL_ARG_DST, y_}});
    });
  }
  void forward(const float* a, const float* b, float* y) override {
    guarded(*ctx_, "add", shape_, [&] {
      bind(a_, a);
      bind(b_, b);
      bind(y_, y);
      step_.run(*ctx_);
    });
  }

 private:
  std::shared_ptr<const Context> ctx_;
  AddShape shape_;
  memory a_, b_, y_;
  Step step_;
};

struct SoftmaxShape {
  int64_t rows, channels;
  std::string str() const { return cat("softmax [", rows, ", ", channels, "]"); }
};

// oneDNN softmax over axis 1 of [rows, channels], and its backward (from the output).
class Softmax final : public SoftmaxKernel {
 public:
  Softmax(std::shared_ptr<const Context> ctx, int64_t rows, int64_t channels)
      : ctx_(std::move(ctx)), shape_{rows, channels} {
    guarded(*ctx_, "softmax setup", shape_, [&] {
      const Context& c = *ctx_;
      const memory::desc md({rows, channels}, f32, tag::nc);
      const dnnl::primitive_attr attr = user_scratchpad();
      dnnl::softmax_forward::primitive_desc fwd_pd({dnnl::prop_kind::forward_training, md, 1}, attr, c.engine);
      dnnl::softmax_backward::primitive_desc bwd_pd({md, md, 1}, attr, c.engine, fwd_pd);
      passes_.build(c, fwd_pd, bwd_pd, md, md, DNNL_ARG_DST);
    });
  }
  void forward(const float* x, float* y) override {
    guarded(*ctx_, "softmax forward", shape_, [&] { passes_.forward(*ctx_, x, y); });
  }
  void backward(const float* y, const float* dy, float* dx) override {
    guarded(*ctx_, "softmax backward", shape_, [&] { passes_.backward(*ctx_, y, dy, dx); });
  }

 private:
  std::shared_ptr<const Context> ctx_;
  SoftmaxShape shape_;
  UnaryPasses passes_;
};

// oneDNN's fused layer normalisation (forward_training, and backward with the scale's and the
// shift's gradients): mean and variance per row come out of forward and go into backward.
// An unwanted input gradient is written to a buffer of the kernel's own. Backward takes the
// shift too (with use_shift oneDNN 2.6 will not execute without it).
class LayerNorm final : public LayerNormKernel {
 public:
  LayerNorm(std::shared_ptr<const Context> ctx, const LayerNormGeometry& g)
      : ctx_(std::move(ctx)), g_(g) {
    guarded(*ctx_, "layer norm setup", g_, [&] {
      const Context& c = *ctx_;
      const memory::desc md({g.rows, g.features}, f32, tag::nc), stat({g.rows}, f32, tag::x),
          param({g.features}, f32, tag::x);
      const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
      const dnnl::primitive_attr attr = user_scratchpad();
      dnnl::layer_normalization_forward::primitive_desc fwd_pd(
          {dnnl::prop_kind::forward_training, md, stat, g.eps, flags}, attr, c.engine);
      dnnl::layer_normalization_backward::primitive_desc bwd_pd({dnnl::prop_kind::backward, md, md, stat, g.eps, flags},
                                                                 attr, c.engine, fwd_pd);
      x_ = wrapper(c, md), y_ = wrapper(c, md), dy_ = wrapper(c, md), dx_ = wrapper(c, md);
      mean_ = wrapper(c, stat), var_ = wrapper(c, stat);
      gamma_ = wrapper(c, param), beta_ = wrapper(c, param), dgamma_m_ = wrapper(c, param), dbeta_m_ = wrapper(c, param);
      forward_ = Step(c, fwd_pd,
                      {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, y_}, {DNNL_ARG_MEAN, mean_}, {DNNL_ARG_VARIANCE, var_},
                       {DNNL_ARG_SCALE, gamma_}, {DNNL_ARG_SHIFT, beta_}});
      backward_ = Step(c, bwd_pd,
                       {{DNNL_ARG_SRC, x_}, {DNNL_ARG_MEAN, mean_}, {DNNL_ARG_VARIANCE, var_}, {DNNL_ARG_DIFF_DST, dy_},
                        {DNNL_ARG_SCALE, gamma_}, {DNNL_ARG_SHIFT, beta_}, {DNNL_ARG_DIFF_SRC, dx_},
                        {DNNL_ARG_DIFF_SCALE, dgamma_m_},
                        {DNNL_ARG_DIFF_SHIFT, dbeta_m_}});
    });
  }
  void forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* var) override {
    guarded(*ctx_, "layer norm forward", g_, [&] {
      bind(x_, x), bind(gamma_, gamma), bind(beta_, beta), bind(y_, y), bind(mean_, mean), bind(var_, var);
      forward_.run(*ctx_);
    });
  }
  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* var, float* dx,
                float* dgamma, float* dbeta) override {
    guarded(*ctx_, "layer norm backward", g_, [&] {
      if (dx == nullptr) unwanted_dx_.resize(static_cast<std::size_t>(g_.rows * g_.features));
      bind(x_, x), bind(dy_, dy), bind(gamma_, gamma), bind(mean_, mean), bind(var_, var);
      bind(dx_, dx ? dx : unwanted_dx_.data()), bind(dgamma_m_, dgamma), bind(dbeta_m_, dbeta);
      backward_.run(*ctx_);
    });
  }

 private:
  std::shared_ptr<const Context> ctx_;
  LayerNormGeometry g_;
  memory x_, y_, dy_, dx_, mean_, var_, gamma_, beta_, dgamma_m_, dbeta_m_;
  Step forward_, backward_;
  std::vector<float> unwanted_dx_;
};

// Average pooling forward and backward on NHWC through one UnaryPasses pair: tandem's
// AvgPool2d (PyTorch's count_include_pad) and global average pooling (the whole image as the
// window).
template <typename Kernel, typename Geometry>
class AvgPooling final : public Kernel {
 public:
  AvgPooling(std::shared_ptr<const Context> ctx, const Geometry& g, dnnl::algorithm alg, const memory::dims& out_hw,
             const memory::dims& kernel, const memory::dims& strides, const memory::dims& pad, const char* what)
      : ctx_(std::move(ctx)), g_(g), forward_(cat(what, " forward")), backward_(cat(what, " backward")) {
    guarded(*ctx_, cat(what, " setup"), g_, [&] {
      const Context& c = *ctx_;
      const memory::desc src_md({g.batch, g.channels, g.in_h, g.in_w}, f32, tag::nhwc);
      const memory::desc dst_md({g.batch, g.channels, out_hw[0], out_hw[1]}, f32, tag::nhwc);
      const dnnl::primitive_attr attr = user_scratchpad();
      dnnl::pooling_forward::primitive_desc fwd_pd(
          {dnnl::prop_kind::forward_training, alg, src_md, dst_md, strides, kernel, pad, pad}, attr, c.engine);
      dnnl::pooling_backward::primitive_desc bwd_pd({alg, src_md, dst_md, strides, kernel, pad, pad}, attr, c.engine,
                                                    fwd_pd);
      passes_.build(c, fwd_pd, bwd_pd, src_md, dst_md, 0);
    });
  }
  void forward(const float* x, float* y) override {
    guarded(*ctx_, forward_, g_, [&] { passes_.forward(*ctx_, x, y); });
  }
  void backward(const float* dy, float* dx) override {
    guarded(*ctx_, backward_, g_, [&] { passes_.backward(*ctx_, nullptr, dy, dx); });
  }

 private:
  std::shared_ptr<const Context> ctx_;
  Geometry g_;
  std::string forward_, backward_;  // made once: a step allocates nothing
  UnaryPasses passes_;
};

std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(std::shared_ptr<const Context> ctx,
                                                          const GlobalPoolGeometry& g) {
  return std::make_unique<AvgPooling<GlobalAvgPoolKernel, GlobalPoolGeometry>>(
      std::move(ctx), g, dnnl::algorithm::pooling_avg_exclude_padding, memory::dims{1, 1},
      memory::dims{g.in_h, g.in_w}, memory::dims{1, 1}, memory::dims{0, 0}, "global average pool");
}

std::unique_ptr<AvgPool2dKernel> make_avg_pool2d(std::shared_ptr<const Context> ctx, const Pool2dGeometry& g) {
  return std::make_unique<AvgPooling<AvgPool2dKernel, Pool2dGeometry>>(
      std::move(ctx), g, dnnl::algorithm::pooling_avg_include_padding, memory::dims{g.out_h(), g.out_w()},
      memory::dims{g.kernel_h, g.kernel_w}, memory::dims{g.stride_h, g.stride_w}, memory::dims{g.pad_h, g.pad_w},
      "avg_pool2d");
}

// pooling_max forward_training on NHWC; the stash is oneDNN's workspace (which window
// position won), read back by pooling_backward. Padded positions never win.
class MaxPool2d final : public MaxPool2dKernel {
 public:
  MaxPool2d(std::shared_ptr<const Context> ctx, const Pool2dGeometry& g) : ctx_(std::move(ctx)), g_(g) {
    guarded(*ctx_, "max_pool2d setup", g_, [&] {
      const Context& c = *ctx_;
      const memory::desc src_md({g.batch, g.channels, g.in_h, g.in_w}, f32, tag::nhwc);
      const memory::desc dst_md({g.batch, g.channels, g.out_h(), g.out_w()}, f32, tag::nhwc);
      const memory::dims strides{g.stride_h, g.stride_w}, kernel{g.kernel_h, g.kernel_w}, pad{g.pad_h, g.pad_w};
      const auto alg = dnnl::algorithm::pooling_max;
      const dnnl::primitive_attr attr = user_scratchpad();
      dnnl::pooling_forward::primitive_desc fwd_pd(
          {dnnl::prop_kind::forward_training, alg, src_md, dst_md, strides, kernel, pad, pad}, attr, c.engine);
      dnnl::pooling_backward::primitive_desc bwd_pd({alg, src_md, dst_md, strides, kernel, pad, pad}, attr, c.engine,
                                                    fwd_pd);
      const memory::desc ws_md = fwd_pd.workspace_desc();
      stash_bytes_ = ws_md.get_size();
      x_ = wrapper(c, src_md), y_ = wrapper(c, dst_md), ws_ = wrapper(c, ws_md);
      dy_ = wrapper(c, dst_md), bws_ = wrapper(c, ws_md), dx_ = wrapper(c, src_md);
      fwd_ = Step(c, fwd_pd, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, y_}, {DNNL_ARG_WORKSPACE, ws_}});
      bwd_ = Step(c, bwd_pd, {{DNNL_ARG_DIFF_DST, dy_}, {DNNL_ARG_WORKSPACE, bws_}, {DNNL_ARG_DIFF_SRC, dx_}});
    });
  }

  std::size_t stash_bytes() const override { return stash_bytes_; }

  void forward(const float* x, float* y, void* stash) override {
    guarded(*ctx_, "max_pool2d forward", g_, [&] {
      bind(x_, x);
      bind(y_, y);
      bind(ws_, stash);
      fwd_.run(*ctx_);
    });
  }

  void backward(const float* dy, const void* stash, float* dx) override {
    guarded(*ctx_, "max_pool2d backward", g_, [&] {
      bind(dy_, dy);
      bind(bws_, stash);
      bind(dx_, dx);
      bwd_.run(*ctx_);  // overwrites all of dx
    });
  }

 private:
  std::shared_ptr<const Context> ctx_;
  Pool2dGeometry g_;
  std::size_t stash_bytes_ = 0;
  memory x_, y_, ws_, dy_, bws_, dx_;
  Step fwd_, bwd_;
};

}  // namespace

std::unique_ptr<ReluKernel> make_relu(std::shared_ptr<const Context> ctx, int64_t elements) {
  return std::make_unique<Relu>(std::move(ctx), elements);
}

std::unique_ptr<MaxPool2dKernel> make_max_pool2d(std::shared_ptr<const Context> ctx, const Pool2dGeometry& g) {
  return std::make_unique<MaxPool2d>(std::move(ctx), g);
}

namespace {

class Backend final : public tandem::Backend {
 public:
  explicit Backend(const BackendOptions& options) {
    try {
      auto ctx = std::make_shared<Context>();
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
      ctx->threads = options.threads > 0 ? options.threads : omp_get_num_procs();
#else
      ctx->threads = options.threads > 0 ? options.threads : 1;
#endif
      ctx_ = std::move(ctx);
    } catch (const dnnl::error& e) {
      fail("onednn", cat("engine setup failed: ", e.what()));
    }
  }

  std::string_view name() const override { return "onednn"; }
  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dGeometry& g) override { return make_conv2d(ctx_, g); }
  std::unique_ptr<LinearKernel> linear(const LinearGeometry& g) override { return make_linear(ctx_, g); }
  std::unique_ptr<ReluKernel> relu(int64_t elements) override { return make_relu(ctx_, elements); }
  std::unique_ptr<ActivationKernel> activation(const Activation& kind, int64_t elements) override {
    // One oneDNN lacks runs as the op's portable loop.
    if (const auto e = eltwise_for(kind.name)) return std::make_unique<OnednnActivation>(ctx_, kind, *e, elements);
    return make_reference_activation(kind, elements);
  }
  std::unique_ptr<GlobalAvgPoolKernel> global_avg_pool(const GlobalPoolGeometry& g) override {
    return make_global_avg_pool(ctx_, g);
  }
  std::unique_ptr<SoftmaxKernel> softmax(int64_t rows, int64_t channels) override {
    return std::make_unique<Softmax>(ctx_, rows, channels);
  }
  std::unique_ptr<AddKernel> add(int64_t elements) override { return std::make_unique<Add>(ctx_, elements); }
  std::unique_ptr<BatchNormKernel> batch_norm(const BatchNormGeometry& g) override { return make_reference_batch_norm(g); }
  std::unique_ptr<TokenPoolKernel> token_pool(const TokenPoolGeometry& g) override { return make_reference_token_pool(g); }
  std::unique_ptr<MulKernel> mul(const MulGeometry& g) override { return make_reference_mul(g); }
  std::unique_ptr<DropoutKernel> dropout(int64_t elements) override { return make_reference_dropout(elements); }
  std::unique_ptr<LayerNormKernel> layer_norm(const LayerNormGeometry& g) override {
    return std::make_unique<LayerNorm>(ctx_, g);
  }
  std::unique_ptr<AttentionKernel> attention(const AttentionGeometry& g) override { return make_attention(ctx_, g); }
  std::unique_ptr<MaxPool2dKernel> max_pool2d(const Pool2dGeometry& g) override { return make_max_pool2d(ctx_, g); }
  std::unique_ptr<AvgPool2dKernel> avg_pool2d(const Pool2dGeometry& g) override {
    return make_avg_pool2d(ctx_, g);
  }
  std::unique_ptr<GroupedLinearKernel> grouped_linear(const GroupedLinearGeometry& g) override {
    return make_grouped_linear(ctx_, g);
  }

 private:
  std::shared_ptr<const Context> ctx_;
};

}  // namespace
}  // namespace onednn

std::unique_ptr<Backend> make_onednn_backend(const BackendOptions& options) {
  // oneDNN annotates every primitive for Intel's profilers (ITT) unless told not to; that
  // cost about 1% of the cloud's time. A user's own setting wins.
  setenv("DNNL_ITT_TASK_LEVEL", "0", /*overwrite=*/0);
  return std::make_unique<onednn::Backend>(options);
}


}  // namespace tandem
