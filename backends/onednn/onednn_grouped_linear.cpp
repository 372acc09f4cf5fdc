// G linear layers as one batched oneDNN matmul per pass (the heads' second layer): the group
// is the matmul's batch dimension. Activations are regrouped group-major ([N, G*I] <->
// [G, N, I], a copy) because oneDNN 2.6 runs batched matmuls with strided batches on its
// slow reference code; weights [G, O, I] are read in place (as transposed matrices).
#include <algorithm>
#include <cstdio>
#include <vector>

#include "backends/onednn/onednn_kernels.h"

namespace tandem::onednn {
namespace {

using dnnl::memory;
constexpr auto f32 = memory::data_type::f32;

class GroupedLinear final : public GroupedLinearKernel {
 public:
  GroupedLinear(std::shared_ptr<const Context> ctx, const GroupedLinearGeometry& g) : ctx_(std::move(ctx)), g_(g) {
    guarded(*ctx_, "grouped linear setup", g_, [&] { build(); });
  }

  void forward(const float* x, const WeightsView& w, float* y) override {
    guarded(*ctx_, "grouped linear forward", g_, [&] {
      to_groups(x, g_.in_features, xg_.data());
      bind(fw_, w.weight);
      fwd_.run(*ctx_);
      from_groups(yg_.data(), g_.out_features, y, w.bias);
    });
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    guarded(*ctx_, "grouped linear backward_data", g_, [&] {
      to_groups(dy, g_.out_features, dyg_.data());
      bind(dw_, w.weight);
      data_.run(*ctx_);
      from_groups(dxg_.data(), g_.in_features, dx, nullptr);
    });
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    guarded(*ctx_, "grouped linear backward_weights", g_, [&] {
      to_groups(x, g_.in_features, xg_.data());
      to_groups(dy, g_.out_features, dyg_.data());
      bind(wdw_, dw);
      weights_.run(*ctx_);
    });
    if (!db) return;
    const int64_t cols = g_.groups * g_.out_features;
    std::fill_n(db, cols, 0.0f);
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t c = 0; c < cols; ++c) db[c] += dy[n * cols + c];
  }

 private:
  // [N, G*F] -> [G, N, F] and back.
  void to_groups(const float* src, int64_t f, float* dst) const {
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t g = 0; g < g_.groups; ++g)
        std::copy_n(src + (n * g_.groups + g) * f, f, dst + (g * g_.batch + n) * f);
  }
  // ... plus bias[g * f + j] when given (oneDNN 2.6's batched matmul with a per-batch bias
  // runs on its reference code, so the bias is added here).
  void from_groups(const float* src, int64_t f, float* dst, const float* bias) const {
    for (int64_t g = 0; g < g_.groups; ++g)
      for (int64_t n = 0; n < g_.batch; ++n) {
        const float* s = src + (g * g_.batch + n) * f;
        float* d = dst + (n * g_.groups + g) * f;
        if (!bias) {
          std::copy_n(s, f, d);
          continue;
        }
        const float* b = bias + g * f;
        for (int64_t j = 0; j < f; ++j) d[j] = s[j] + b[j];
      }
  }

  void build() {
    const Context& c = *ctx_;
    const memory::dim G = g_.groups, N = g_.batch, I = g_.in_features, O = g_.out_features;
    const dnnl::primitive_attr attr = user_scratchpad();
    // Dense group-major activations; weights and dy^T as transposed views.
    const memory::desc x_md({G, N, I}, f32, memory::dims{N * I, I, 1});
    const memory::desc y_md({G, N, O}, f32, memory::dims{N * O, O, 1});
    const memory::desc wt_md({G, I, O}, f32, memory::dims{O * I, 1, I});  // w^T per group
    const memory::desc w_md({G, O, I}, f32, memory::dims{O * I, I, 1});
    const memory::desc dyt_md({G, O, N}, f32, memory::dims{N * O, 1, O});  // dy^T per group
    xg_.resize(static_cast<std::size_t>(G * N * I));
    yg_.resize(static_cast<std::size_t>(G * N * O));
    dyg_.resize(static_cast<std::size_t>(G * N * O));
    dxg_.resize(static_cast<std::size_t>(G * N * I));
    auto owned = [&](const memory::desc& md, std::vector<float>& buf) {
      memory m = wrapper(c, md);
      bind(m, buf.data());
      return m;
    };

    dnnl::matmul::primitive_desc fwd_pd({x_md, wt_md, y_md}, attr, c.engine);
    fw_ = wrapper(c, wt_md);
    fwd_ = Step(c, fwd_pd, {{DNNL_ARG_SRC, owned(x_md, xg_)}, {DNNL_ARG_WEIGHTS, fw_}, {DNNL_ARG_DST, owned(y_md, yg_)}});

    dnnl::matmul::primitive_desc data_pd({y_md, w_md, x_md}, attr, c.engine);  // dx = dy w
    dw_ = wrapper(c, w_md);
    data_ = Step(c, data_pd, {{DNNL_ARG_SRC, owned(y_md, dyg_)}, {DNNL_ARG_WEIGHTS, dw_},
                              {DNNL_ARG_DST, owned(x_md, dxg_)}});

    dnnl::matmul::primitive_desc weights_pd({dyt_md, x_md, w_md}, attr, c.engine);  // dw = dy^T x
    wdw_ = wrapper(c, w_md);
    weights_ = Step(c, weights_pd, {{DNNL_ARG_SRC, owned(dyt_md, dyg_)}, {DNNL_ARG_WEIGHTS, owned(x_md, xg_)},
                                    {DNNL_ARG_DST, wdw_}});
    const std::pair<const char*, const dnnl::primitive_desc_base*> passes[] = {
        {"forward", &fwd_pd}, {"backward_data", &data_pd}, {"backward_weights", &weights_pd}};
    for (const auto& [pass, pd] : passes)
      if (is_reference(*pd))
        std::fprintf(stderr, "[onednn] note: %s %s runs on oneDNN's reference code (%s)\n", g_.str().c_str(), pass,
                     pd->impl_info_str());
  }

  std::shared_ptr<const Context> ctx_;
  GroupedLinearGeometry g_;
  memory fw_, dw_, wdw_;  // bound to the caller's weights per call
  Step fwd_, data_, weights_;
  std::vector<float> xg_, yg_, dyg_, dxg_;  // group-major activations and gradients
};

}  // namespace

std::unique_ptr<GroupedLinearKernel> make_grouped_linear(std::shared_ptr<const Context> ctx,
                                                         const GroupedLinearGeometry& g) {
  return std::make_unique<GroupedLinear>(std::move(ctx), g);
}

}  // namespace tandem::onednn
