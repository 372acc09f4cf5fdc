#include "backends/portable/portable_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/reference/reference_backend.h"
#include "backends/simd/activation.h"
#include "backends/simd/gemm.h"
#include "backends/simd/attention.h"
#include "backends/simd/column_sums.h"
#include "backends/simd/layer_norm.h"

namespace tandem {
namespace {

// W[rows][cols] transposed once per weights version.
class TransposedWeights {
 public:
  const float* get(const WeightsView& w, int64_t rows, int64_t cols) {
    if (w.weight != of_ || w.version != version_ || t_.empty()) {
      t_.resize(static_cast<std::size_t>(rows * cols));
      simd::transpose(rows, cols, w.weight, cols, t_.data());
      of_ = w.weight;
      version_ = w.version;
    }
    return t_.data();
  }

 private:
  std::vector<float> t_;
  const float* of_ = nullptr;
  uint64_t version_ = 0;
};

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
  if (!bias) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] += bias[c];
}

class PortableLinear final : public LinearKernel {
 public:
  explicit PortableLinear(const LinearGeometry& g) : g_(g) {}

  void forward(const float* x, const WeightsView& w, float* y) override {
    const int64_t in = g_.in_features, out = g_.out_features;
    simd::gemm(g_.batch, out, in, x, in, wt_.get(w, out, in), out, y, out, false);
    add_bias(y, w.bias, g_.batch, out);
  }
  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    const int64_t in = g_.in_features, out = g_.out_features;
    simd::gemm(g_.batch, in, out, dy, out, w.weight, in, dx, in, false);
  }
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const int64_t in = g_.in_features, out = g_.out_features;
    dyt_.resize(static_cast<std::size_t>(g_.batch * out));
    simd::transpose(g_.batch, out, dy, out, dyt_.data());
    simd::gemm(out, in, g_.batch, dyt_.data(), g_.batch, x, in, dw, in, false);
    if (db) simd::column_sums(dy, g_.batch, out, db);
  }

 private:
  LinearGeometry g_;
  TransposedWeights wt_;
  std::vector<float> dyt_;
};

// Dense (groups == 1) convolution as GEMMs over im2col patches [rows][K], K = kh * kw * Cin
// in the weights' OHWI order, a chunk of output positions at a time.
class PortableConv2d final : public Conv2dKernel {
 public:
  explicit PortableConv2d(const Conv2dGeometry& g)
      : g_(g), oh_(g.out_h()), ow_(g.out_w()), k_(g.kernel_h * g.kernel_w * g.in_c), m_(g.batch * oh_ * ow_),
        direct_(g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 &&
                g.pad_w == 0),
        chunk_(std::max<int64_t>(64, (int64_t{1} << 18) / k_)) {}

  void forward(const float* x, const WeightsView& w, float* y) override {
    const float* wt = wt_.get(w, g_.out_c, k_);
    for (int64_t r0 = 0; r0 < m_; r0 += chunk_) {
      const int64_t rows = std::min(chunk_, m_ - r0);
      simd::gemm(rows, g_.out_c, k_, patches(x, r0, rows), k_, wt, g_.out_c, y + r0 * g_.out_c, g_.out_c, false);
    }
    add_bias(y, w.bias, m_, g_.out_c);
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    if (direct_) {
      simd::gemm(m_, k_, g_.out_c, dy, g_.out_c, w.weight, k_, dx, k_, false);
      return;
    }
    std::fill_n(dx, g_.batch * g_.in_h * g_.in_w * g_.in_c, 0.0f);
    for (int64_t r0 = 0; r0 < m_; r0 += chunk_) {
      const int64_t rows = std::min(chunk_, m_ - r0);
      col_.resize(static_cast<std::size_t>(rows * k_));
      simd::gemm(rows, k_, g_.out_c, dy + r0 * g_.out_c, g_.out_c, w.weight, k_, col_.data(), k_, false);
      scatter(r0, rows, dx);
    }
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    for (int64_t r0 = 0; r0 < m_; r0 += chunk_) {
      const int64_t rows = std::min(chunk_, m_ - r0);
      dyt_.resize(static_cast<std::size_t>(rows * g_.out_c));
      simd::transpose(rows, g_.out_c, dy + r0 * g_.out_c, g_.out_c, dyt_.data());
      simd::gemm(g_.out_c, k_, rows, dyt_.data(), rows, patches(x, r0, rows), k_, dw, k_, r0 > 0);
    }
    if (m_ == 0) std::fill_n(dw, g_.out_c * k_, 0.0f);
    if (db) simd::column_sums(dy, m_, g_.out_c, db);
  }

 private:
  // Calls f(row within the chunk, tap index t = ky * kw + kx, input offset or -1 for padding).
  template <typename F>
  void taps(int64_t r0, int64_t rows, F&& f) const {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = r0 + r, n = pos / (oh_ * ow_), oy = pos / ow_ % oh_, ox = pos % ow_;
      for (int64_t ky = 0; ky < g_.kernel_h; ++ky) {
        const int64_t iy = oy * g_.stride_h - g_.pad_h + ky * g_.dilation_h;
        for (int64_t kx = 0; kx < g_.kernel_w; ++kx) {
          const int64_t ix = ox * g_.stride_w - g_.pad_w + kx * g_.dilation_w;
          const bool inside = iy >= 0 && iy < g_.in_h && ix >= 0 && ix < g_.in_w;
          f(r, ky * g_.kernel_w + kx, inside ? ((n * g_.in_h + iy) * g_.in_w + ix) * g_.in_c : -1);
        }
      }
    }
  }

  // The patches of output positions [r0, r0 + rows): x itself for 1x1 convolutions.
  const float* patches(const float* x, int64_t r0, int64_t rows) {
    if (direct_) return x + r0 * g_.in_c;
    col_.resize(static_cast<std::size_t>(rows * k_));
    const std::size_t bytes = static_cast<std::size_t>(g_.in_c) * sizeof(float);
    taps(r0, rows, [&](int64_t r, int64_t t, int64_t at) {
      float* dst = col_.data() + r * k_ + t * g_.in_c;
      if (at < 0) std::memset(dst, 0, bytes);
      else std::memcpy(dst, x + at, bytes);
    });
    return col_.data();
  }

  // dx += the patch gradients in col_ (col2im).
  void scatter(int64_t r0, int64_t rows, float* dx) const {
    taps(r0, rows, [&](int64_t r, int64_t t, int64_t at) {
      if (at < 0) return;
      const float* src = col_.data() + r * k_ + t * g_.in_c;
      float* d = dx + at;
      for (int64_t c = 0; c < g_.in_c; ++c) d[c] += src[c];
    });
  }

  Conv2dGeometry g_;
  int64_t oh_, ow_, k_, m_;
  bool direct_;
  int64_t chunk_;
  TransposedWeights wt_;
  std::vector<float> col_, dyt_;
};

// Everything but linear and dense convolutions comes from the reference backend.
class PortableBackend final : public Backend {
 public:
  explicit PortableBackend(const BackendOptions& options) : reference_(make_reference_backend(options)) {}
  std::string_view name() const override { return "portable"; }
  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dGeometry& g) override {
    if (g.groups != 1) return make_reference_conv2d(g);
    return std::make_unique<PortableConv2d>(g);
  }
  std::unique_ptr<LinearKernel> linear(const LinearGeometry& g) override {
    return std::make_unique<PortableLinear>(g);
  }
  std::unique_ptr<ReluKernel> relu(int64_t elements) override { return reference_->relu(elements); }
  std::unique_ptr<ActivationKernel> activation(const Activation& kind, int64_t elements) override {
    if (auto k = simd::make_activation(kind, elements)) return k;
    return reference_->activation(kind, elements);
  }
  std::unique_ptr<MaxPool2dKernel> max_pool2d(const Pool2dGeometry& g) override { return reference_->max_pool2d(g); }
  std::unique_ptr<AvgPool2dKernel> avg_pool2d(const Pool2dGeometry& g) override { return reference_->avg_pool2d(g); }
  std::unique_ptr<GlobalAvgPoolKernel> global_avg_pool(const GlobalPoolGeometry& g) override {
    return reference_->global_avg_pool(g);
  }
  std::unique_ptr<SoftmaxKernel> softmax(int64_t rows, int64_t channels) override {
    return reference_->softmax(rows, channels);
  }
  std::unique_ptr<AddKernel> add(int64_t elements) override { return reference_->add(elements); }
  std::unique_ptr<BatchNormKernel> batch_norm(const BatchNormGeometry& g) override { return make_reference_batch_norm(g); }
  std::unique_ptr<TokenPoolKernel> token_pool(const TokenPoolGeometry& g) override { return make_reference_token_pool(g); }
  std::unique_ptr<MulKernel> mul(const MulGeometry& g) override { return make_reference_mul(g); }
  std::unique_ptr<DropoutKernel> dropout(int64_t elements) override { return make_reference_dropout(elements); }
  std::unique_ptr<LayerNormKernel> layer_norm(const LayerNormGeometry& g) override { return simd::make_layer_norm(g); }
  std::unique_ptr<AttentionKernel> attention(const AttentionGeometry& g) override { return simd::make_attention(g); }
  std::unique_ptr<GroupedLinearKernel> grouped_linear(const GroupedLinearGeometry& g) override {
    return reference_->grouped_linear(g);
  }

 private:
  std::unique_ptr<Backend> reference_;
};

}  // namespace

std::unique_ptr<Backend> make_portable_backend(const BackendOptions& options) {
  return std::make_unique<PortableBackend>(options);
}

}  // namespace tandem
