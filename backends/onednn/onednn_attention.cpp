// Multi-head attention on oneDNN's batched matmul: the four products of each pass run over
// all samples and heads at once ([batch * heads] matrices). q, k, v and the output gradient
// are regrouped head-major ([B, T, H, dh] -> [B*H, T, dh], a copy of T*D values a sample,
// small beside the T*T*D products) because oneDNN 2.6 runs batched matmuls with strided
// batches on its reference code; transposes are read in place. The masked softmax and its
// backward are simd's loops (oneDNN's softmax takes no mask).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "backends/onednn/onednn_kernels.h"
#include "backends/simd/attention.h"

namespace tandem::onednn {
namespace {

using dnnl::memory;
constexpr auto f32 = memory::data_type::f32;

class Attention final : public AttentionKernel {
 public:
  Attention(std::shared_ptr<const Context> ctx, const AttentionGeometry& g)
      : ctx_(std::move(ctx)), g_(g), scale_(1.0f / std::sqrt(static_cast<float>(g.head_dim))) {
    guarded(*ctx_, "attention setup", g_, [&] { build(); });
  }

  void forward(const float* q, const float* k, const float* v, const float* mask, float* out, float* probs) override {
    guarded(*ctx_, "attention forward", g_, [&] {
      to_heads(q, qh_.data()), to_heads(k, kh_.data()), to_heads(v, vh_.data());
      bind(p_, probs);
      scores_.run(*ctx_);  // P = Q K^T (unscaled; the softmax scales)
      const int64_t T = g_.tokens;
      for (int64_t b = 0; b < g_.batch; ++b)
        for (int64_t h = 0; h < g_.heads; ++h)
          for (int64_t i = 0; i < T; ++i)
            simd::masked_softmax_row(probs + ((b * g_.heads + h) * T + i) * T, T, scale_, mask ? mask + b * T : nullptr,
                                     g_.causal ? i : -1);
      mix_.run(*ctx_);  // O = P V
      from_heads(oh_.data(), out);
    });
  }

  void backward(const float* q, const float* k, const float* v, const float* probs, const float* dout, float* dq,
                float* dk, float* dv) override {
    guarded(*ctx_, "attention backward", g_, [&] {
      to_heads(dout, oh_.data());  // dO
      bind(p_, probs), bind(pt_, probs);
      if (dv) {
        dv_.run(*ctx_);  // dV = P^T dO
        from_heads(qh_.data(), dv);  // (qh_ is free until q is regrouped below)
      }
      if (!dq && !dk) return;
      to_heads(v, vh_.data());
      dp_.run(*ctx_);  // dP = dO V^T
      const int64_t rows = g_.batch * g_.heads * g_.tokens;
      for (int64_t r = 0; r < rows; ++r)
        simd::softmax_backward_row(probs + r * g_.tokens, ds_.data() + r * g_.tokens, g_.tokens, scale_);
      if (dq) {
        to_heads(k, kh_.data());
        dq_.run(*ctx_);  // dQ = dS K, into vh_ (free now)
        from_heads(vh_.data(), dq);
      }
      if (dk) {
        to_heads(q, qh_.data());
        dk_.run(*ctx_);  // dK = dS^T Q, into kh_
        from_heads(kh_.data(), dk);
      }
    });
  }

 private:
  // [B, T, H, dh] -> [B, H, T, dh] and back.
  void to_heads(const float* src, float* dst) const {
    const int64_t T = g_.tokens, H = g_.heads, dh = g_.head_dim;
    for (int64_t b = 0; b < g_.batch; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) std::copy_n(src + ((b * T + t) * H + h) * dh, dh, dst + ((b * H + h) * T + t) * dh);
  }
  void from_heads(const float* src, float* dst) const {
    const int64_t T = g_.tokens, H = g_.heads, dh = g_.head_dim;
    for (int64_t b = 0; b < g_.batch; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) std::copy_n(src + ((b * H + h) * T + t) * dh, dh, dst + ((b * T + t) * H + h) * dh);
  }

  void build() {
    const Context& c = *ctx_;
    const memory::dim N = g_.batch * g_.heads, T = g_.tokens, dh = g_.head_dim;
    const dnnl::primitive_attr attr = user_scratchpad();
    const memory::desc panel({N, T, dh}, f32, memory::dims{T * dh, dh, 1});
    const memory::desc panel_t({N, dh, T}, f32, memory::dims{T * dh, 1, dh});  // a panel transposed
    const memory::desc square({N, T, T}, f32, memory::dims{T * T, T, 1});
    const memory::desc square_t({N, T, T}, f32, memory::dims{T * T, 1, T});
    for (auto* buf : {&qh_, &kh_, &vh_, &oh_}) buf->resize(static_cast<std::size_t>(N * T * dh));
    ds_.resize(static_cast<std::size_t>(N * T * T));
    auto owned = [&](const memory::desc& md, std::vector<float>& buf) {
      memory m = wrapper(c, md);
      bind(m, buf.data());
      return m;
    };
    p_ = wrapper(c, square), pt_ = wrapper(c, square_t);
    struct Pass {
      const char* name;
      Step* step;
      memory::desc src, weights, dst;
      memory src_m, weights_m, dst_m;
    };
    const Pass passes[] = {
        {"scores", &scores_, panel, panel_t, square, owned(panel, qh_), owned(panel_t, kh_), p_},
        {"mix", &mix_, square, panel, panel, p_, owned(panel, vh_), owned(panel, oh_)},
        {"dv", &dv_, square_t, panel, panel, pt_, owned(panel, oh_), owned(panel, qh_)},
        {"dp", &dp_, panel, panel_t, square, owned(panel, oh_), owned(panel_t, vh_), owned(square, ds_)},
        {"dq", &dq_, square, panel, panel, owned(square, ds_), owned(panel, kh_), owned(panel, vh_)},
        {"dk", &dk_, square_t, panel, panel, owned(square_t, ds_), owned(panel, qh_), owned(panel, kh_)},
    };
    for (const Pass& p : passes) {
      dnnl::matmul::primitive_desc pd({p.src, p.weights, p.dst}, attr, c.engine);
      *p.step = Step(c, pd, {{DNNL_ARG_SRC, p.src_m}, {DNNL_ARG_WEIGHTS, p.weights_m}, {DNNL_ARG_DST, p.dst_m}});
      if (is_reference(pd))
        std::fprintf(stderr, "[onednn] note: %s %s runs on oneDNN's reference code (%s)\n", g_.str().c_str(), p.name,
                     pd.impl_info_str());
    }
  }

  std::shared_ptr<const Context> ctx_;
  AttentionGeometry g_;
  float scale_;
  memory p_, pt_;  // the caller's probs, as P and as P^T
  Step scores_, mix_, dv_, dp_, dq_, dk_;
  std::vector<float> qh_, kh_, vh_, oh_, ds_;  // head-major panels; dP and dS
};

}  // namespace

std::unique_ptr<AttentionKernel> make_attention(std::shared_ptr<const Context> ctx, const AttentionGeometry& g) {
  return std::make_unique<Attention>(std::move(ctx), g);
}

}  // namespace tandem::onednn
