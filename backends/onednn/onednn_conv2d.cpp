// Conv2d on oneDNN: convolution_forward (forward_training), convolution_backward_data and
// convolution_backward_weights (with the bias gradient), NHWC activations, OHWI weights.
#include "backends/onednn/onednn_kernels.h"
#include "backends/onednn/onednn_weighted.h"

namespace tandem::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

class Conv2d final : public Conv2dKernel {
 public:
  Conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g)
      : ctx_(std::move(ctx)), g_(g) {
    guarded(*ctx_, "conv2d setup", g_, [&] {
      if (!build(false)) build(true);
    });
  }

  void forward(const float* x, const WeightsView& w, float* y) override {
    guarded(*ctx_, "conv2d forward", g_, [&] { passes_.forward(*ctx_, x, w, y); });
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    guarded(*ctx_, "conv2d backward_data", g_, [&] { passes_.backward_data(*ctx_, dy, w, dx); });
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    guarded(*ctx_, "conv2d backward_weights", g_, [&] { passes_.backward_weights(*ctx_, x, dy, dw, db); });
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
    // Grouped: weights [groups, out_c / groups, in_c / groups, kh, kw] in oneDNN's logical
    // order; tandem's OHWI with I = in_c / groups is its gohwi layout.
    const memory::dims wei_dims =
        g.groups == 1 ? memory::dims{g.out_c, g.in_c, g.kernel_h, g.kernel_w}
                      : memory::dims{g.groups, g.out_c / g.groups, g.in_c / g.groups, g.kernel_h, g.kernel_w};
    const memory::dims dst_dims{g.batch, g.out_c, g.out_h(), g.out_w()};
    const memory::dims strides{g.stride_h, g.stride_w};
    const memory::dims dilates{g.dilation_h - 1, g.dilation_w - 1};  // oneDNN: 0 = none
    // Symmetric padding: oneDNN's output size (with floor division) then equals tandem's.
    const memory::dims pad{g.pad_h, g.pad_w};

    const memory::desc src_md(src_dims, f32, tag::nhwc), wei_md(wei_dims, f32, g.groups == 1 ? tag::ohwi : tag::gohwi),
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

    passes_.build(c, fwd_pd, data_pd, weights_pd, src_md, wei_md, dst_md, bias_md, g_.out_c);
    return true;
  }

  std::shared_ptr<const Context> ctx_;
  Conv2dGeometry g_;
  WeightedPasses passes_;
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g) {
  return std::make_unique<Conv2d>(std::move(ctx), g);
}

}  // namespace tandem::onednn
