// Conv2d weight gradient as a direct, register-blocked accumulation over a zero-padded NHWC
// input: no im2col and no weight packing, for backends whose GEMMs need constant weights.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/geometry.h"
#include "core/tensor.h"

namespace tandem::simd {

class ConvWeightGrad {
 public:
  // The blocking keeps 16 output channels per vector lane group, so out_c must be a
  // multiple of 16; callers fall back to a GEMM otherwise.
  static bool supports(const Conv2dGeometry& g) { return g.out_c % 16 == 0; }

  explicit ConvWeightGrad(const Conv2dGeometry& g);

  // dw [Cout][kh][kw][Cin] = sum over batch and output positions of dy[.., co] times the
  // input patch; db[co] = sum of dy[.., co] when db is not null. x [N][H][W][Cin] and dy
  // [N][OH][OW][Cout] are NHWC.
  void run(const float* x, const float* dy, float* dw, float* db);

 private:
  Conv2dGeometry g_;
  int64_t hp_ = 0, wp_ = 0;           // padded input height and width
  int64_t k_ = 0, m_ = 0;             // kh*kw*Cin, N*OH*OW
  bool padded_ = false;
  std::vector<int64_t> pixel_;        // per output position: offset of its patch in the input
  std::vector<int64_t> tap_offset_;   // per k = (ky, kx, ci): offset inside a patch
  std::unique_ptr<float, AlignedFree> xpad_;  // zero-padded copy of x (when padded_)
  std::unique_ptr<float, AlignedFree> acc_;   // dW^T [K][Cout]
};

}  // namespace tandem::simd
