#include "core/geometry.h"

#include <atomic>

#include "core/error.h"

namespace tandem {

std::string Conv2dGeometry::str() const {
  return cat("conv2d N", batch, " ", in_h, "x", in_w, "x", in_c, " -> ", out_c, " k", kernel_h, "x",
             kernel_w, " s", stride_h, "x", stride_w, " p", pad_h, "x", pad_w, " d", dilation_h, "x",
             dilation_w, groups > 1 ? cat(" g", groups) : std::string());
}

uint64_t new_weights_id() {
  static std::atomic<uint64_t> next{0};
  return ++next;
}

std::string LinearGeometry::str() const {
  return cat("linear N", batch, " ", in_features, " -> ", out_features);
}

std::string GroupedLinearGeometry::str() const {
  return cat("grouped linear N", batch, " ", groups, " x (", in_features, " -> ", out_features, ")");
}

std::string BatchNormGeometry::str() const { return cat("batch norm [", rows, ", ", channels, "] eps ", eps); }

std::string TokenPoolGeometry::str() const { return cat("token pool [", batch, ", ", tokens, ", ", features, "]"); }

std::string MulGeometry::str() const { return cat("mul [", batch, ", ", outer, ", ", inner, "] by [", batch, ", ", inner, "]"); }

std::string LayerNormGeometry::str() const { return cat("layer norm [", rows, ", ", features, "] eps ", eps); }

std::string AttentionGeometry::str() const {
  return cat("attention N", batch, " T", tokens, " heads ", heads, "x", head_dim, causal ? " causal" : "");
}

std::string GlobalPoolGeometry::str() const {
  return cat("global average pool N", batch, " ", in_h, "x", in_w, "x", channels);
}

std::string Pool2dGeometry::str() const {
  return cat("pool2d N", batch, " ", in_h, "x", in_w, "x", channels, " k", kernel_h, "x", kernel_w,
             " s", stride_h, "x", stride_w, " p", pad_h, "x", pad_w);
}

}  // namespace tandem
