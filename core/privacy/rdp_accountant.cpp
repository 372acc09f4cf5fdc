#include "core/privacy/rdp_accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tandem {
namespace {

void check(double q, double sigma, double delta) {
  if (!(q > 0.0 && q <= 1.0)) fail("privacy", cat("the sampling rate must be in (0, 1], got ", q));
  if (!(sigma > 0.0)) fail("privacy", cat("the noise multiplier must be > 0, got ", sigma));
  if (!(delta > 0.0 && delta < 1.0)) fail("privacy", cat("delta must be in (0, 1), got ", delta));
}

template <typename Convert>
PrivacySpent best(double q, double sigma, uint64_t steps, double delta, Convert convert) {
  check(q, sigma, delta);
  PrivacySpent out{std::numeric_limits<double>::infinity(), 0};
  for (const int alpha : rdp_orders()) {
    const double rdp = rdp_sampled_gaussian(q, sigma, alpha) * static_cast<double>(steps);
    const double eps = convert(rdp, static_cast<double>(alpha));
    if (eps < out.epsilon) out = {eps, alpha};
  }
  out.epsilon = std::max(0.0, out.epsilon);
  return out;
}

}  // namespace

double rdp_sampled_gaussian(double q, double sigma, int alpha) {
  if (alpha < 2) fail("privacy", cat("RDP orders start at 2, got ", alpha));
  if (q >= 1.0) return alpha / (2.0 * sigma * sigma);  // the Gaussian mechanism itself
  const double log_q = std::log(q), log_1mq = std::log1p(-q), two_var = 2.0 * sigma * sigma;
  std::vector<double> terms(static_cast<std::size_t>(alpha) + 1);
  double top = -std::numeric_limits<double>::infinity();
  for (int k = 0; k <= alpha; ++k) {
    const double log_binom = std::lgamma(alpha + 1.0) - std::lgamma(k + 1.0) - std::lgamma(alpha - k + 1.0);
    const double t = log_binom + (alpha - k) * log_1mq + k * log_q + (static_cast<double>(k) * k - k) / two_var;
    terms[static_cast<std::size_t>(k)] = t;
    top = std::max(top, t);
  }
  double sum = 0.0;
  for (const double t : terms) sum += std::exp(t - top);
  return (top + std::log(sum)) / (alpha - 1.0);
}

const std::vector<int>& rdp_orders() {
  static const std::vector<int> orders = [] {
    std::vector<int> o;
    for (int a = 2; a <= 64; ++a) o.push_back(a);
    for (int a = 72; a <= 256; a += 8) o.push_back(a);
    return o;
  }();
  return orders;
}

PrivacySpent dp_epsilon(double q, double sigma, uint64_t steps, double delta) {
  return best(q, sigma, steps, delta, [delta](double rdp, double a) {
    return rdp - (std::log(delta) + std::log(a)) / (a - 1.0) + std::log((a - 1.0) / a);
  });
}

PrivacySpent dp_epsilon_classic(double q, double sigma, uint64_t steps, double delta) {
  return best(q, sigma, steps, delta, [delta](double rdp, double a) { return rdp + std::log(1.0 / delta) / (a - 1.0); });
}

}  // namespace tandem
