// Linear on oneDNN: inner_product_forward (forward_training), inner_product_backward_data and
// inner_product_backward_weights (with the bias gradient); x [N, in] (nc), w [out, in] (oi);
// micro-batch forwards run on oneDNN's blocked weights, reordered once per weights version.
#include "backends/onednn/onednn_kernels.h"
#include "backends/onednn/onednn_weighted.h"

namespace tandem::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

class Linear final : public LinearKernel {
 public:
  Linear(std::shared_ptr<const Context> ctx, const LinearGeometry& g) : ctx_(std::move(ctx)), g_(g) {
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
  // Plain layouts, which oneDNN runs as its JIT sgemm (gemm:jit), except the forward's weights
  // for micro-batches (8 <= batch <= 64) of layers whose weights stay in cache (256 KiB to
  // 2 MiB; below that the reorder's call costs more than it saves, 3 us a layer):
  // there gemm:jit's forward ran at 31-69 GFLOP/s on one core here, and oneDNN's brgemm on
  // its own blocked weights at 97-112 (3136 -> 128 at batch 16: 0.37 -> 0.11 ms). Those
  // weights are reordered once per weights version (WeightsPort), 0.03-0.15 ms for such
  // layers, about one forward; larger weights reordered at 1.5 ms (4-8 MiB), and the
  // backward passes were slower on blocked weights, so they keep the plain ones.
  static bool blocked_forward_weights(const LinearGeometry& g) {
    constexpr int64_t kMinBatch = 8, kMaxBatch = 64, kMinWeightBytes = 256 << 10, kMaxWeightBytes = 2 << 20;
    const int64_t weight_bytes = g.in_features * g.out_features * static_cast<int64_t>(sizeof(float));
    return g.batch >= kMinBatch && g.batch <= kMaxBatch && weight_bytes >= kMinWeightBytes &&
           weight_bytes <= kMaxWeightBytes;
  }

  void build() {
    const Context& c = *ctx_;
    const memory::dims src_dims{g_.batch, g_.in_features}, wei_dims{g_.out_features, g_.in_features},
        dst_dims{g_.batch, g_.out_features};
    const memory::desc src_md(src_dims, f32, tag::nc), wei_md(wei_dims, f32, tag::oi), dst_md(dst_dims, f32, tag::nc),
        bias_md({g_.out_features}, f32, tag::x),
        fwd_wei_md = blocked_forward_weights(g_) ? memory::desc(wei_dims, f32, tag::any) : wei_md;
    const dnnl::primitive_attr attr = user_scratchpad();

    // The bias is always there (zeros when the layer has none), as in the reference.
    dnnl::inner_product_forward::primitive_desc fwd_pd(
        {dnnl::prop_kind::forward_training, src_md, fwd_wei_md, bias_md, dst_md}, attr, c.engine);
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
