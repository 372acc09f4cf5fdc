// Conv2d through XNNPACK: forward is a convolution, backward_data the matching
// deconvolution (transposed convolution). 3x3 same layers with channels in 16s run every pass
// as core's Winograd F(2x2, 3x3). Otherwise, when Cout is a multiple of 16, backward_weights is
// core's direct SIMD kernel (XNNPACK 2022 has no GEMM with two changing operands, and packing
// one per call cost more than the math), and so is the forward of layers with few taps x
// input channels (K <= 32: XNNPACK's tiles ran at a quarter of peak on a 3x3x1 first layer).
// Otherwise backward_weights is fully connected GEMMs over a transposed im2col, built in
// cache-sized chunks of output rows.
#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/simd/direct_conv2d.h"
#include "backends/simd/winograd_conv2d.h"
#include "backends/xnnpack/xnnpack_common.h"

namespace tandem::xnn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Budget for one chunk of backward_weights' transposed im2col (L2 is 1 MiB or more on the
// x86-64 and arm64 cores this targets; the packed dy slice and the GEMM's tiles share it).
constexpr int64_t kChunkBytes = 384 * 1024;

// One kernel tap (ky, kx): input offset of output (0, 0), and the outputs whose input is inside.
struct Tap {
  int64_t off_y = 0, off_x = 0;
  int64_t oy0 = 0, oy1 = 0, ox0 = 0, ox1 = 0;  // [oy0, oy1) x [ox0, ox1)
};

uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }
size_t sz(int64_t v) { return static_cast<size_t>(v); }

class XnnConv2d final : public Conv2dKernel {
 public:
  XnnConv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g)
      : ctx_(std::move(ctx)), g_(g), oh_(g.out_h()), ow_(g.out_w()), where_(g.str()) {
    if (g.batch < 1 || g.in_h < 1 || g.in_w < 1 || g.in_c < 1 || g.out_c < 1 || g.kernel_h < 1 || g.kernel_w < 1 ||
        g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 || g.pad_w < 0 || g.dilation_h < 1 || g.dilation_w < 1 ||
        oh_ < 1 || ow_ < 1)
      fail("xnnpack", cat("invalid geometry: ", where_));
    taps_ = g.kernel_h * g.kernel_w;
    k_ = taps_ * g.in_c;
    m_ = g.batch * oh_ * ow_;
    // The deconvolution's output is stride * (oh - 1) + dilated kernel - 2 * pad + adjustment;
    // the adjustment (< stride) makes it exactly in_h x in_w.
    adjust_h_ = u32((g.in_h + 2 * g.pad_h - g.dilation_h * (g.kernel_h - 1) - 1) % g.stride_h);
    adjust_w_ = u32((g.in_w + 2 * g.pad_w - g.dilation_w * (g.kernel_w - 1) - 1) % g.stride_w);
    // A 1x1, stride 1, unpadded convolution's transposed im2col is x^T itself.
    pointwise_ = taps_ == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0;
    // With unit strides and OW == W a source row and its destination row are equally long, so
    // the valid rows of a plane are one contiguous copy (then the border columns are zeroed).
    plane_copy_ = g.stride_h == 1 && g.stride_w == 1 && ow_ == g.in_w;
    for (int64_t ky = 0; ky < g.kernel_h; ++ky)
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        Tap t;
        t.off_y = ky * g.dilation_h - g.pad_h;
        t.off_x = kx * g.dilation_w - g.pad_w;
        std::tie(t.oy0, t.oy1) = valid_range(t.off_y, g.stride_h, g.in_h, oh_);
        std::tie(t.ox0, t.ox1) = valid_range(t.off_x, g.stride_w, g.in_w, ow_);
        tap_.push_back(t);
      }
    // backward_weights works on chunks of whole output rows whose transposed im2col
    // (K x rows * OW floats) stays in L2, as does the slice of dy packed for it.
    // Winograd's chunks of tiles spread over the backend's thread pool, when it has one.
    const int workers = ctx_->threads();
    if (simd::WinogradConv2d::supports(g)) {  // every pass: nothing else to set up
      winograd_ = std::make_unique<simd::WinogradConv2d>(g);
      if (workers > 1) winograd_->set_parallel(workers, ctx_->parallel_for());
      return;
    }
    if (simd::DirectConv2d::supports(g)) {
      direct_ = std::make_unique<simd::DirectConv2d>(g);
      if (workers > 1) direct_->set_parallel(workers, ctx_->parallel_for());
      direct_forward_ = simd::DirectConv2d::forward_pays(g);
      wt_ = aligned_floats(sz(g.out_c * k_));
      return;
    }
    chunk_rows_ = std::clamp<int64_t>(kChunkBytes / (k_ * ow_ * int64_t{sizeof(float)}), 1, g.batch * oh_);

    wt_ = aligned_floats(sz(g.out_c * k_));
    xt_ = input_scratch(g.batch * g.in_h * g.in_w * g.in_c);
    if (!pointwise_) colst_ = input_scratch(k_ * chunk_rows_ * ow_);
    pack_cols_ = !pointwise_ && k_ < g.out_c;
    if (pack_cols_) dyt_ = input_scratch(g.out_c * chunk_rows_ * ow_);
    dwt_ = aligned_floats(sz(k_ * g.out_c));
    part_ = aligned_floats(sz(k_ * g.out_c));
  }

  void forward(const float* x, const WeightsView& w, float* y) override {
    const Conv2dGeometry& g = g_;
    if (direct_forward_) {
      require_weights(w);
      return direct_->forward(x, w.weight, w.version, w.bias, y);
    }
    if (winograd_) {
      require_weights(w);
      return winograd_->forward(x, w.weight, w.version, w.bias, y);
    }
    if (!fwd_.holds(w, /*uses_bias=*/true)) {
      require_weights(w);
      fwd_.op.reset();  // free the old packing before making the new one
      xnn_operator_t op = nullptr;
      check(xnn_create_convolution2d_nhwc_f32(u32(g.pad_h), u32(g.pad_w), u32(g.pad_h), u32(g.pad_w), u32(g.kernel_h),
                                              u32(g.kernel_w), u32(g.stride_h), u32(g.stride_w), u32(g.dilation_h),
                                              u32(g.dilation_w), /*groups=*/1, sz(g.in_c), sz(g.out_c), sz(g.in_c),
                                              sz(g.out_c), w.weight, w.bias, -kInf, kInf, 0, &op),
            "xnn_create_convolution2d_nhwc_f32", where_);
      fwd_.reset(op, w);
    }
    pthreadpool_t pool = ctx_->threadpool();
    check(xnn_setup_convolution2d_nhwc_f32(fwd_.op.get(), sz(g.batch), sz(g.in_h), sz(g.in_w), x, y, pool),
          "xnn_setup_convolution2d_nhwc_f32", where_);
    check(xnn_run_operator(fwd_.op.get(), pool), "xnn_run_operator (conv2d forward)", where_);
  }

  // dx = conv_transpose(dy, W): XNNPACK's deconvolution takes weights [Cin][kh][kw][Cout]
  // (its output channels first) and places tap (ky, kx) of input pixel (oy, ox) at
  // (oy * stride - pad + ky * dilation, ...), exactly the adjoint of the forward: no flip.
  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    const Conv2dGeometry& g = g_;
    if (winograd_) {
      require_weights(w);
      return winograd_->backward_data(dy, w.weight, w.version, dx);
    }
    if (!bwd_.holds(w, /*uses_bias=*/false)) {
      require_weights(w);
      bwd_.op.reset();
      // wt[ci][t][oc] = w[oc][t][ci]
      const int64_t ic = g.in_c, oc = g.out_c;
      float* wt = wt_.get();
      for (int64_t t = 0; t < taps_; ++t)
        for (int64_t o = 0; o < oc; ++o) {
          const float* src = w.weight + (o * taps_ + t) * ic;
          for (int64_t i = 0; i < ic; ++i) wt[(i * taps_ + t) * oc + o] = src[i];
        }
      xnn_operator_t op = nullptr;
      check(xnn_create_deconvolution2d_nhwc_f32(u32(g.pad_h), u32(g.pad_w), u32(g.pad_h), u32(g.pad_w),
                                                u32(g.kernel_h), u32(g.kernel_w), u32(g.stride_h), u32(g.stride_w),
                                                u32(g.dilation_h), u32(g.dilation_w), /*groups=*/1, sz(g.out_c),
                                                sz(g.in_c), sz(g.out_c), sz(g.in_c), wt, /*bias=*/nullptr, -kInf, kInf,
                                                0, &op),
            "xnn_create_deconvolution2d_nhwc_f32", where_);
      bwd_.reset(op, w);
    }
    pthreadpool_t pool = ctx_->threadpool();
    check(xnn_setup_deconvolution2d_nhwc_f32(bwd_.op.get(), sz(g.batch), sz(oh_), sz(ow_), adjust_h_, adjust_w_, dy,
                                             dx, pool),
          "xnn_setup_deconvolution2d_nhwc_f32", where_);
    check(xnn_run_operator(bwd_.op.get(), pool), "xnn_run_operator (conv2d backward_data)", where_);
  }

  // dW^T[K, Cout] = cols^T[K, M] dy[M, Cout] with K = kh*kw*Cin, M = N*OH*OW: the transposed
  // im2col is the GEMM's input and dy (the smaller operand) is packed as weights
  // [in = M, out = Cout], so the per-call operator creation packs only dy. M is split into
  // chunks of output rows (one operator each, partial products summed) so the im2col and the
  // packed dy stay in cache. dW^T is then transposed into OHWI. db = column sums of dy.
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    if (winograd_) return winograd_->weight_grad(x, dy, dw, db);
    if (direct_) return direct_->weight_grad(x, dy, dw, db);
    const Conv2dGeometry& g = g_;
    pthreadpool_t pool = ctx_->threadpool();
    transpose(x, g.batch * g.in_h * g.in_w, g.in_c, xt_.get());
    const int64_t rows = g.batch * oh_, k_out = k_ * g.out_c;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows_) {
      const int64_t mc = std::min(chunk_rows_, rows - r0) * ow_, m0 = r0 * ow_;
      const float* cols = xt_.get() + m0;  // pointwise: x^T itself, rows m_ apart
      size_t cols_stride = sz(m_);
      if (!pointwise_) {
        im2col_transposed(r0, mc / ow_);
        cols = colst_.get();
        cols_stride = sz(mc);
      }
      xnn_operator_t created = nullptr;
      float* out = nullptr;
      float* acc = nullptr;
      if (pack_cols_) {
        // K < Cout (first layers, Cin small): the im2col chunk [K][mc] is the smaller operand
        // and already in XNNPACK's [out][in] weight layout; dy's chunk is transposed to the
        // GEMM input [Cout][mc], and the output is dW [Cout][K] (OHWI) itself.
        transpose(dy + m0 * g.out_c, mc, g.out_c, dyt_.get());
        check(xnn_create_fully_connected_nc_f32(sz(mc), sz(k_), sz(mc), sz(k_), cols, nullptr, -kInf, kInf, 0,
                                                &created),
              "xnn_create_fully_connected_nc_f32 (conv2d backward_weights)", where_);
        acc = dw;
      } else {
        check(xnn_create_fully_connected_nc_f32(sz(mc), sz(g.out_c), cols_stride, sz(g.out_c), dy + m0 * g.out_c,
                                                nullptr, -kInf, kInf, XNN_FLAG_TRANSPOSE_WEIGHTS, &created),
              "xnn_create_fully_connected_nc_f32 (conv2d backward_weights)", where_);
        acc = dwt_.get();
      }
      Operator op(created);
      out = r0 == 0 ? acc : part_.get();
      check(xnn_setup_fully_connected_nc_f32(op.get(), pack_cols_ ? sz(g.out_c) : sz(k_), pack_cols_ ? dyt_.get() : cols,
                                             out, pool),
            "xnn_setup_fully_connected_nc_f32 (conv2d backward_weights)", where_);
      check(xnn_run_operator(op.get(), pool), "xnn_run_operator (conv2d backward_weights)", where_);
      if (r0 != 0)
        for (int64_t i = 0; i < k_out; ++i) acc[i] += out[i];
    }
    if (!pack_cols_) transpose(dwt_.get(), k_, g.out_c, dw);
    if (db) column_sums(dy, m_, g.out_c, db);
  }

 private:
  void require_weights(const WeightsView& w) const {
    if (w.weight == nullptr) fail("xnnpack", cat("no weights given for ", where_));
  }

  // colst[(ky * kw + kx) * Cin + ci][j] = x[n][iy][ix][ci] (0 in the padding) for the chunk's
  // j-th output position (n, oy, ox) = output rows [r0, r0 + count), read from
  // xt = x^T [Cin][N][H][W] so each destination row is built from contiguous runs.
  void im2col_transposed(int64_t r0, int64_t count) {
    const Conv2dGeometry& g = g_;
    const int64_t plane = g.in_h * g.in_w, image = g.batch * plane, mc = count * ow_;
    for (int64_t t = 0; t < taps_; ++t)
      for (int64_t ci = 0; ci < g.in_c; ++ci) {
        float* row = colst_.get() + (t * g.in_c + ci) * mc;
        const float* src_c = xt_.get() + ci * image;
        for (int64_t r = r0; r < r0 + count;) {  // one image's rows at a time
          const int64_t n = r / oh_, a = r % oh_, b = std::min(oh_, a + (r0 + count - r));
          im2col_rows(tap_[static_cast<size_t>(t)], src_c + n * plane, a, b, row + (r - r0) * ow_);
          r += b - a;
        }
      }
  }

  // Output rows [a, b) of one (tap, channel, image): dst[(oy - a) * OW + ox].
  void im2col_rows(const Tap& t, const float* src, int64_t a, int64_t b, float* dst) const {
    const Conv2dGeometry& g = g_;
    const int64_t v0 = std::max(a, t.oy0), v1 = std::min(b, t.oy1);
    if (v1 <= v0 || t.ox1 <= t.ox0) {
      std::fill_n(dst, (b - a) * ow_, 0.0f);
      return;
    }
    std::fill_n(dst, (v0 - a) * ow_, 0.0f);
    std::fill_n(dst + (v1 - a) * ow_, (b - v1) * ow_, 0.0f);
    if (plane_copy_) {
      // From the first valid element (v0, ox0) to the last one (v1 - 1, ox1 - 1) in one run.
      const int64_t first = (v0 - a) * ow_ + t.ox0, end = (v1 - 1 - a) * ow_ + t.ox1;
      const float* from = src + (v0 + t.off_y) * g.in_w + t.ox0 + t.off_x;
      std::copy(from, from + (end - first), dst + first);
      for (int64_t oy = v0; oy < v1; ++oy) {
        float* d = dst + (oy - a) * ow_;
        std::fill_n(d, t.ox0, 0.0f);
        std::fill_n(d + t.ox1, ow_ - t.ox1, 0.0f);
      }
      return;
    }
    for (int64_t oy = v0; oy < v1; ++oy) {
      float* d = dst + (oy - a) * ow_;
      const float* s = src + (oy * g.stride_h + t.off_y) * g.in_w + t.off_x;
      std::fill_n(d, t.ox0, 0.0f);
      for (int64_t ox = t.ox0; ox < t.ox1; ++ox) d[ox] = s[ox * g.stride_w];
      std::fill_n(d + t.ox1, ow_ - t.ox1, 0.0f);
    }
  }

  // Outputs o in [first, end) whose input coordinate o * stride + offset lies in [0, size).
  static std::pair<int64_t, int64_t> valid_range(int64_t offset, int64_t stride, int64_t size, int64_t outputs) {
    int64_t first = 0;
    while (first < outputs && first * stride + offset < 0) ++first;
    int64_t end = first;
    while (end < outputs && end * stride + offset < size) ++end;
    return {first, end};
  }

  std::shared_ptr<const Context> ctx_;
  Conv2dGeometry g_;
  int64_t oh_, ow_;
  std::string where_;
  int64_t taps_ = 1, k_ = 1, m_ = 1;
  uint32_t adjust_h_ = 0, adjust_w_ = 0;
  bool pointwise_ = false, plane_copy_ = false;
  bool pack_cols_ = false;  // backward_weights packs the im2col (K < Cout) instead of dy
  std::vector<Tap> tap_;  // per (ky, kx)
  int64_t chunk_rows_ = 1;
  std::unique_ptr<float, AlignedFree> wt_;     // weights as [Cin][kh][kw][Cout]
  std::unique_ptr<float, AlignedFree> xt_;     // x^T [Cin][N][H][W]
  std::unique_ptr<float, AlignedFree> colst_;  // one chunk's transposed im2col [K][rows * OW]
  std::unique_ptr<float, AlignedFree> dwt_;    // dW^T [K][Cout]
  std::unique_ptr<float, AlignedFree> part_;   // a later chunk's share of dW^T (or dW)
  std::unique_ptr<float, AlignedFree> dyt_;    // one chunk of dy^T [Cout][rows * OW] (pack_cols_)
  PackedOperator fwd_, bwd_;
  std::unique_ptr<simd::DirectConv2d> direct_;  // backward_weights when Cout % 16 == 0 (not Winograd)
  std::unique_ptr<simd::WinogradConv2d> winograd_;  // every pass of 3x3 same layers
  bool direct_forward_ = false;                 // and forward, for few taps x input channels
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(std::shared_ptr<const Context> ctx, const Conv2dGeometry& g) {
  if (g.groups != 1) return make_grouped_conv2d(std::move(ctx), g);
  return std::make_unique<XnnConv2d>(std::move(ctx), g);
}

}  // namespace tandem::xnn
