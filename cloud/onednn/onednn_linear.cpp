// Linear on oneDNN: inner_product_forward (forward_training), inner_product_backward_data and
// inner_product_backward_weights (with the bias gradient); x [N, in] (nc), w [out, in] (oi).
#include "cloud/onednn/onednn_kernels.h"
#include "cloud/onednn/onednn_weighted.h"

namespace tandem::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

class Linear final : public LinearKernel {
 public:
  Linear(std::shared_ptr<const Context> ctx, const LinearGeometry& g)
      : ctx_(std::move(ctx)), g_(g) {
    guarded(*ctx_, "linear setup", g_, [&] { build(); });
  }

  void forward(const float* x, const WeightsView& w, float* y) override {
    guarded(*ctx_, "linear forward", g_, [&] { passes_.forward(*ctx_, x, w, y); });
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    guarded(*ctx_, "linear backward_data", g_, [&] { passes_.backward_data(*ctx_, dy, w, dx); });
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    guarded(*ctx_, "linear backward_weights", g_, [&] { passes_.backward_weights(*ctx_, x, dy, dw, db); });
  }

 private:
  // Plain layouts throughout: oneDNN runs these as its JIT sgemm (gemm:jit), measured at
  // 90-110 GFLOP/s on one core here, so blocked layouts would only add reorders.
  void build() {
    const Context& c = *ctx_;
    const memory::dims src_dims{g_.batch, g_.in_features}, wei_dims{g_.out_features, g_.in_features},
        dst_dims{g_.batch, g_.out_features};
    const memory::desc src_md(src_dims, f32, tag::nc), wei_md(wei_dims, f32, tag::oi), dst_md(dst_dims, f32, tag::nc),
        bias_md({g_.out_features}, f32, tag::x);
    const dnnl::primitive_attr attr = user_scratchpad();

    // The bias is always there (zeros when the layer has none), as in the reference.
    dnnl::inner_product_forward::primitive_desc fwd_pd(
        {dnnl::prop_kind::forward_training, src_md, wei_md, bias_md, dst_md}, attr, c.engine);
    dnnl::inner_product_backward_data::primitive_desc data_pd({src_md, wei_md, dst_md}, attr, c.engine, fwd_pd);
    dnnl::inner_product_backward_weights::primitive_desc weights_pd({src_md, wei_md, bias_md, dst_md}, attr, c.engine,
                                                                    fwd_pd);
    passes_.build(c, fwd_pd, data_pd, weights_pd, src_md, wei_md, dst_md, bias_md, g_.out_features);
  }

  std::shared_ptr<const Context> ctx_;
  LinearGeometry g_;
  WeightedPasses passes_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(std::shared_ptr<const Context> ctx, const LinearGeometry& g) {
  return std::make_unique<Linear>(std::move(ctx), g);
}

}  // namespace tandem::onednn
