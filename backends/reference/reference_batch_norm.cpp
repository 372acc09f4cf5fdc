// The reference batch normalisation (BatchNormKernel): per-channel sums in double, each over
// the rows in order, read row by row (NHWC keeps a pixel's channels together, so the loops run
// along memory; channel by channel they would stride the whole tensor). The CPU backends use it
// too (none has a faster one of its own): it reads the tensor three times forward, twice backward.
#include <cmath>
#include <vector>

#include "backends/reference/reference_backend.h"

namespace tandem {
namespace {

class ReferenceBatchNorm final : public BatchNormKernel {
 public:
  explicit ReferenceBatchNorm(const BatchNormGeometry& g)
      : g_(g), first_(static_cast<std::size_t>(g.channels)), second_(static_cast<std::size_t>(g.channels)) {}

  void forward(const float* x, const float* gamma, const float* beta, bool training, float* mean, float* inv_std,
               float* var, float* y) override {
    const int64_t rows = g_.rows, c = g_.channels;
    if (training) {
      double* sum = first_.data();
      double* squares = second_.data();
      for (int64_t k = 0; k < c; ++k) sum[k] = squares[k] = 0.0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < c; ++k) sum[k] += x[r * c + k];
      for (int64_t k = 0; k < c; ++k) sum[k] /= static_cast<double>(rows);  // now the mean
      // The centred second pass: a sum of squares less the squared mean would cancel.
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < c; ++k) squares[k] += (x[r * c + k] - sum[k]) * (x[r * c + k] - sum[k]);
      for (int64_t k = 0; k < c; ++k) {
        const double v = squares[k] / static_cast<double>(rows);
        mean[k] = static_cast<float>(sum[k]);
        var[k] = static_cast<float>(v);
        inv_std[k] = static_cast<float>(1.0 / std::sqrt(v + g_.eps));
      }
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < c; ++k) y[r * c + k] = (x[r * c + k] - mean[k]) * inv_std[k] * gamma[k] + beta[k];
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* inv_std,
                bool training, float* dx, float* dgamma, float* dbeta) override {
    const int64_t rows = g_.rows, c = g_.channels;
    double* sum_dy = first_.data();
    double* sum_dy_xhat = second_.data();
    for (int64_t k = 0; k < c; ++k) sum_dy[k] = sum_dy_xhat[k] = 0.0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < c; ++k) {
        const double xhat = (x[r * c + k] - mean[k]) * inv_std[k];
        sum_dy[k] += dy[r * c + k];
        sum_dy_xhat[k] += dy[r * c + k] * xhat;
      }
    for (int64_t k = 0; k < c; ++k) {
      dgamma[k] = static_cast<float>(sum_dy_xhat[k]);
      dbeta[k] = static_cast<float>(sum_dy[k]);
    }
    if (!dx) return;
    const double n = static_cast<double>(rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < c; ++k) {
        const double xhat = (x[r * c + k] - mean[k]) * inv_std[k];
        // Training: the statistics depend on x too; evaluation: a fixed affine map.
        const double v = training ? (n * dy[r * c + k] - sum_dy[k] - xhat * sum_dy_xhat[k]) / n : dy[r * c + k];
        dx[r * c + k] = static_cast<float>(gamma[k] * inv_std[k] * v);
      }
  }

 private:
  BatchNormGeometry g_;
  std::vector<double> first_, second_;  // per channel: the sums of a pass
};

}  // namespace

std::unique_ptr<BatchNormKernel> make_reference_batch_norm(const BatchNormGeometry& g) {
  return std::make_unique<ReferenceBatchNorm>(g);
}

}  // namespace tandem
