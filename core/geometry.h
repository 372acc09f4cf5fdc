// Shapes of the kernels a backend creates: one struct per op, fixed at kernel creation,
// so a backend can plan (pick algorithms, allocate scratch) once per shape.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

// NHWC input [batch, in_h, in_w, in_c]; OHWI weights [out_c, kernel_h, kernel_w, in_c].
struct Conv2dGeometry {
  int64_t batch = 1, in_h = 1, in_w = 1, in_c = 1, out_c = 1;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;  // symmetric zero padding
  int64_t dilation_h = 1, dilation_w = 1;
  bool bias = true;
  // Channels split into groups convolved separately (in_c and out_c divisible by it; weights
  // OHWI with I = in_c / groups); groups == in_c == out_c is a depthwise convolution.
  int64_t groups = 1;

  int64_t out_h() const { return (in_h + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h + 1; }
  int64_t out_w() const { return (in_w + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1; }
  // Multiply-adds times two, for one forward pass (backward passes cost the same).
  double flops() const {
    return 2.0 * static_cast<double>(batch * out_h() * out_w() * out_c * kernel_h * kernel_w * (in_c / groups));
  }
  std::string str() const;
};

// Input [batch, in_features]; weights [out_features, in_features].
struct LinearGeometry {
  int64_t batch = 1, in_features = 1, out_features = 1;
  bool bias = true;
  // Nonzero: the weights' identity (new_weights_id()). Kernels made with the same id read the
  // same weights at other row counts (one layer's, for each micro-batch size and length
  // bucket), so a backend that packs weights packs once per version for all of them.
  uint64_t weights_id = 0;
  double flops() const { return 2.0 * static_cast<double>(batch * in_features * out_features); }
  std::string str() const;
};

// A process-wide unique LinearGeometry::weights_id.
uint64_t new_weights_id();

// NHWC max pooling; padded positions never win.
// G independent linear layers side by side (the second layer of N heads): x [batch, G*I]
// (group g reads columns g*I..), weights [G, O, I], y [batch, G*O].
struct GroupedLinearGeometry {
  int64_t batch = 1, groups = 1, in_features = 1, out_features = 1;
  bool bias = true;
  double flops() const { return 2.0 * static_cast<double>(batch * groups * in_features * out_features); }
  std::string str() const;
};

// Batch normalisation of `rows` vectors (every pixel of every sample in NHWC, or every sample
// after a linear) over each of `channels`, with a scale and a shift per channel.
struct BatchNormGeometry {
  int64_t rows = 1, channels = 1;
  float eps = 1e-5f;
  std::string str() const;
};

// Token pooling: `batch` sequences of `tokens` vectors of `features` values, one vector each.
struct TokenPoolGeometry {
  int64_t batch = 1, tokens = 1, features = 1;
  std::string str() const;
};

// An elementwise product with broadcasting (the mul op): a [batch, outer, inner] times b
// [batch, inner], b repeated over `outer` (1 where a and b have one shape).
struct MulGeometry {
  int64_t batch = 1, outer = 1, inner = 1;
  std::string str() const;
};

// Layer normalisation of `rows` vectors of `features` values each (every sample, and every
// token of a sequence), with a scale and a shift per feature.
struct LayerNormGeometry {
  int64_t rows = 1, features = 1;
  float eps = 1e-5f;
  std::string str() const;
};

// Multi-head attention on q, k, v [batch, tokens, heads * head_dim]: each token's heads side
// by side, as a linear's output holds them (torch's [batch, tokens, features] before its view
// to heads).
struct AttentionGeometry {
  int64_t batch = 1, tokens = 1, heads = 1, head_dim = 1;
  bool causal = false;
  int64_t features() const { return heads * head_dim; }
  std::string str() const;
};

// Mean over all positions of each channel: x [batch, in_h, in_w, channels] -> y [batch, channels].
struct GlobalPoolGeometry {
  int64_t batch = 1, in_h = 1, in_w = 1, channels = 1;
  std::string str() const;
};

struct Pool2dGeometry {
  int64_t batch = 1, in_h = 1, in_w = 1, channels = 1;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;

  int64_t out_h() const { return (in_h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w() const { return (in_w + 2 * pad_w - kernel_w) / stride_w + 1; }
  bool windows_tile() const {  // non-overlapping windows that cover the input without padding
    return stride_h == kernel_h && stride_w == kernel_w && pad_h == 0 && pad_w == 0 &&
           in_h % kernel_h == 0 && in_w % kernel_w == 0;
  }
  std::string str() const;
};

}  // namespace tandem
