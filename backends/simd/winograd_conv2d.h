// Winograd F(2x2, 3x3) Conv2d for 3x3, stride 1, pad 1 layers over NHWC: 16 multiplies per
// 2x2 output tile and channel pair instead of 36, as small GEMMs on L2-sized chunks of tiles.
// Forward, the backward-data pass (the same convolution with the kernel flipped and its
// channels swapped) and the weight gradient (the forward's transforms adjoint: 16 products a
// tile where direct takes 36). Results differ from direct convolution by rounding only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/geometry.h"
#include "backends/simd/parallel_for.h"
#include "core/tensor.h"

namespace tandem::simd {

class WinogradConv2d {
 public:
  // 3x3, stride 1, dilation 1, pad 1, no groups, and both channel counts multiples of 16
  // (each pass's input and output channels go 16 to a vector).
  static bool supports(const Conv2dGeometry& g);

  explicit WinogradConv2d(const Conv2dGeometry& g);

  // Splits each pass's tile chunks into `workers` ranges, each with its own scratch, run by
  // parallel_for. Without it every chunk runs in order on the caller's thread.
  void set_parallel(int workers, ParallelFor parallel_for);

  // y [N][H][W][Cout] = bias + conv(x, w), w OHWI [Cout][3][3][Cin]; bias may be null. The
  // transformed weights are kept while (w, version) stays the same.
  void forward(const float* x, const float* w, uint64_t version, const float* bias, float* y);
  // dx [N][H][W][Cin] = the adjoint of forward applied to dy [N][H][W][Cout].
  void backward_data(const float* dy, const float* w, uint64_t version, float* dx);
  // dw [Cout][3][3][Cin] and db [Cout] (db may be null) from x and dy, overwritten. Each
  // worker range sums its chunks into a dU of its own (16 Cin Cout floats, kept), added up at
  // the end: dw's rounding depends on the worker count, not on timing.
  void weight_grad(const float* x, const float* dy, float* dw, float* db);

 private:
  struct Transformed {  // U[16][in][out] of one pass, and the weights it came from
    std::unique_ptr<float, AlignedFree> u;
    const float* of = nullptr;
    uint64_t version = 0;
  };
  // Fills t.u from w unless it already holds (w, version); adjoint: for backward_data.
  void transform(Transformed& t, const float* w, uint64_t version, bool adjoint);
  void run(const float* in, int64_t in_c, const float* u, int64_t out_c, const float* bias, float* out);

  struct Scratch {  // a chunk's transformed input and products; its range's weight gradient
    std::unique_ptr<float, AlignedFree> v, m, du;
  };
  void add_scratch();

  Conv2dGeometry g_;
  int64_t tiles_h_ = 0, tiles_w_ = 0, tiles_ = 0;
  Transformed fwd_, bwd_;
  std::vector<Scratch> scratch_;  // one per worker range
  ParallelFor parallel_for_;
};

}  // namespace tandem::simd
