#include "core/loss.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

namespace {

// Checks shapes and labels; rows and classes per head.
std::pair<int64_t, int64_t> checked_rows(const Tensor& logits, const int32_t* labels, const Tensor* dlogits,
                                         int64_t groups) {
  if (logits.shape().rank() != 2) fail("loss", cat("logits must be [N, C], got ", logits.shape().str()));
  if (groups < 1 || logits.shape()[1] % groups != 0)
    fail("loss", cat("logits ", logits.shape().str(), " do not split into ", groups, " heads"));
  if (dlogits && dlogits->shape() != logits.shape())
    fail("loss", cat("gradient shape ", dlogits->shape().str(), " differs from logits ", logits.shape().str()));
  const int64_t classes = logits.shape()[1] / groups;
  for (int64_t n = 0; n < logits.shape()[0]; ++n)
    if (labels[n] < 0 || labels[n] >= classes)
      fail("loss", cat("label ", labels[n], " at row ", n, " is outside [0, ", classes, ")"));
  return {logits.shape()[0] * groups, classes};
}

}  // namespace

double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float grad_scale, Tensor* dlogits,
                             int64_t groups) {
  const auto [rows, classes] = checked_rows(logits, labels, dlogits, groups);
  grad_scale /= static_cast<float>(groups);
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {  // one row per (sample, head)
    const int32_t label = labels[r / groups];
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

double mse_onehot(const Tensor& outputs, const int32_t* labels, float grad_scale, Tensor* dlogits, int64_t groups) {
  const auto [rows, classes] = checked_rows(outputs, labels, dlogits, groups);
  const double inv_c = 1.0 / static_cast<double>(classes);
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t label = labels[r / groups];
    const float* y = outputs.data() + r * classes;
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) {
      const double d = static_cast<double>(y[c]) - (c == label ? 1.0 : 0.0);
      sum += d * d;
      if (dlogits)
        dlogits->data()[r * classes + c] =
            static_cast<float>(2.0 * d * inv_c * grad_scale / static_cast<double>(groups));
    }
    total += sum * inv_c;
  }
  return total / static_cast<double>(groups);
}

double compute_loss(const std::string& loss, const Tensor& outputs, const int32_t* labels, float grad_scale,
                    Tensor* doutputs, int64_t groups) {
  if (loss == "softmax_cross_entropy") return softmax_cross_entropy(outputs, labels, grad_scale, doutputs, groups);
  if (loss == "mse") return mse_onehot(outputs, labels, grad_scale, doutputs, groups);
  fail("loss", cat("unknown loss '", loss, "' (known: softmax_cross_entropy, mse)"));
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
