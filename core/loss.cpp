#include "core/loss.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float grad_scale, Tensor* dlogits,
                             int64_t groups) {
  if (logits.shape().rank() != 2) fail("loss", cat("logits must be [N, C], got ", logits.shape().str()));
  if (groups < 1 || logits.shape()[1] % groups != 0)
    fail("loss", cat("logits ", logits.shape().str(), " do not split into ", groups, " heads"));
  const int64_t rows = logits.shape()[0] * groups, classes = logits.shape()[1] / groups;
  if (dlogits && dlogits->shape() != logits.shape())
    fail("loss", cat("gradient shape ", dlogits->shape().str(), " differs from logits ", logits.shape().str()));
  grad_scale /= static_cast<float>(groups);
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {  // one row per (sample, head)
    const int32_t label = labels[r / groups];
    if (label < 0 || label >= classes)
      fail("loss", cat("label ", label, " at row ", r / groups, " is outside [0, ", classes, ")"));
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
  return total / static_cast<double>(groups);
}

int64_t count_correct(const Tensor& logits, const int32_t* labels, int64_t groups) {
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1] / groups;
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits.data() + r * groups * classes;
    auto summed = [&](int64_t c) {  // the heads' sum for class c (the mean's argmax is the sum's)
      double s = 0.0;
      for (int64_t g = 0; g < groups; ++g) s += z[g * classes + c];
      return s;
    };
    int64_t best = 0;
    double best_sum = summed(0);
    for (int64_t c = 1; c < classes; ++c) {
      const double s = summed(c);
      if (s > best_sum) best = c, best_sum = s;
    }
    correct += best == labels[r];
  }
  return correct;
}

}  // namespace tandem
