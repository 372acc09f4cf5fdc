// Rényi-DP accounting for the sampled Gaussian mechanism (Mironov, Talwar and Zhang 2019):
// the RDP of one step at integer orders, summed over steps, converted to (epsilon, delta).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

// RDP at integer order `alpha` >= 2 of one step that samples each record with probability q
// (0 < q <= 1) and adds Gaussian noise of `sigma` times the sensitivity: log(A_alpha)/(alpha-1)
// with A_alpha = sum_k C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2-k)/(2 sigma^2)), in log space.
double rdp_sampled_gaussian(double q, double sigma, int alpha);

struct PrivacySpent {
  double epsilon = 0.0;
  int order = 0;  // the RDP order that gave it
};

// The orders tried: 2..256 (integers only: fractional orders would tighten epsilon slightly;
// integers keep it an upper bound).
const std::vector<int>& rdp_orders();

// Epsilon at `delta` after `steps` steps, by the conversion of Balle et al. 2020 (as Opacus):
// min over orders of rdp - (log(delta) + log(alpha)) / (alpha - 1) + log((alpha - 1) / alpha).
PrivacySpent dp_epsilon(double q, double sigma, uint64_t steps, double delta);
// The classic conversion (Mironov 2017): min of rdp + log(1/delta) / (alpha - 1); looser.
PrivacySpent dp_epsilon_classic(double q, double sigma, uint64_t steps, double delta);

}  // namespace tandem
