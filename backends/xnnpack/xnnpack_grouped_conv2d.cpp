// Grouped and depthwise Conv2d on XNNPACK: forward is XNNPACK's grouped convolution (weights
// OHWI with I = in_c / groups are its [groups][group outputs][kh][kw][group inputs] layout),
// repacked once per weights version. XNNPACK 2022 has no backward passes and no grouped
// deconvolution, so both backward passes are core's portable loops.
#include <limits>

#include "backends/reference/reference_backend.h"
#include "backends/xnnpack/xnnpack_common.h"

namespace tandem::xnn {
namespace {

class XnnGroupedConv2d final : public Conv2dKernel {
 public:
  XnnGroupedConv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g)
      : ctx_(std::move(ctx)), g_(g), where_(g.str()), portable_(make_reference_conv2d(g)) {
    if (g.groups < 1 || g.in_c % g.groups != 0 || g.out_c % g.groups != 0 || g.out_h() < 1 || g.out_w() < 1)
      fail("xnnpack", cat("invalid geometry: ", where_));
  }

  void forward(const float* x, const WeightsView& w, float* y) override {
    const Conv2dGeometry& g = g_;
    auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
    auto sz = [](int64_t v) { return static_cast<size_t>(v); };
    if (!fwd_.holds(w, /*uses_bias=*/true)) {
      if (w.weight == nullptr) fail("xnnpack", cat("conv2d weights missing for ", where_));
      fwd_.op.reset();
      xnn_operator_t op = nullptr;
      const float inf = std::numeric_limits<float>::infinity();
      check(xnn_create_convolution2d_nhwc_f32(u32(g.pad_h), u32(g.pad_w), u32(g.pad_h), u32(g.pad_w), u32(g.kernel_h),
                                              u32(g.kernel_w), u32(g.stride_h), u32(g.stride_w), u32(g.dilation_h),
                                              u32(g.dilation_w), u32(g.groups), sz(g.in_c / g.groups),
                                              sz(g.out_c / g.groups), sz(g.in_c), sz(g.out_c), w.weight, w.bias, -inf,
                                              inf, 0, &op),
            "xnn_create_convolution2d_nhwc_f32 (grouped)", where_);
      fwd_.reset(op, w);
    }
    pthreadpool_t pool = ctx_->threadpool();
    check(xnn_setup_convolution2d_nhwc_f32(fwd_.op.get(), sz(g.batch), sz(g.in_h), sz(g.in_w), x, y, pool),
          "xnn_setup_convolution2d_nhwc_f32 (grouped)", where_);
    check(xnn_run_operator(fwd_.op.get(), pool), "xnn_run_operator (grouped conv2d forward)", where_);
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override { portable_->backward_data(dy, w, dx); }
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    portable_->backward_weights(x, dy, dw, db);
  }

 private:
  std::shared_ptr<const Context> ctx_;
  Conv2dGeometry g_;
  std::string where_;
  PackedOperator fwd_;
  std::unique_ptr<Conv2dKernel> portable_;
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_grouped_conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g) {
  return std::make_unique<XnnGroupedConv2d>(std::move(ctx), g);
}

}  // namespace tandem::xnn
