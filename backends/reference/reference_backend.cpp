#include "backends/reference/reference_backend.h"

#include "core/avg_pool2d.h"
#include "core/pool_window.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace tandem {
namespace {

using std::size_t;

// Direct loops over every (output, tap) pair; output channel oc of group oc / (out_c / groups)
// reads that group's in_c / groups input channels.
class ReferenceConv2d final : public Conv2dKernel {
 public:
  explicit ReferenceConv2d(const Conv2dGeometry& g)
      : g_(g), oh_(g.out_h()), ow_(g.out_w()), cig_(g.in_c / g.groups), cog_(g.out_c / g.groups) {}

  void forward(const float* x, const WeightsView& w, float* y) override {
    const Conv2dGeometry& g = g_;
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t oy = 0; oy < oh_; ++oy)
        for (int64_t ox = 0; ox < ow_; ++ox) {
          float* out = y + ((n * oh_ + oy) * ow_ + ox) * g.out_c;
          for (int64_t oc = 0; oc < g.out_c; ++oc) out[oc] = w.bias ? w.bias[oc] : 0.0f;
          for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
            const int64_t iy = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
            if (iy < 0 || iy >= g.in_h) continue;
            for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
              const int64_t ix = ox * g.stride_w - g.pad_w + kx * g.dilation_w;
              if (ix < 0 || ix >= g.in_w) continue;
              const float* in = x + ((n * g.in_h + iy) * g.in_w + ix) * g.in_c;
              for (int64_t oc = 0; oc < g.out_c; ++oc) {
                const float* wk = w.weight + ((oc * g.kernel_h + ky) * g.kernel_w + kx) * cig_;
                const float* ig = in + oc / cog_ * cig_;
                float acc = 0.0f;
                for (int64_t ic = 0; ic < cig_; ++ic) acc += ig[ic] * wk[ic];
                out[oc] += acc;
              }
            }
          }
        }
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    const Conv2dGeometry& g = g_;
    std::fill_n(dx, g.batch * g.in_h * g.in_w * g.in_c, 0.0f);
    visit([&](int64_t n, int64_t iy, int64_t ix, int64_t ky, int64_t kx, const float* grad) {
      float* d = dx + ((n * g.in_h + iy) * g.in_w + ix) * g.in_c;
      for (int64_t oc = 0; oc < g.out_c; ++oc) {
        const float go = grad[oc];
        const float* wk = w.weight + ((oc * g.kernel_h + ky) * g.kernel_w + kx) * cig_;
        float* dg = d + oc / cog_ * cig_;
        for (int64_t ic = 0; ic < cig_; ++ic) dg[ic] += go * wk[ic];
      }
    }, dy);
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const Conv2dGeometry& g = g_;
    std::fill_n(dw, g.out_c * g.kernel_h * g.kernel_w * cig_, 0.0f);
    visit([&](int64_t n, int64_t iy, int64_t ix, int64_t ky, int64_t kx, const float* grad) {
      const float* in = x + ((n * g.in_h + iy) * g.in_w + ix) * g.in_c;
      for (int64_t oc = 0; oc < g.out_c; ++oc) {
        const float go = grad[oc];
        float* d = dw + ((oc * g.kernel_h + ky) * g.kernel_w + kx) * cig_;
        const float* ig = in + oc / cog_ * cig_;
        for (int64_t ic = 0; ic < cig_; ++ic) d[ic] += go * ig[ic];
      }
    }, dy);
    if (db) {
      std::fill_n(db, g.out_c, 0.0f);
      const int64_t rows = g.batch * oh_ * ow_;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t oc = 0; oc < g.out_c; ++oc) db[oc] += dy[r * g.out_c + oc];
    }
  }

 private:
  // Calls f(n, iy, ix, ky, kx, dy_row) for every valid (output, tap) pair.
  template <typename F>
  void visit(F&& f, const float* dy) const {
    const Conv2dGeometry& g = g_;
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t oy = 0; oy < oh_; ++oy)
        for (int64_t ox = 0; ox < ow_; ++ox) {
          const float* grad = dy + ((n * oh_ + oy) * ow_ + ox) * g.out_c;
          for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
            const int64_t iy = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
            if (iy < 0 || iy >= g.in_h) continue;
            for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
              const int64_t ix = ox * g.stride_w - g.pad_w + kx * g.dilation_w;
              if (ix < 0 || ix >= g.in_w) continue;
              f(n, iy, ix, ky, kx, grad);
            }
          }
        }
  }

  Conv2dGeometry g_;
  int64_t oh_, ow_, cig_, cog_;
};

class ReferenceLinear final : public LinearKernel {
 public:
  explicit ReferenceLinear(const LinearGeometry& g) : g_(g) {}

  void forward(const float* x, const WeightsView& w, float* y) override {
    const int64_t in = g_.in_features, out = g_.out_features;
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t o = 0; o < out; ++o) {
        const float* xr = x + n * in;
        const float* wr = w.weight + o * in;
        float acc = 0.0f;
        for (int64_t i = 0; i < in; ++i) acc += xr[i] * wr[i];
        y[n * out + o] = acc + (w.bias ? w.bias[o] : 0.0f);
      }
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    const int64_t in = g_.in_features, out = g_.out_features;
    std::fill_n(dx, g_.batch * in, 0.0f);
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t o = 0; o < out; ++o) {
        const float go = dy[n * out + o];
        const float* wr = w.weight + o * in;
        float* d = dx + n * in;
        for (int64_t i = 0; i < in; ++i) d[i] += go * wr[i];
      }
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const int64_t in = g_.in_features, out = g_.out_features;
    std::fill_n(dw, out * in, 0.0f);
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t o = 0; o < out; ++o) {
        const float go = dy[n * out + o];
        const float* xr = x + n * in;
        float* d = dw + o * in;
        for (int64_t i = 0; i < in; ++i) d[i] += go * xr[i];
      }
    if (db) {
      std::fill_n(db, out, 0.0f);
      for (int64_t n = 0; n < g_.batch; ++n)
        for (int64_t o = 0; o < out; ++o) db[o] += dy[n * out + o];
    }
  }

 private:
  LinearGeometry g_;
};

class ReferenceRelu final : public ReluKernel {
 public:
  explicit ReferenceRelu(int64_t n) : n_(n) {}
  void forward(const float* x, float* y) override {
    for (int64_t i = 0; i < n_; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
  void backward(const float* y, const float* dy, float* dx) override {
    for (int64_t i = 0; i < n_; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }

 private:
  int64_t n_;
};

class ReferenceAdd final : public AddKernel {
 public:
  explicit ReferenceAdd(int64_t n) : n_(n) {}
  void forward(const float* a, const float* b, float* y) override {
    for (int64_t i = 0; i < n_; ++i) y[i] = a[i] + b[i];
  }

 private:
  int64_t n_;
};

class ReferenceSoftmax final : public SoftmaxKernel {
 public:
  ReferenceSoftmax(int64_t rows, int64_t channels) : rows_(rows), c_(channels) {}
  void forward(const float* x, float* y) override {
    for (int64_t r = 0; r < rows_; ++r) {
      const float* xr = x + r * c_;
      float* yr = y + r * c_;
      const float peak = *std::max_element(xr, xr + c_);
      double sum = 0.0;
      for (int64_t k = 0; k < c_; ++k) sum += std::exp(static_cast<double>(xr[k] - peak));
      for (int64_t k = 0; k < c_; ++k) yr[k] = static_cast<float>(std::exp(static_cast<double>(xr[k] - peak)) / sum);
    }
  }
  void backward(const float* y, const float* dy, float* dx) override {
    for (int64_t r = 0; r < rows_; ++r) {
      double dot = 0.0;
      for (int64_t k = 0; k < c_; ++k) dot += static_cast<double>(dy[r * c_ + k]) * y[r * c_ + k];
      for (int64_t k = 0; k < c_; ++k)
        dx[r * c_ + k] = static_cast<float>(y[r * c_ + k] * (dy[r * c_ + k] - dot));
    }
  }

 private:
  int64_t rows_, c_;
};

class ReferenceGlobalAvgPool final : public GlobalAvgPoolKernel {
 public:
  explicit ReferenceGlobalAvgPool(const GlobalPoolGeometry& g) : g_(g) {}
  void forward(const float* x, float* y) override {
    const int64_t plane = g_.in_h * g_.in_w, c = g_.channels;
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t k = 0; k < c; ++k) {
        double s = 0.0;
        for (int64_t p = 0; p < plane; ++p) s += x[(n * plane + p) * c + k];
        y[n * c + k] = static_cast<float>(s / static_cast<double>(plane));
      }
  }
  void backward(const float* dy, float* dx) override {
    const int64_t plane = g_.in_h * g_.in_w, c = g_.channels;
    const float inv = 1.0f / static_cast<float>(plane);
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t p = 0; p < plane; ++p)
        for (int64_t k = 0; k < c; ++k) dx[(n * plane + p) * c + k] = dy[n * c + k] * inv;
  }

 private:
  GlobalPoolGeometry g_;
};

class ReferenceActivation final : public ActivationKernel {
 public:
  ReferenceActivation(const Activation& kind, int64_t n) : kind_(kind), n_(n) {}
  void forward(const float* x, float* y) override {
    for (int64_t i = 0; i < n_; ++i) y[i] = kind_.forward(x[i]);
  }
  void backward(const float* x, const float* y, const float* dy, float* dx) override {
    for (int64_t i = 0; i < n_; ++i) dx[i] = kind_.backward(x[i], y[i], dy[i]);
  }

 private:
  const Activation& kind_;
  int64_t n_;
};

// Stash: for each output element, the flat input index (iy * W + ix) of its maximum.
class ReferenceMaxPool2d final : public MaxPool2dKernel {
 public:
  explicit ReferenceMaxPool2d(const Pool2dGeometry& g) : g_(g), oh_(g.out_h()), ow_(g.out_w()) {}

  size_t stash_bytes() const override {
    return static_cast<size_t>(g_.batch * oh_ * ow_ * g_.channels) * sizeof(int32_t);
  }

  void forward(const float* x, float* y, void* stash) override {
    auto* arg = static_cast<int32_t*>(stash);
    const Pool2dGeometry& g = g_;
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t oy = 0; oy < oh_; ++oy)
        for (int64_t ox = 0; ox < ow_; ++ox)
          for (int64_t c = 0; c < g.channels; ++c) {
            const WindowMax best = max_in_window(g, x, n, oy, ox, c);
            const int64_t o = ((n * oh_ + oy) * ow_ + ox) * g.channels + c;
            y[o] = best.value;
            arg[o] = best.at;
          }
  }

  void backward(const float* dy, const void* stash, float* dx) override {
    const auto* arg = static_cast<const int32_t*>(stash);
    const Pool2dGeometry& g = g_;
    const int64_t plane = g.in_h * g.in_w;
    std::fill_n(dx, g.batch * plane * g.channels, 0.0f);
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t p = 0; p < oh_ * ow_; ++p)
        for (int64_t c = 0; c < g.channels; ++c) {
          const int64_t o = (n * oh_ * ow_ + p) * g.channels + c;
          if (arg[o] >= 0) dx[(n * plane + arg[o]) * g.channels + c] += dy[o];
        }
  }

 private:
  Pool2dGeometry g_;
  int64_t oh_, ow_;
};

class ReferenceAvgPool2d final : public AvgPool2dKernel {
 public:
  explicit ReferenceAvgPool2d(const Pool2dGeometry& g) : g_(g) {}
  void forward(const float* x, float* y) override { avg_pool2d_forward(g_, x, y); }
  void backward(const float* dy, float* dx) override { avg_pool2d_backward(g_, dy, dx); }

 private:
  Pool2dGeometry g_;
};

class ReferenceGroupedLinear final : public GroupedLinearKernel {
 public:
  explicit ReferenceGroupedLinear(const GroupedLinearGeometry& g) : g_(g) {}

  void forward(const float* x, const WeightsView& w, float* y) override {
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t o = 0; o < O; ++o) {
          const float* xr = x + n * G * I + g * I;
          const float* wr = w.weight + (g * O + o) * I;
          float acc = 0.0f;
          for (int64_t i = 0; i < I; ++i) acc += xr[i] * wr[i];
          y[n * G * O + g * O + o] = acc + (w.bias ? w.bias[g * O + o] : 0.0f);
        }
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    std::fill_n(dx, g_.batch * G * I, 0.0f);
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t o = 0; o < O; ++o) {
          const float go = dy[n * G * O + g * O + o];
          const float* wr = w.weight + (g * O + o) * I;
          float* d = dx + n * G * I + g * I;
          for (int64_t i = 0; i < I; ++i) d[i] += go * wr[i];
        }
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    std::fill_n(dw, G * O * I, 0.0f);
    if (db) std::fill_n(db, G * O, 0.0f);
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t o = 0; o < O; ++o) {
          const float go = dy[n * G * O + g * O + o];
          const float* xr = x + n * G * I + g * I;
          float* d = dw + (g * O + o) * I;
          for (int64_t i = 0; i < I; ++i) d[i] += go * xr[i];
          if (db) db[g * O + o] += go;
        }
  }

 private:
  GroupedLinearGeometry g_;
};

// Layer normalisation per row, in double: the oracle the other backends are tested against.
class ReferenceLayerNorm final : public LayerNormKernel {
 public:
  explicit ReferenceLayerNorm(const LayerNormGeometry& g) : g_(g) {}
  void forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* var) override {
    const int64_t n = g_.features;
    for (int64_t r = 0; r < g_.rows; ++r) {
      const float* xr = x + r * n;
      double s = 0.0, ss = 0.0;
      for (int64_t i = 0; i < n; ++i) s += xr[i];
      const double m = s / static_cast<double>(n);
      for (int64_t i = 0; i < n; ++i) ss += (xr[i] - m) * (xr[i] - m);
      const double v = ss / static_cast<double>(n);
      const double rstd = 1.0 / std::sqrt(v + g_.eps);
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = static_cast<float>((xr[i] - m) * rstd * gamma[i] + beta[i]);
      mean[r] = static_cast<float>(m);
      var[r] = static_cast<float>(v);
    }
  }
  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* var, float* dx,
                float* dgamma, float* dbeta) override {
    const int64_t n = g_.features;
    std::vector<double> dg(static_cast<std::size_t>(n), 0.0), db(static_cast<std::size_t>(n), 0.0);
    for (int64_t r = 0; r < g_.rows; ++r) {
      const float* xr = x + r * n;
      const float* dyr = dy + r * n;
      const double rstd = 1.0 / std::sqrt(static_cast<double>(var[r]) + g_.eps);
      double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double xhat = (xr[i] - mean[r]) * rstd;
        const double dxhat = static_cast<double>(dyr[i]) * gamma[i];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        dg[static_cast<std::size_t>(i)] += dyr[i] * xhat;
        db[static_cast<std::size_t>(i)] += dyr[i];
      }
      if (dx == nullptr) continue;
      for (int64_t i = 0; i < n; ++i) {
        const double xhat = (xr[i] - mean[r]) * rstd;
        const double dxhat = static_cast<double>(dyr[i]) * gamma[i];
        dx[r * n + i] = static_cast<float>(rstd / static_cast<double>(n) *
                                           (static_cast<double>(n) * dxhat - sum_dxhat - xhat * sum_dxhat_xhat));
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      dgamma[i] = static_cast<float>(dg[static_cast<std::size_t>(i)]);
      dbeta[i] = static_cast<float>(db[static_cast<std::size_t>(i)]);
    }
  }

 private:
  LayerNormGeometry g_;
};

// Attention per sample, head, query and key, in double: the oracle.
class ReferenceAttention final : public AttentionKernel {
 public:
  explicit ReferenceAttention(const AttentionGeometry& g) : g_(g) {}
  void forward(const float* q, const float* k, const float* v, const float* mask, float* out, float* probs) override {
    const int64_t T = g_.tokens, D = g_.features(), dh = g_.head_dim;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    std::vector<double> s(static_cast<std::size_t>(T));
    for (int64_t b = 0; b < g_.batch; ++b)
      for (int64_t h = 0; h < g_.heads; ++h)
        for (int64_t i = 0; i < T; ++i) {
          float* p = probs + ((b * g_.heads + h) * T + i) * T;
          double top = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < T; ++j) {
            const bool keep = (!mask || mask[b * T + j] != 0.0f) && (!g_.causal || j <= i);
            double dot = 0.0;
            for (int64_t d = 0; d < dh; ++d)
              dot += static_cast<double>(q[(b * T + i) * D + h * dh + d]) * k[(b * T + j) * D + h * dh + d];
            s[static_cast<std::size_t>(j)] = keep ? dot * scale : -std::numeric_limits<double>::infinity();
            top = std::max(top, s[static_cast<std::size_t>(j)]);
          }
          double sum = 0.0;
          for (int64_t j = 0; j < T; ++j) {
            const double e = std::isinf(top) ? 0.0 : std::exp(s[static_cast<std::size_t>(j)] - top);
            s[static_cast<std::size_t>(j)] = e;
            sum += e;
          }
          for (int64_t j = 0; j < T; ++j) p[j] = sum > 0.0 ? static_cast<float>(s[static_cast<std::size_t>(j)] / sum) : 0.0f;
          for (int64_t d = 0; d < dh; ++d) {
            double o = 0.0;
            for (int64_t j = 0; j < T; ++j) o += static_cast<double>(p[j]) * v[(b * T + j) * D + h * dh + d];
            out[(b * T + i) * D + h * dh + d] = static_cast<float>(o);
          }
        }
  }
  void backward(const float* q, const float* k, const float* v, const float* probs, const float* dout, float* dq,
                float* dk, float* dv) override {
    const int64_t T = g_.tokens, D = g_.features(), dh = g_.head_dim;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    const std::size_t n = static_cast<std::size_t>(g_.batch * T * D);
    std::vector<double> gq(n, 0.0), gk(n, 0.0), gv(n, 0.0), dp(static_cast<std::size_t>(T));
    for (int64_t b = 0; b < g_.batch; ++b)
      for (int64_t h = 0; h < g_.heads; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const float* p = probs + ((b * g_.heads + h) * T + i) * T;
          const float* go = dout + (b * T + i) * D + h * dh;
          double dot_pdp = 0.0;
          for (int64_t j = 0; j < T; ++j) {
            double x = 0.0;
            for (int64_t d = 0; d < dh; ++d) {
              x += static_cast<double>(go[d]) * v[(b * T + j) * D + h * dh + d];
              gv[static_cast<std::size_t>((b * T + j) * D + h * dh + d)] += static_cast<double>(p[j]) * go[d];
            }
            dp[static_cast<std::size_t>(j)] = x;
            dot_pdp += x * p[j];
          }
          for (int64_t j = 0; j < T; ++j) {
            const double ds = p[j] * (dp[static_cast<std::size_t>(j)] - dot_pdp) * scale;
            for (int64_t d = 0; d < dh; ++d) {
              gq[static_cast<std::size_t>((b * T + i) * D + h * dh + d)] += ds * k[(b * T + j) * D + h * dh + d];
              gk[static_cast<std::size_t>((b * T + j) * D + h * dh + d)] += ds * q[(b * T + i) * D + h * dh + d];
            }
          }
        }
    for (std::size_t x = 0; x < n; ++x) {
      if (dq) dq[x] = static_cast<float>(gq[x]);
      if (dk) dk[x] = static_cast<float>(gk[x]);
      if (dv) dv[x] = static_cast<float>(gv[x]);
    }
  }

 private:
  AttentionGeometry g_;
};

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }
  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dGeometry& g) override {
    return std::make_unique<ReferenceConv2d>(g);
  }
  std::unique_ptr<LinearKernel> linear(const LinearGeometry& g) override {
    return std::make_unique<ReferenceLinear>(g);
  }
  std::unique_ptr<ReluKernel> relu(int64_t elements) override {
    return std::make_unique<ReferenceRelu>(elements);
  }
  std::unique_ptr<MaxPool2dKernel> max_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<ReferenceMaxPool2d>(g);
  }
  std::unique_ptr<ActivationKernel> activation(const Activation& kind, int64_t elements) override {
    return std::make_unique<ReferenceActivation>(kind, elements);
  }
  std::unique_ptr<AvgPool2dKernel> avg_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<ReferenceAvgPool2d>(g);
  }
  std::unique_ptr<GlobalAvgPoolKernel> global_avg_pool(const GlobalPoolGeometry& g) override {
    return std::make_unique<ReferenceGlobalAvgPool>(g);
  }
  std::unique_ptr<SoftmaxKernel> softmax(int64_t rows, int64_t channels) override {
    return std::make_unique<ReferenceSoftmax>(rows, channels);
  }
  std::unique_ptr<AddKernel> add(int64_t elements) override { return std::make_unique<ReferenceAdd>(elements); }
  std::unique_ptr<GroupedLinearKernel> grouped_linear(const GroupedLinearGeometry& g) override {
    return std::make_unique<ReferenceGroupedLinear>(g);
  }
  std::unique_ptr<BatchNormKernel> batch_norm(const BatchNormGeometry& g) override { return make_reference_batch_norm(g); }
  std::unique_ptr<TokenPoolKernel> token_pool(const TokenPoolGeometry& g) override { return make_reference_token_pool(g); }
  std::unique_ptr<MulKernel> mul(const MulGeometry& g) override { return make_reference_mul(g); }
  std::unique_ptr<DropoutKernel> dropout(int64_t elements) override { return make_reference_dropout(elements); }
  std::unique_ptr<LayerNormKernel> layer_norm(const LayerNormGeometry& g) override {
    return std::make_unique<ReferenceLayerNorm>(g);
  }
  std::unique_ptr<AttentionKernel> attention(const AttentionGeometry& g) override {
    return std::make_unique<ReferenceAttention>(g);
  }
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_reference_conv2d(const Conv2dGeometry& g) {
  return std::make_unique<ReferenceConv2d>(g);
}

std::unique_ptr<Backend> make_reference_backend(const BackendOptions&) {
  return std::make_unique<ReferenceBackend>();
}

}  // namespace tandem

namespace tandem {

std::unique_ptr<ActivationKernel> make_reference_activation(const Activation& kind, int64_t elements) {
  return std::make_unique<ReferenceActivation>(kind, elements);
}

}  // namespace tandem
