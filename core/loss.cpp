#include "core/loss.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float grad_scale, Tensor* dlogits) {
  if (logits.shape().rank() != 2) fail("loss", cat("logits must be [N, C], got ", logits.shape().str()));
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  if (dlogits && dlogits->shape() != logits.shape())
    fail("loss", cat("gradient shape ", dlogits->shape().str(), " differs from logits ", logits.shape().str()));
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t label = labels[r];
    if (label < 0 || label >= classes)
      fail("loss", cat("label ", label, " at row ", r, " is outside [0, ", classes, ")"));
    const float* z = logits.data() + r * classes;
    float peak = z[0];
    for (int64_t c = 1; c < classes; ++c) peak = std::max(peak, z[c]);
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - peak));
    const double log_sum = std::log(sum);
    total += log_sum - static_cast<double>(z[label] - peak);
    if (dlogits) {
      float* g = dlogits->data() + r * classes;
      for (int64_t c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - peak) - log_sum);
        g[c] = static_cast<float>(p - (c == label ? 1.0 : 0.0)) * grad_scale;
      }
    }
  }
  return total;
}

int64_t count_correct(const Tensor& logits, const int32_t* labels) {
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits.data() + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (z[c] > z[best]) best = c;
    correct += best == labels[r];
  }
  return correct;
}

}  // namespace tandem
