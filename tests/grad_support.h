// Central finite differences against a backend's analytic gradients: what the gradient
// checks (grad_tests.cpp) and the generated op cases (op_cases_tests.cpp) share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/network.h"
#include "core/random.h"
#include "core/tensor.h"

namespace tandem::test {

inline constexpr float kEps = 1e-2f;

inline double weighted_sum(const Tensor& out, const Tensor& r) {
  double s = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) s += static_cast<double>(out[i]) * r[i];
  return s;
}

// Compares the analytic gradient `analytic` of `values` with central differences of f,
// on up to `samples` elements chosen at random.
template <typename F>
void check_gradient(Tensor values, const Tensor& analytic, F&& f, const std::string& what, Rng& rng,
                    int samples = 48) {
  const int64_t n = values.numel();
  float worst = 0.0f;
  for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
    const int64_t i = n <= samples ? s : static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
    const float saved = values[i];
    values[i] = saved + kEps;
    const double up = f();
    values[i] = saved - kEps;
    const double down = f();
    values[i] = saved;
    const double numeric = (up - down) / (2.0 * kEps);
    const double err = std::fabs(numeric - analytic[i]) / std::max(1.0, std::fabs(numeric));
    worst = std::max(worst, static_cast<float>(err));
    EXPECT_LT(err, 5e-3) << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << numeric;
  }
  ::testing::Test::RecordProperty(what + ".worst_rel_err", std::to_string(worst));
}

// Checks by central differences every gradient a backward of L = sum(net(inputs) * r) gave:
// `dx` (input 0's, when `input_grad`) and each trained parameter's, named `prefix` + its name.
// Versions are bumped so a backend that packs weights sees each perturbation.
inline void check_network_gradients(Network& net, const std::vector<Tensor>& inputs, const Tensor& r, const Tensor& dx,
                                    bool input_grad, const std::string& what, const std::string& prefix, Rng& rng) {
  auto loss = [&] { return weighted_sum(net.forward(inputs, 0), r); };
  if (input_grad) check_gradient(inputs[0], dx, loss, what + ".input", rng);
  for (Param* p : net.params()) {
    Tensor g = p->grad().clone();
    check_gradient(p->value(), g, [&] { p->bump_version(); return loss(); }, prefix + p->name(), rng);
    p->bump_version();  // its last element was restored after the last forward: repack it
  }
}

}  // namespace tandem::test
