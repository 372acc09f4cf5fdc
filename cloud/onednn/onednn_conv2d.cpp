// Conv2d on oneDNN: convolution_forward (forward_training), convolution_backward_data and
// convolution_backward_weights (with the bias gradient), NHWC activations, OHWI weights.
#include <vector>

#include "cloud/onednn/onednn_kernels.h"

namespace tandem::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

class Conv2d final : public Conv2dKernel {
 public:
  Conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g)
      : ctx_(std::move(ctx)),
        g_(g),
        zeros_(static_cast<std::size_t>(g.out_c), 0.0f),
        db_sink_(static_cast<std::size_t>(g.out_c)) {
    guarded(*ctx_, "conv2d setup", g_, [&] {
      if (!build(false)) build(true);
    });
  }

  void forward(const float* x, const WeightsView& w, float* y) override {
    guarded(*ctx_, "conv2d forward", g_, [&] {
      const Context& c = *ctx_;
      f_src_.load(c, x);
      f_wei_.load(c, w.weight, w.version);
      bind(f_bias_, w.bias ? w.bias : zeros_.data());
      f_dst_.bind_output(y);
      fwd_.run(c);
      f_dst_.store(c);
    });
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    guarded(*ctx_, "conv2d backward_data", g_, [&] {
      const Context& c = *ctx_;
      d_dst_.load(c, dy);
      d_wei_.load(c, w.weight, w.version);
      d_src_.bind_output(dx);
      bwd_data_.run(c);
      d_src_.store(c);
    });
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    guarded(*ctx_, "conv2d backward_weights", g_, [&] {
      const Context& c = *ctx_;
      w_src_.load(c, x);
      w_dst_.load(c, dy);
      w_wei_.bind_output(dw);
      bind(w_bias_, db ? db : db_sink_.data());
      bwd_weights_.run(c);
      w_wei_.store(c);
    });
  }

 private:
  // Activations stay NHWC when oneDNN has a JIT kernel for that (no activation reorders,
  // measured as fast as blocked layouts here); weights take oneDNN's preferred layout, reordered
  // from OHWI once per weights version. If NHWC would get a reference implementation, the
  // activations take oneDNN's layout too, with reorders each call. Returns false to ask for that.
  bool build(bool any_activations) {
    const Context& c = *ctx_;
    const Conv2dGeometry& g = g_;
    const memory::dims src_dims{g.batch, g.in_c, g.in_h, g.in_w};
    const memory::dims wei_dims{g.out_c, g.in_c, g.kernel_h, g.kernel_w};
    const memory::dims dst_dims{g.batch, g.out_c, g.out_h(), g.out_w()};
    const memory::dims strides{g.stride_h, g.stride_w};
    const memory::dims dilates{g.dilation_h - 1, g.dilation_w - 1};  // oneDNN: 0 = none
    // Symmetric padding: oneDNN's output size (with floor division) then equals tandem's.
    const memory::dims pad{g.pad_h, g.pad_w};

    const memory::desc src_md(src_dims, f32, tag::nhwc), wei_md(wei_dims, f32, tag::ohwi),
        dst_md(dst_dims, f32, tag::nhwc), bias_md({g.out_c}, f32, tag::x);
    const memory::desc src_want = any_activations ? memory::desc(src_dims, f32, tag::any) : src_md;
    const memory::desc dst_want = any_activations ? memory::desc(dst_dims, f32, tag::any) : dst_md;
    const memory::desc wei_want(wei_dims, f32, tag::any);
    const dnnl::primitive_attr attr = user_scratchpad();
    const auto alg = dnnl::algorithm::convolution_direct;

    // The bias is always there (zeros when the layer has none) so results follow the
    // reference whatever WeightsView.bias and db are.
    dnnl::convolution_forward::primitive_desc fwd_pd(
        {dnnl::prop_kind::forward_training, alg, src_want, wei_want, bias_md, dst_want, strides, dilates, pad, pad},
        attr, c.engine);
    dnnl::convolution_backward_data::primitive_desc data_pd(
        {alg, src_want, wei_want, dst_want, strides, dilates, pad, pad}, attr, c.engine, fwd_pd);
    dnnl::convolution_backward_weights::primitive_desc weights_pd(
        {alg, src_want, wei_want, bias_md, dst_want, strides, dilates, pad, pad}, attr, c.engine, fwd_pd);
    if (!any_activations && (is_reference(fwd_pd) || is_reference(data_pd) || is_reference(weights_pd))) return false;

    f_src_ = Port::input(c, src_md, fwd_pd.src_desc());
    f_wei_.port = Port::input(c, wei_md, fwd_pd.weights_desc());
    f_bias_ = wrapper(c, bias_md);
    f_dst_ = Port::output(c, dst_md, fwd_pd.dst_desc());
    fwd_ = Step(c, fwd_pd,
                {{DNNL_ARG_SRC, f_src_.inner},
                 {DNNL_ARG_WEIGHTS, f_wei_.port.inner},
                 {DNNL_ARG_BIAS, f_bias_},
                 {DNNL_ARG_DST, f_dst_.inner}});

    d_dst_ = Port::input(c, dst_md, data_pd.diff_dst_desc());
    d_wei_.port = Port::input(c, wei_md, data_pd.weights_desc());
    d_src_ = Port::output(c, src_md, data_pd.diff_src_desc());
    bwd_data_ = Step(
        c, data_pd,
        {{DNNL_ARG_DIFF_DST, d_dst_.inner}, {DNNL_ARG_WEIGHTS, d_wei_.port.inner}, {DNNL_ARG_DIFF_SRC, d_src_.inner}});

    w_src_ = Port::input(c, src_md, weights_pd.src_desc());
    w_dst_ = Port::input(c, dst_md, weights_pd.diff_dst_desc());
    w_wei_ = Port::output(c, wei_md, weights_pd.diff_weights_desc());
    w_bias_ = wrapper(c, bias_md);
    bwd_weights_ = Step(c, weights_pd,
                        {{DNNL_ARG_SRC, w_src_.inner},
                         {DNNL_ARG_DIFF_DST, w_dst_.inner},
                         {DNNL_ARG_DIFF_WEIGHTS, w_wei_.inner},
                         {DNNL_ARG_DIFF_BIAS, w_bias_}});
    return true;
  }

  std::shared_ptr<const Context> ctx_;
  Conv2dGeometry g_;
  std::vector<float> zeros_, db_sink_;
  Port f_src_, f_dst_, d_dst_, d_src_, w_src_, w_dst_, w_wei_;
  WeightsPort f_wei_, d_wei_;
  memory f_bias_, w_bias_;
  Step fwd_, bwd_data_, bwd_weights_;
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g) {
  return std::make_unique<Conv2d>(std::move(ctx), g);
}

}  // namespace tandem::onednn
