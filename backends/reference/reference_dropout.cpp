// The reference dropout (DropoutKernel), which the CPU backends use too: the mask drawn by
// dropout_mask (core/layers/dropout_mask.h) into the caller's stash, then one masked scale.
#include "backends/reference/reference_backend.h"
#include "core/layers/dropout_mask.h"

namespace tandem {
namespace {

class ReferenceDropout final : public DropoutKernel {
 public:
  explicit ReferenceDropout(int64_t elements) : n_(elements) {}

  void forward(uint64_t seed, uint64_t call, float p, const float* x, float* y, uint8_t* keep) override {
    dropout_mask(seed, call, p, n_, keep);
    const float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n_; ++i) y[i] = keep[i] ? x[i] * scale : 0.0f;
  }

  void backward(const uint8_t* keep, float scale, const float* dy, float* dx) override {
    for (int64_t i = 0; i < n_; ++i) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
  }

 private:
  int64_t n_;
};

}  // namespace

std::unique_ptr<DropoutKernel> make_reference_dropout(int64_t elements) {
  return std::make_unique<ReferenceDropout>(elements);
}

}  // namespace tandem
