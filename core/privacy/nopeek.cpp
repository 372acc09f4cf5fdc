#include "core/privacy/nopeek.h"

#include <cmath>

namespace tandem {
namespace {

// Pairwise Euclidean distances of n rows of d values into d_out (n x n), then their double
// centering into c_out: c_ij = d_ij - row mean_i - column mean_j + grand mean.
void centred_distances(const float* v, int64_t d, int64_t n, double* dist, double* centred) {
  for (int64_t i = 0; i < n; ++i) {
    dist[i * n + i] = 0.0;
    for (int64_t j = i + 1; j < n; ++j) {
      double s = 0.0;
      const float* a = v + i * d;
      const float* b = v + j * d;
      for (int64_t k = 0; k < d; ++k) {
        const double t = static_cast<double>(a[k]) - static_cast<double>(b[k]);
        s += t * t;
      }
      dist[i * n + j] = dist[j * n + i] = std::sqrt(s);
    }
  }
  std::vector<double> row(static_cast<std::size_t>(n), 0.0);
  double grand = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) row[i] += dist[i * n + j];
    grand += row[i];
    row[i] /= static_cast<double>(n);
  }
  grand /= static_cast<double>(n * n);
  // The distance matrix is symmetric: column means equal row means.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) centred[i * n + j] = dist[i * n + j] - row[i] - row[j] + grand;
}

}  // namespace

double distance_correlation(const float* x, int64_t dx, const float* z, int64_t dz, int64_t n, float* grad_z,
                            float scale, std::vector<double>& work) {
  if (n < 2) return 0.0;
  const auto nn = static_cast<std::size_t>(n * n);
  work.resize(4 * nn);
  double* ax = work.data();       // x's distances, then unused
  double* cx = ax + nn;           // x's centred distances
  double* bz = cx + nn;           // z's distances
  double* cz = bz + nn;           // z's centred distances
  centred_distances(x, dx, n, ax, cx);
  centred_distances(z, dz, n, bz, cz);
  // The centring is a projection, so sum(C_x C_z) = sum(C_x B_z): the products below are the
  // squared distance covariance and variances, times n^2.
  double cov = 0.0, var_x = 0.0, var_z = 0.0;
  for (std::size_t k = 0; k < nn; ++k) {
    cov += cx[k] * cz[k];
    var_x += cx[k] * cx[k];
    var_z += cz[k] * cz[k];
  }
  const double denom = std::sqrt(var_x * var_z);
  if (!(denom > 0.0) || !(cov > 0.0)) return 0.0;  // no spread, or (numerically) independent
  const double r = cov / denom;                     // DCor^2
  const double dcor = std::sqrt(std::min(r, 1.0));
  if (grad_z == nullptr) return dcor;
  // L = sqrt(R), R = cov / sqrt(var_x var_z): dL/dB_ij = (C_x,ij / denom - R C_z,ij / var_z) / (2 L),
  // then B_ij = |z_i - z_j| gives dL/dz_i = 2 sum_j dL/dB_ij (z_i - z_j) / B_ij.
  const double k_cov = 1.0 / (denom * 2.0 * dcor), k_var = r / (var_z * 2.0 * dcor);
  for (int64_t i = 0; i < n; ++i) {
    float* gi = grad_z + i * dz;
    const float* zi = z + i * dz;
    for (int64_t j = 0; j < n; ++j) {
      const double b = bz[i * n + j];
      if (j == i || !(b > 0.0)) continue;
      const double g = 2.0 * (cx[i * n + j] * k_cov - cz[i * n + j] * k_var) / b * static_cast<double>(scale);
      const float* zj = z + j * dz;
      for (int64_t k = 0; k < dz; ++k) gi[k] += static_cast<float>(g * (static_cast<double>(zi[k]) - zj[k]));
    }
  }
  return dcor;
}

}  // namespace tandem
