// The reference product with broadcasting (MulKernel), which the CPU backends use too: each
// sample's a [outer, inner] times its b [inner] row by row; b's gradient summed over the rows
// in row order.
#include "backends/reference/reference_backend.h"

namespace tandem {
namespace {

class ReferenceMul final : public MulKernel {
 public:
  explicit ReferenceMul(const MulGeometry& g) : g_(g) {}

  void forward(const float* a, const float* b, float* y) override {
    const int64_t O = g_.outer, I = g_.inner;
    for (int64_t n = 0; n < g_.batch; ++n)
      for (int64_t o = 0; o < O; ++o) {
        const int64_t row = (n * O + o) * I;
        for (int64_t i = 0; i < I; ++i) y[row + i] = a[row + i] * b[n * I + i];
      }
  }

  void backward(const float* dy, const float* a, const float* b, float* da, float* db) override {
    const int64_t O = g_.outer, I = g_.inner;
    for (int64_t n = 0; n < g_.batch; ++n) {
      if (db)
        for (int64_t i = 0; i < I; ++i) db[n * I + i] = 0.0f;
      for (int64_t o = 0; o < O; ++o) {
        const int64_t row = (n * O + o) * I;
        for (int64_t i = 0; i < I; ++i) {
          if (da) da[row + i] = dy[row + i] * b[n * I + i];
          if (db) db[n * I + i] += dy[row + i] * a[row + i];
        }
      }
    }
  }

 private:
  MulGeometry g_;
};

}  // namespace

std::unique_ptr<MulKernel> make_reference_mul(const MulGeometry& g) { return std::make_unique<ReferenceMul>(g); }

}  // namespace tandem
