// The reference token pooling (TokenPoolKernel), which the CPU backends use too: a weighted sum
// of a sample's token vectors in token order, skipping the tokens of weight 0 (BERT's "first"
// reads one token of each sample), and the weights times dy back.
#include "backends/reference/reference_backend.h"

namespace tandem {
namespace {

class ReferenceTokenPool final : public TokenPoolKernel {
 public:
  explicit ReferenceTokenPool(const TokenPoolGeometry& g) : g_(g) {}

  void forward(const float* x, const float* w, float* y) override {
    const int64_t T = g_.tokens, F = g_.features;
    for (int64_t b = 0; b < g_.batch; ++b) {
      float* out = y + b * F;
      for (int64_t f = 0; f < F; ++f) out[f] = 0.0f;
      for (int64_t t = 0; t < T; ++t) {
        const float wt = w[b * T + t];
        if (wt == 0.0f) continue;
        const float* in = x + (b * T + t) * F;
        for (int64_t f = 0; f < F; ++f) out[f] += wt * in[f];
      }
    }
  }

  void backward(const float* dy, const float* w, float* dx) override {
    const int64_t T = g_.tokens, F = g_.features;
    for (int64_t b = 0; b < g_.batch; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const float wt = w[b * T + t];
        float* out = dx + (b * T + t) * F;
        for (int64_t f = 0; f < F; ++f) out[f] = wt * dy[b * F + f];
      }
  }

 private:
  TokenPoolGeometry g_;
};

}  // namespace

std::unique_ptr<TokenPoolKernel> make_reference_token_pool(const TokenPoolGeometry& g) {
  return std::make_unique<ReferenceTokenPool>(g);
}

}  // namespace tandem
