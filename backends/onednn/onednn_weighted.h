// The three passes of a weighted op (conv2d, linear) on oneDNN: given the forward,
// backward-data and backward-weights primitive descriptors, binds ports and steps once and
// runs each pass on the caller's buffers. The bias is always present (zeros when absent).
#pragma once

#include <vector>

#include "backends/onednn/onednn_common.h"
#include "core/backend.h"

namespace tandem::onednn {

class WeightedPasses {
 public:
  // Builds every port and step; `src`, `wei`, `dst`, `bias` are tandem's user layouts.
  template <typename FwdPd, typename DataPd, typename WeightsPd>
  void build(const Context& c, const FwdPd& fwd_pd, const DataPd& data_pd, const WeightsPd& weights_pd,
             const dnnl::memory::desc& src, const dnnl::memory::desc& wei, const dnnl::memory::desc& dst,
             const dnnl::memory::desc& bias, int64_t out_channels) {
    zeros_.assign(static_cast<std::size_t>(out_channels), 0.0f);
    db_sink_.assign(static_cast<std::size_t>(out_channels), 0.0f);
    f_src_ = Port::input(c, src, fwd_pd.src_desc());
    f_wei_ = WeightsPort{Port::input(c, wei, fwd_pd.weights_desc())};
    f_bias_ = wrapper(c, bias);
    f_dst_ = Port::output(c, dst, fwd_pd.dst_desc());
    fwd_ = Step(c, fwd_pd,
                {{DNNL_ARG_SRC, f_src_.inner},
                 {DNNL_ARG_WEIGHTS, f_wei_.port.inner},
                 {DNNL_ARG_BIAS, f_bias_},
                 {DNNL_ARG_DST, f_dst_.inner}});

    d_dst_ = Port::input(c, dst, data_pd.diff_dst_desc());
    d_wei_ = WeightsPort{Port::input(c, wei, data_pd.weights_desc())};
    d_src_ = Port::output(c, src, data_pd.diff_src_desc());
    bwd_data_ = Step(
        c, data_pd,
        {{DNNL_ARG_DIFF_DST, d_dst_.inner}, {DNNL_ARG_WEIGHTS, d_wei_.port.inner}, {DNNL_ARG_DIFF_SRC, d_src_.inner}});

    w_src_ = Port::input(c, src, weights_pd.src_desc());
    w_dst_ = Port::input(c, dst, weights_pd.diff_dst_desc());
    w_wei_ = Port::output(c, wei, weights_pd.diff_weights_desc());
    w_bias_ = wrapper(c, bias);
    bwd_weights_ = Step(c, weights_pd,
                        {{DNNL_ARG_SRC, w_src_.inner},
                         {DNNL_ARG_DIFF_DST, w_dst_.inner},
                         {DNNL_ARG_DIFF_WEIGHTS, w_wei_.inner},
                         {DNNL_ARG_DIFF_BIAS, w_bias_}});
  }

  void forward(const Context& c, const float* x, const WeightsView& w, float* y) {
    f_src_.load(c, x);
    f_wei_.load(c, w.weight, w.version);
    bind(f_bias_, w.bias ? w.bias : zeros_.data());
    f_dst_.bind_output(y);
    fwd_.run(c);
    f_dst_.store(c);
  }

  void backward_data(const Context& c, const float* dy, const WeightsView& w, float* dx) {
    d_dst_.load(c, dy);
    d_wei_.load(c, w.weight, w.version);
    d_src_.bind_output(dx);
    bwd_data_.run(c);
    d_src_.store(c);
  }

  void backward_weights(const Context& c, const float* x, const float* dy, float* dw, float* db) {
    w_src_.load(c, x);
    w_dst_.load(c, dy);
    w_wei_.bind_output(dw);
    bind(w_bias_, db ? db : db_sink_.data());
    bwd_weights_.run(c);
    w_wei_.store(c);
  }

 private:
  std::vector<float> zeros_, db_sink_;  // bias when the layer has none; db when not wanted
  Port f_src_, f_dst_, d_dst_, d_src_, w_src_, w_dst_, w_wei_;
  WeightsPort f_wei_, d_wei_;
  dnnl::memory f_bias_, w_bias_;
  Step fwd_, bwd_data_, bwd_weights_;
};

}  // namespace tandem::onednn
