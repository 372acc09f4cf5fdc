// Linear on oneDNN: inner_product_forward (forward_training), inner_product_backward_data and
// inner_product_backward_weights (with the bias gradient); x [N, in] (nc), w [out, in] (oi).
#include <vector>

#include "cloud/onednn/onednn_kernels.h"

namespace tandem::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

class Linear final : public LinearKernel {
 public:
  Linear(std::shared_ptr<const Context> ctx, const LinearGeometry& g)
      : ctx_(std::move(ctx)),
        g_(g),
        zeros_(static_cast<std::size_t>(g.out_features), 0.0f),
        db_sink_(static_cast<std::size_t>(g.out_features)) {
    guarded(*ctx_, "linear setup", g_, [&] { build(); });
  }

  void forward(const float* x, const WeightsView& w, float* y) override {
    guarded(*ctx_, "linear forward", g_, [&] {
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
    guarded(*ctx_, "linear backward_data", g_, [&] {
      const Context& c = *ctx_;
      d_dst_.load(c, dy);
      d_wei_.load(c, w.weight, w.version);
      d_src_.bind_output(dx);
      bwd_data_.run(c);
      d_src_.store(c);
    });
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    guarded(*ctx_, "linear backward_weights", g_, [&] {
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
    f_src_ = Port::input(c, src_md, fwd_pd.src_desc());
    f_wei_.port = Port::input(c, wei_md, fwd_pd.weights_desc());
    f_bias_ = wrapper(c, bias_md);
    f_dst_ = Port::output(c, dst_md, fwd_pd.dst_desc());
    fwd_ = Step(c, fwd_pd,
                {{DNNL_ARG_SRC, f_src_.inner},
                 {DNNL_ARG_WEIGHTS, f_wei_.port.inner},
                 {DNNL_ARG_BIAS, f_bias_},
                 {DNNL_ARG_DST, f_dst_.inner}});

    dnnl::inner_product_backward_data::primitive_desc data_pd({src_md, wei_md, dst_md}, attr, c.engine, fwd_pd);
    d_dst_ = Port::input(c, dst_md, data_pd.diff_dst_desc());
    d_wei_.port = Port::input(c, wei_md, data_pd.weights_desc());
    d_src_ = Port::output(c, src_md, data_pd.diff_src_desc());
    bwd_data_ = Step(
        c, data_pd,
        {{DNNL_ARG_DIFF_DST, d_dst_.inner}, {DNNL_ARG_WEIGHTS, d_wei_.port.inner}, {DNNL_ARG_DIFF_SRC, d_src_.inner}});

    dnnl::inner_product_backward_weights::primitive_desc weights_pd({src_md, wei_md, bias_md, dst_md}, attr, c.engine,
                                                                    fwd_pd);
    w_src_ = Port::input(c, src_md, weights_pd.src_desc());
    w_dst_ = Port::input(c, dst_md, weights_pd.diff_dst_desc());
    w_wei_ = Port::output(c, wei_md, weights_pd.diff_weights_desc());
    w_bias_ = wrapper(c, bias_md);
    bwd_weights_ = Step(c, weights_pd,
                        {{DNNL_ARG_SRC, w_src_.inner},
                         {DNNL_ARG_DIFF_DST, w_dst_.inner},
                         {DNNL_ARG_DIFF_WEIGHTS, w_wei_.inner},
                         {DNNL_ARG_DIFF_BIAS, w_bias_}});
  }

  std::shared_ptr<const Context> ctx_;
  LinearGeometry g_;
  std::vector<float> zeros_, db_sink_;
  Port f_src_, f_dst_, d_dst_, d_src_, w_src_, w_dst_, w_wei_;
  WeightsPort f_wei_, d_wei_;
  memory f_bias_, w_bias_;
  Step fwd_, bwd_data_, bwd_weights_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(std::shared_ptr<const Context> ctx, const LinearGeometry& g) {
  return std::make_unique<Linear>(std::move(ctx), g);
}

}  // namespace tandem::onednn
