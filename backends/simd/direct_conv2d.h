// Direct, register-blocked Conv2d passes over a zero-padded NHWC input, with no im2col and
// no weight packing: the weight gradient (any layer), and the forward pass of layers with
// few taps x input channels (first layers), where GEMM-shaped kernels waste their tiles.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/geometry.h"
#include "backends/simd/parallel_for.h"
#include "core/tensor.h"

namespace tandem::simd {

class DirectConv2d {
 public:
  // Output channels go 16 to a vector, so out_c must be a multiple of 16; callers use a
  // GEMM otherwise.
  static bool supports(const Conv2dGeometry& g) { return g.out_c % 16 == 0; }
  // Where forward() beats a GEMM: K = kh * kw * Cin small enough that the patch values of a
  // tile of positions are reused across all output channels from registers.
  static bool forward_pays(const Conv2dGeometry& g) {
    return supports(g) && g.kernel_h * g.kernel_w * g.in_c <= kMaxForwardK;
  }
  static constexpr int64_t kMaxForwardK = 32;

  explicit DirectConv2d(const Conv2dGeometry& g);

  // y [N][OH][OW][Cout] = bias + conv(x, w), w OHWI [Cout][kh][kw][Cin]; bias may be null.
  // w is transposed into [K][Cout] when (w, version) changes.
  void forward(const float* x, const float* w, uint64_t version, const float* bias, float* y);

  // dw [Cout][kh][kw][Cin] = sum over batch and output positions of dy[.., co] times the
  // input patch; db[co] = sum of dy[.., co] when db is not null.
  void weight_grad(const float* x, const float* dy, float* dw, float* db);

  // weight_grad's rows of dW^T (the K taps x input channels) split into `workers` ranges run
  // by parallel_for; each range writes its own rows. Without it, one range on the caller.
  void set_parallel(int workers, ParallelFor parallel_for) {
    workers_ = workers;
    parallel_for_ = std::move(parallel_for);
  }

 private:
  const float* padded(const float* x);

  Conv2dGeometry g_;
  int64_t hp_ = 0, wp_ = 0;           // padded input height and width
  int64_t k_ = 0, m_ = 0;             // kh*kw*Cin, N*OH*OW
  bool padded_ = false;
  std::vector<int64_t> pixel_;        // per output position: offset of its patch in the input
  std::vector<int64_t> tap_offset_;   // per k = (ky, kx, ci): offset inside a patch
  std::unique_ptr<float, AlignedFree> xpad_;  // zero-padded copy of x (when padded_)
  std::unique_ptr<float, AlignedFree> acc_;   // dW^T [K][Cout]
  std::unique_ptr<float, AlignedFree> wt_;    // W^T [K][Cout] for forward
  const float* wt_of_ = nullptr;              // the weights wt_ holds

  uint64_t wt_version_ = 0;
  int workers_ = 1;
  ParallelFor parallel_for_;
};

}  // namespace tandem::simd
