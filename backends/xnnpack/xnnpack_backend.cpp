// The XNNPACK backend: initialization, the thread pool, registration, and the cheap ops
// (ReLU, max pooling); linear and conv2d live in xnnpack_linear.cpp / xnnpack_conv2d.cpp.
#include "backends/xnnpack/xnnpack_backend.h"

#include "core/avg_pool2d.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "backends/reference/reference_backend.h"
#include "backends/simd/activation.h"
#include "backends/simd/attention.h"
#include "backends/simd/layer_norm.h"
#include "backends/simd/max_pool_2x2.h"
#include "core/tensor.h"
#include "backends/xnnpack/xnnpack_common.h"

namespace tandem {
namespace xnn {

void initialize() {
  static std::once_flag once;
  static xnn_status status = xnn_status_uninitialized;
  std::call_once(once, [] { status = xnn_initialize(/*allocator=*/nullptr); });
  if (status != xnn_status_success)
    fail("xnnpack", cat("xnn_initialize failed: status ", static_cast<int>(status),
                        " (XNNPACK does not support this CPU or is out of memory)"));
}

void fail_status(const char* call, xnn_status status, const std::string& where) {
  fail("xnnpack", cat(call, " failed: status ", static_cast<int>(status), " for ", where));
}

namespace {

// One full kB x kB block (fixed size, so the compiler turns it into register shuffles).
constexpr int64_t kBlock = 4;
inline void transpose_block(const float* __restrict src, int64_t src_stride, float* __restrict dst,
                            int64_t dst_stride) {
  float tile[kBlock][kBlock];
  for (int64_t r = 0; r < kBlock; ++r)
    for (int64_t c = 0; c < kBlock; ++c) tile[c][r] = src[r * src_stride + c];
  for (int64_t c = 0; c < kBlock; ++c)
    for (int64_t r = 0; r < kBlock; ++r) dst[c * dst_stride + r] = tile[c][r];
}

}  // namespace

void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  const int64_t full_rows = rows / kBlock * kBlock, full_cols = cols / kBlock * kBlock;
  for (int64_t r0 = 0; r0 < full_rows; r0 += kBlock) {
    for (int64_t c0 = 0; c0 < full_cols; c0 += kBlock)
      transpose_block(src + r0 * cols + c0, cols, dst + c0 * rows + r0, rows);
    for (int64_t c = full_cols; c < cols; ++c)
      for (int64_t r = r0; r < r0 + kBlock; ++r) dst[c * rows + r] = src[r * cols + c];
  }
  for (int64_t r = full_rows; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

void column_sums(const float* src, int64_t rows, int64_t cols, float* sums) {
  std::fill_n(sums, cols, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * cols;
    for (int64_t c = 0; c < cols; ++c) sums[c] += row[c];
  }
}

namespace {

// mask ? a : b, bitwise (mask all ones or all zeros): keeps the channel loops branch-free so
// that they vectorize.
inline float select(uint32_t mask, float a, float b) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) | (std::bit_cast<uint32_t>(b) & ~mask));
}
inline uint32_t select(uint32_t mask, uint32_t a, uint32_t b) { return (a & mask) | (b & ~mask); }
inline uint32_t all_ones_if(bool condition) { return 0u - static_cast<uint32_t>(condition); }

// ReLU forward is XNNPACK's clamp [0, +inf) over the whole tensor as one row.
class XnnRelu final : public ReluKernel {
 public:
  XnnRelu(std::shared_ptr<const Context> ctx, int64_t elements)
      : ctx_(std::move(ctx)), n_(elements), where_(cat("relu of ", elements, " elements")) {
    if (n_ < 0) fail("xnnpack", cat("invalid geometry: ", where_));
    if (n_ == 0) return;
    const auto channels = static_cast<size_t>(n_);
    xnn_operator_t op = nullptr;
    check(xnn_create_clamp_nc_f32(channels, channels, channels, 0.0f, std::numeric_limits<float>::infinity(),
                                  0, &op),
          "xnn_create_clamp_nc_f32", where_);
    op_.reset(op);
  }

  void forward(const float* x, float* y) override {
    if (n_ == 0) return;
    check(xnn_setup_clamp_nc_f32(op_.get(), 1, x, y, ctx_->threadpool()), "xnn_setup_clamp_nc_f32", where_);
    check(xnn_run_operator(op_.get(), ctx_->threadpool()), "xnn_run_operator (relu)", where_);
  }

  void backward(const float* y, const float* dy, float* dx) override {
    for (int64_t i = 0; i < n_; ++i) dx[i] = select(all_ones_if(y[i] > 0.0f), dy[i], 0.0f);
  }

 private:
  std::shared_ptr<const Context> ctx_;
  int64_t n_;
  std::string where_;
  Operator op_;
};

// relu6 (clamp), hardswish and sigmoid forward through XNNPACK's operators; the others
// (which XNNPACK 2022 lacks: gelu, tanh, silu, ...) and every backward as loops over the
// op's definition (core/activation.h).
class XnnActivation final : public ActivationKernel {
 public:
  XnnActivation(std::shared_ptr<const Context> ctx, const Activation& kind, int64_t elements)
      : ctx_(std::move(ctx)), kind_(kind), n_(elements), where_(cat(kind.name, " of ", elements, " elements")) {
    if (n_ < 0) fail("xnnpack", cat("invalid geometry: ", where_));
    if (n_ == 0) return;
    const auto c = static_cast<size_t>(n_);
    xnn_operator_t op = nullptr;
    if (kind_.name == "relu6") {
      check(xnn_create_clamp_nc_f32(c, c, c, 0.0f, 6.0f, 0, &op), "xnn_create_clamp_nc_f32", where_);
      setup_ = xnn_setup_clamp_nc_f32;
    } else if (kind_.name == "hardswish") {
      check(xnn_create_hardswish_nc_f32(c, c, c, 0, &op), "xnn_create_hardswish_nc_f32", where_);
      setup_ = xnn_setup_hardswish_nc_f32;
    } else if (kind_.name == "sigmoid") {
      check(xnn_create_sigmoid_nc_f32(c, c, c, 0, &op), "xnn_create_sigmoid_nc_f32", where_);
      setup_ = xnn_setup_sigmoid_nc_f32;
    }  // else the portable loop
    op_.reset(op);
  }

  void forward(const float* x, float* y) override {
    if (n_ == 0) return;
    if (!op_) {
      for (int64_t i = 0; i < n_; ++i) y[i] = kind_.forward(x[i]);
      return;
    }
    pthreadpool_t pool = ctx_->threadpool();
    check(setup_(op_.get(), 1, x, y, pool), "xnn_setup (activation)", where_);
    check(xnn_run_operator(op_.get(), pool), "xnn_run_operator (activation)", where_);
  }

  void backward(const float* x, const float* y, const float* dy, float* dx) override {
    for (int64_t i = 0; i < n_; ++i) dx[i] = kind_.backward(x[i], y[i], dy[i]);
  }

 private:
  std::shared_ptr<const Context> ctx_;
  const Activation& kind_;
  int64_t n_;
  std::string where_;
  Operator op_;
  // The setup of the operator made (all three unary ops share this signature).
  xnn_status (*setup_)(xnn_operator_t, size_t, const float*, float*, pthreadpool_t) = nullptr;
};

// Elementwise add through XNNPACK's add_nd over one flat dimension.
class XnnAdd final : public AddKernel {
 public:
  XnnAdd(std::shared_ptr<const Context> ctx, int64_t elements)
      : ctx_(std::move(ctx)), n_(static_cast<size_t>(elements)), where_(cat("add of ", elements, " elements")) {
    if (elements < 1) fail("xnnpack", cat("invalid geometry: ", where_));
    xnn_operator_t op = nullptr;
    check(xnn_create_add_nd_f32(-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(), 0, &op),
          "xnn_create_add_nd_f32", where_);
    op_.reset(op);
  }
  void forward(const float* a, const float* b, float* y) override {
    pthreadpool_t pool = ctx_->threadpool();
    check(xnn_setup_add_nd_f32(op_.get(), 1, &n_, 1, &n_, a, b, y, pool), "xnn_setup_add_nd_f32", where_);
    check(xnn_run_operator(op_.get(), pool), "xnn_run_operator (add)", where_);
  }

 private:
  std::shared_ptr<const Context> ctx_;
  size_t n_;
  std::string where_;
  Operator op_;
};

// Softmax: XNNPACK's operator forward; the backward is a loop (two passes over each row).
class XnnSoftmax final : public SoftmaxKernel {
 public:
  XnnSoftmax(std::shared_ptr<const Context> ctx, int64_t rows, int64_t channels)
      : ctx_(std::move(ctx)), rows_(rows), c_(channels), where_(cat("softmax [", rows, ", ", channels, "]")) {
    if (rows < 1 || channels < 1) fail("xnnpack", cat("invalid geometry: ", where_));
    const auto c = static_cast<size_t>(channels);
    xnn_operator_t op = nullptr;
    check(xnn_create_softmax_nc_f32(c, c, c, 0, &op), "xnn_create_softmax_nc_f32", where_);
    op_.reset(op);
  }
  void forward(const float* x, float* y) override {
    pthreadpool_t pool = ctx_->threadpool();
    check(xnn_setup_softmax_nc_f32(op_.get(), static_cast<size_t>(rows_), x, y, pool), "xnn_setup_softmax_nc_f32",
          where_);
    check(xnn_run_operator(op_.get(), pool), "xnn_run_operator (softmax)", where_);
  }
  void backward(const float* y, const float* dy, float* dx) override {
    for (int64_t r = 0; r < rows_; ++r) {
      const float* yr = y + r * c_;
      const float* dr = dy + r * c_;
      float dot = 0.0f;
      for (int64_t k = 0; k < c_; ++k) dot += dr[k] * yr[k];
      for (int64_t k = 0; k < c_; ++k) dx[r * c_ + k] = yr[k] * (dr[k] - dot);
    }
  }

 private:
  std::shared_ptr<const Context> ctx_;
  int64_t rows_, c_;
  std::string where_;
  Operator op_;
};

// Global average pooling: XNNPACK's operator forward (each image a row of H*W pixels); the
// backward spreads dy / (H*W) in a loop (there is nothing to multiply).
class XnnGlobalAvgPool final : public GlobalAvgPoolKernel {
 public:
  XnnGlobalAvgPool(std::shared_ptr<const Context> ctx, const GlobalPoolGeometry& g)
      : ctx_(std::move(ctx)), g_(g), where_(g.str()) {
    if (g.batch < 1 || g.in_h < 1 || g.in_w < 1 || g.channels < 1) fail("xnnpack", cat("invalid geometry: ", where_));
    const auto c = static_cast<size_t>(g.channels);
    xnn_operator_t op = nullptr;
    check(xnn_create_global_average_pooling_nwc_f32(c, c, c, -std::numeric_limits<float>::infinity(),
                                                    std::numeric_limits<float>::infinity(), 0, &op),
          "xnn_create_global_average_pooling_nwc_f32", where_);
    op_.reset(op);
  }
  void forward(const float* x, float* y) override {
    pthreadpool_t pool = ctx_->threadpool();
    check(xnn_setup_global_average_pooling_nwc_f32(op_.get(), static_cast<size_t>(g_.batch),
                                                   static_cast<size_t>(g_.in_h * g_.in_w), x, y, pool),
          "xnn_setup_global_average_pooling_nwc_f32", where_);
    check(xnn_run_operator(op_.get(), pool), "xnn_run_operator (global average pooling)", where_);
  }
  void backward(const float* dy, float* dx) override {
    const int64_t plane = g_.in_h * g_.in_w, c = g_.channels;
    const float inv = 1.0f / static_cast<float>(plane);
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t p = 0; p < plane; ++p) {
        float* __restrict d = dx + (n * plane + p) * c;
        const float* __restrict s = dy + n * c;
        for (int64_t k = 0; k < c; ++k) d[k] = s[k] * inv;
      }
  }

 private:
  std::shared_ptr<const Context> ctx_;
  GlobalPoolGeometry g_;
  std::string where_;
  Operator op_;
};

// Average pooling: XNNPACK's operator forward for unpadded windows larger than one pixel
// (its padded windows divide by the pixels inside, not PyTorch's kernel size); core's loops
// for the rest and for backward (XNNPACK has none).
class XnnAvgPool2d final : public AvgPool2dKernel {
 public:
  XnnAvgPool2d(std::shared_ptr<const Context> ctx, const Pool2dGeometry& g)
      : ctx_(std::move(ctx)), g_(g), where_(g.str()) {
    if (g.batch < 1 || g.in_h < 1 || g.in_w < 1 || g.channels < 1 || g.kernel_h < 1 || g.kernel_w < 1 ||
        g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 || g.pad_w < 0 || g.out_h() < 1 || g.out_w() < 1)
      fail("xnnpack", cat("invalid geometry: ", where_));
    if (g.pad_h != 0 || g.pad_w != 0 || g.kernel_h * g.kernel_w == 1) return;
    const auto c = static_cast<size_t>(g.channels);
    xnn_operator_t op = nullptr;
    check(xnn_create_average_pooling2d_nhwc_f32(0, 0, 0, 0, static_cast<uint32_t>(g.kernel_h),
                                                static_cast<uint32_t>(g.kernel_w), static_cast<uint32_t>(g.stride_h),
                                                static_cast<uint32_t>(g.stride_w), c, c, c,
                                                -std::numeric_limits<float>::infinity(),
                                                std::numeric_limits<float>::infinity(), 0, &op),
          "xnn_create_average_pooling2d_nhwc_f32", where_);
    op_.reset(op);
  }
  void forward(const float* x, float* y) override {
    if (!op_) return avg_pool2d_forward(g_, x, y);
    pthreadpool_t pool = ctx_->threadpool();
    check(xnn_setup_average_pooling2d_nhwc_f32(op_.get(), static_cast<size_t>(g_.batch),
                                               static_cast<size_t>(g_.in_h), static_cast<size_t>(g_.in_w), x, y,
                                               pool),
          "xnn_setup_average_pooling2d_nhwc_f32", where_);
    check(xnn_run_operator(op_.get(), pool), "xnn_run_operator (average pooling)", where_);
  }
  void backward(const float* dy, float* dx) override { avg_pool2d_backward(g_, dy, dx); }

 private:
  std::shared_ptr<const Context> ctx_;
  Pool2dGeometry g_;
  std::string where_;
  Operator op_;
};

// Max pooling. Non-overlapping windows that tile the input go through XNNPACK's argmax
// pooling, or core's vectorised 2x2 kernels for 2x2 windows (4x faster than argmax pooling plus
// the tie pass). Stash: the index of the maximum inside its window, kx * kh + ky, with ties
// going to the reference's choice, a byte each for 2x2 windows (simd/max_pool_2x2.h) and a
// uint32 otherwise; backward scatters dy to those positions. Other windows (overlapping,
// padded, and 1x1, which XNNPACK refuses) use a portable loop with the reference's semantics
// (stash: int32 flat input index iy * W + ix, -1 when a window sees no input).
class XnnMaxPool2d final : public MaxPool2dKernel {
 public:
  XnnMaxPool2d(std::shared_ptr<const Context> ctx, const Pool2dGeometry& g)
      : ctx_(std::move(ctx)), g_(g), oh_(g.out_h()), ow_(g.out_w()), where_(g.str()) {
    if (g.batch < 1 || g.in_h < 1 || g.in_w < 1 || g.channels < 1 || g.kernel_h < 1 || g.kernel_w < 1 ||
        g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 || g.pad_w < 0 || oh_ < 1 || ow_ < 1)
      fail("xnnpack", cat("invalid geometry: ", where_));
    use_xnnpack_ = g.windows_tile() && g.kernel_h * g.kernel_w > 1;
    if (!use_xnnpack_ || two_by_two()) return;  // 2x2: core's kernels need no operator or index
    const auto kh = static_cast<uint32_t>(g.kernel_h), kw = static_cast<uint32_t>(g.kernel_w);
    const auto c = static_cast<size_t>(g.channels);
    xnn_operator_t op = nullptr;
    check(xnn_create_argmax_pooling2d_nhwc_f32(0, 0, 0, 0, kh, kw, c, c, c, 0, &op),
          "xnn_create_argmax_pooling2d_nhwc_f32", where_);
    argmax_.reset(op);
    for (int64_t at = 0; at < g.kernel_h * g.kernel_w; ++at) {
      row_of_.push_back(static_cast<int32_t>(at % g.kernel_h));
      col_of_.push_back(static_cast<int32_t>(at / g.kernel_h));
    }
    // XNNPACK 2022's pooling operators keep pointers from an earlier setup (seen with
    // unpooling), so argmax pooling always writes this one buffer and the stash is copied out.
    index_.resize(static_cast<size_t>(g.batch * oh_ * ow_ * g.channels));
    winner_y_.resize(static_cast<size_t>(g.channels));
    winner_x_.resize(static_cast<size_t>(g.channels));
  }

  size_t stash_bytes() const override {
    return static_cast<size_t>(g_.batch * oh_ * ow_ * g_.channels) * (two_by_two() ? 1 : sizeof(uint32_t));
  }

  void forward(const float* x, float* y, void* stash) override {
    if (!use_xnnpack_) return portable_forward(x, y, static_cast<int32_t*>(stash));
    if (two_by_two())  // the common case: one vectorised pass, ties already row-first, a byte a winner
      return simd::max_pool_2x2(x, g_.batch, g_.in_h, g_.in_w, g_.channels, y, static_cast<uint8_t*>(stash));
    pthreadpool_t pool = ctx_->threadpool();
    check(xnn_setup_argmax_pooling2d_nhwc_f32(argmax_.get(), static_cast<size_t>(g_.batch),
                                              static_cast<size_t>(g_.in_h), static_cast<size_t>(g_.in_w), x, y,
                                              index_.data(), pool),
          "xnn_setup_argmax_pooling2d_nhwc_f32", where_);
    check(xnn_run_operator(argmax_.get(), pool), "xnn_run_operator (argmax pooling)", where_);
    if (g_.kernel_h > 1 && g_.kernel_w > 1) break_ties_row_first(x, y, index_.data());
    std::memcpy(stash, index_.data(), stash_bytes());
  }

  // The scatter of dy to the argmax positions is a memory-bound hand loop: XNNPACK 2022's
  // unpooling operator keeps pointers from an earlier setup (seen: a later micro-batch's
  // indices and a re-allocated dx were ignored), and there are no FLOPs to win here.
  void backward(const float* dy, const void* stash, float* dx) override {
    if (!use_xnnpack_) return portable_backward(dy, static_cast<const int32_t*>(stash), dx);
    if (two_by_two())
      return simd::max_unpool_2x2(dy, static_cast<const uint8_t*>(stash), g_.batch, g_.in_h, g_.in_w, g_.channels, dx);
    const Pool2dGeometry& g = g_;
    const auto* idx = static_cast<const uint32_t*>(stash);
    const int64_t c = g.channels, kh = g.kernel_h, kw = g.kernel_w;
    // Input rows are written front to back (the windows tile them), each element once, with a
    // bitwise select rather than a branch: ties aside, the winner is unpredictable.
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t oy = 0; oy < oh_; ++oy) {
        const float* __restrict d_row = dy + (n * oh_ + oy) * ow_ * c;
        const uint32_t* __restrict i_row = idx + (n * oh_ + oy) * ow_ * c;
        for (int64_t ky = 0; ky < kh; ++ky) {
          float* __restrict out = dx + (n * g.in_h + oy * kh + ky) * g.in_w * c;
          for (int64_t ox = 0; ox < ow_; ++ox)
            for (int64_t kx = 0; kx < kw; ++kx) {
              const auto at = static_cast<uint32_t>(kx * kh + ky);  // XNNPACK's in-window index
              const float* __restrict d = d_row + ox * c;
              const uint32_t* __restrict io = i_row + ox * c;
              float* __restrict o = out + (ox * kw + kx) * c;
              for (int64_t k = 0; k < c; ++k) o[k] = select(all_ones_if(io[k] == at), d[k], 0.0f);
            }
        }
      }
  }

 private:
  // XNNPACK scans a window column by column (its index is kx * kh + ky) and keeps the first
  // maximum; the reference scans row by row. They differ only on ties: a position after the
  // winner in column order but before it in row order (ky' < ky, kx' > kx) with the same
  // value. Those are re-pointed to the row-first one, so the gradient goes where the
  // reference sends it (everything earlier in column order is smaller, or NaN). y is
  // rewritten too, which matters only for -0 vs +0. Branch-free over channels, so it
  // vectorizes and its loads stream.
  void break_ties_row_first(const float* x, float* y, uint32_t* idx) {
    const Pool2dGeometry& g = g_;
    const int64_t c = g.channels, kh = g.kernel_h, kw = g.kernel_w, row = g.in_w * c;
    int32_t* __restrict wy = winner_y_.data();
    int32_t* __restrict wx = winner_x_.data();
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t oy = 0; oy < oh_; ++oy)
        for (int64_t ox = 0; ox < ow_; ++ox) {
          const float* window = x + ((n * g.in_h + oy * kh) * g.in_w + ox * kw) * c;
          const int64_t o = ((n * oh_ + oy) * ow_ + ox) * c;
          float* __restrict yo = y + o;
          uint32_t* __restrict io = idx + o;
          for (int64_t k = 0; k < c; ++k) {
            wy[k] = row_of_[io[k]];
            wx[k] = col_of_[io[k]];
          }
          for (int64_t ry = 0; ry + 1 < kh; ++ry)
            for (int64_t rx = 1; rx < kw; ++rx) {  // candidates in row order; the first tie wins
              const float* __restrict xp = window + ry * row + rx * c;
              const auto at = static_cast<uint32_t>(rx * kh + ry);
              const auto ry32 = static_cast<int32_t>(ry), rx32 = static_cast<int32_t>(rx);
              for (int64_t k = 0; k < c; ++k) {
                const uint32_t take = all_ones_if((ry32 < wy[k]) & (rx32 > wx[k]) & (xp[k] == yo[k]));
                io[k] = select(take, at, io[k]);
                yo[k] = select(take, xp[k], yo[k]);
                wy[k] = static_cast<int32_t>(static_cast<uint32_t>(wy[k]) | take);  // settled: -1
              }
            }
        }
  }

  void portable_forward(const float* x, float* y, int32_t* arg) const {
    const Pool2dGeometry& g = g_;
    const int64_t c = g.channels;
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t oy = 0; oy < oh_; ++oy)
        for (int64_t ox = 0; ox < ow_; ++ox) {
          const int64_t o = ((n * oh_ + oy) * ow_ + ox) * c;
          float* yo = y + o;
          int32_t* ao = arg + o;
          bool first = true;
          for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
            const int64_t iy = oy * g.stride_h - g.pad_h + ky;
            if (iy < 0 || iy >= g.in_h) continue;
            for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
              const int64_t ix = ox * g.stride_w - g.pad_w + kx;
              if (ix < 0 || ix >= g.in_w) continue;
              const float* xi = x + ((n * g.in_h + iy) * g.in_w + ix) * c;
              const auto at = static_cast<int32_t>(iy * g.in_w + ix);
              if (first) {
                std::memcpy(yo, xi, static_cast<size_t>(c) * sizeof(float));
                std::fill_n(ao, c, at);
                first = false;
                continue;
              }
              float* __restrict yk = yo;
              int32_t* __restrict ak = ao;
              for (int64_t k = 0; k < c; ++k) {
                const uint32_t take = all_ones_if(xi[k] > yk[k]);
                yk[k] = select(take, xi[k], yk[k]);
                ak[k] = static_cast<int32_t>(select(take, static_cast<uint32_t>(at), static_cast<uint32_t>(ak[k])));
              }
            }
          }
          if (first) {  // the window lies entirely in the padding
            std::fill_n(yo, c, -std::numeric_limits<float>::infinity());
            std::fill_n(ao, c, -1);
          }
        }
  }

  void portable_backward(const float* dy, const int32_t* arg, float* dx) const {
    const Pool2dGeometry& g = g_;
    const int64_t c = g.channels, plane = g.in_h * g.in_w;
    std::fill_n(dx, g.batch * plane * c, 0.0f);
    for (int64_t n = 0; n < g.batch; ++n) {
      float* dxn = dx + n * plane * c;
      for (int64_t p = 0; p < oh_ * ow_; ++p) {
        const int64_t o = (n * oh_ * ow_ + p) * c;
        for (int64_t k = 0; k < c; ++k)
          if (arg[o + k] >= 0) dxn[arg[o + k] * c + k] += dy[o + k];
      }
    }
  }

  std::shared_ptr<const Context> ctx_;
  Pool2dGeometry g_;
  int64_t oh_, ow_;
  std::string where_;
  bool use_xnnpack_ = false;
  bool two_by_two() const { return use_xnnpack_ && g_.kernel_h == 2 && g_.kernel_w == 2; }
  Operator argmax_;
  std::vector<int32_t> row_of_, col_of_;      // XNNPACK window index -> (ky, kx)
  std::vector<int32_t> winner_y_, winner_x_;  // per channel: XNNPACK's winner in its window
  std::vector<uint32_t> index_;               // the indices XNNPACK writes and reads (see constructor)
};

class XnnBackend final : public Backend {
 public:
  explicit XnnBackend(const BackendOptions& options) {
    initialize();
    auto ctx = std::make_shared<Context>();
    if (options.threads != 1) {
      // threads <= 0: one per core, as pthreadpool decides.
      const size_t threads = options.threads > 1 ? static_cast<size_t>(options.threads) : 0;
      ctx->pool.reset(pthreadpool_create(threads));
      if (!ctx->pool) fail("xnnpack", cat("pthreadpool_create(", threads, ") failed"));
    }
    ctx_ = std::move(ctx);
  }

  std::string_view name() const override { return "xnnpack"; }
  // XNNPACK 2022 has no batched GEMM, so no grouped linear kernel: heads run in the cloud.
  Support supports(std::string_view op, std::span<const Shape>) const override {
    if (op == "heads")
      return Support::no("xnnpack has no grouped linear kernel for heads, which run in the cloud: "
                         "use onednn or reference for a shard that holds them");
    return Support::yes();
  }
  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dGeometry& g) override { return make_conv2d(ctx_, g); }
  std::unique_ptr<LinearKernel> linear(const LinearGeometry& g) override { return make_linear(ctx_, g); }
  std::unique_ptr<ReluKernel> relu(int64_t elements) override {
    return std::make_unique<XnnRelu>(ctx_, elements);
  }
  std::unique_ptr<MaxPool2dKernel> max_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<XnnMaxPool2d>(ctx_, g);
  }
  std::unique_ptr<AvgPool2dKernel> avg_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<XnnAvgPool2d>(ctx_, g);
  }
  std::unique_ptr<ActivationKernel> activation(const Activation& kind, int64_t elements) override {
    if (auto k = simd::make_activation(kind, elements)) return k;  // GELU: XNNPACK 2022 has none
    return std::make_unique<XnnActivation>(ctx_, kind, elements);
  }
  std::unique_ptr<GlobalAvgPoolKernel> global_avg_pool(const GlobalPoolGeometry& g) override {
    return std::make_unique<XnnGlobalAvgPool>(ctx_, g);
  }
  std::unique_ptr<SoftmaxKernel> softmax(int64_t rows, int64_t channels) override {
    return std::make_unique<XnnSoftmax>(ctx_, rows, channels);
  }
  std::unique_ptr<AddKernel> add(int64_t elements) override { return std::make_unique<XnnAdd>(ctx_, elements); }
  std::unique_ptr<BatchNormKernel> batch_norm(const BatchNormGeometry& g) override { return make_reference_batch_norm(g); }
  std::unique_ptr<TokenPoolKernel> token_pool(const TokenPoolGeometry& g) override { return make_reference_token_pool(g); }
  std::unique_ptr<MulKernel> mul(const MulGeometry& g) override { return make_reference_mul(g); }
  std::unique_ptr<DropoutKernel> dropout(int64_t elements) override { return make_reference_dropout(elements); }
  // XNNPACK 2022 has no layer normalisation operator: the simd kernel (the portable backend's).
  std::unique_ptr<LayerNormKernel> layer_norm(const LayerNormGeometry& g) override { return simd::make_layer_norm(g); }
  std::unique_ptr<AttentionKernel> attention(const AttentionGeometry& g) override { return simd::make_attention(g); }

 private:
  std::shared_ptr<const Context> ctx_;
};

}  // namespace
}  // namespace xnn

std::unique_ptr<Backend> make_xnnpack_backend(const BackendOptions& options) {
  return std::make_unique<xnn::XnnBackend>(options);
}


}  // namespace tandem
