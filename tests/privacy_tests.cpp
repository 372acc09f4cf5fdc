// Privacy's building blocks: the RDP accountant against values published with TF Privacy's
// tests (and the Gaussian mechanism's closed form), the noise on the cut (clipping, the
// noise's spread, its backward by finite differences), and NoPeek's distance correlation
// (against values computed with numpy from the definition, and its gradient).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/privacy/cut_noise.h"
#include "core/privacy/nopeek.h"
#include "core/privacy/rdp_accountant.h"
#include "core/random.h"

namespace tandem::test {
namespace {

TEST(RdpAccountant, MatchesPublishedValues) {
  // TF Privacy's rdp_accountant_test: compute_rdp(q=0.1, noise 2, 10 steps, order 5).
  EXPECT_NEAR(rdp_sampled_gaussian(0.1, 2.0, 5) * 10, 0.07737, 1e-5);
  // ... and get_privacy_spent over orders 2..32 for q=0.01, noise 4, 10000 steps, delta 1e-5.
  const PrivacySpent classic = dp_epsilon_classic(0.01, 4.0, 10000, 1e-5);
  EXPECT_NEAR(classic.epsilon, 1.258575, 1e-5);
  EXPECT_EQ(classic.order, 20);
  // The conversion reported (Balle et al. 2020, Opacus') is tighter than the classic one.
  const PrivacySpent spent = dp_epsilon(0.01, 4.0, 10000, 1e-5);
  EXPECT_NEAR(spent.epsilon, 1.035490, 1e-5);
  EXPECT_LT(spent.epsilon, classic.epsilon);
}

TEST(RdpAccountant, GaussianMechanismAndMonotonicity) {
  for (const int a : {2, 7, 32}) EXPECT_NEAR(rdp_sampled_gaussian(1.0, 1.5, a), a / (2 * 1.5 * 1.5), 1e-12);
  // Subsampling only helps; more steps, less noise and more sampling cost more.
  EXPECT_LT(rdp_sampled_gaussian(0.01, 1.0, 8), rdp_sampled_gaussian(1.0, 1.0, 8));
  const double base = dp_epsilon(64.0 / 60000, 1.0, 2814, 1e-5).epsilon;
  EXPECT_GT(dp_epsilon(64.0 / 60000, 1.0, 5628, 1e-5).epsilon, base);
  EXPECT_GT(dp_epsilon(64.0 / 60000, 0.8, 2814, 1e-5).epsilon, base);
  EXPECT_GT(dp_epsilon(128.0 / 60000, 1.0, 2814, 1e-5).epsilon, base);
  EXPECT_GT(dp_epsilon(64.0 / 60000, 1.0, 2814, 1e-6).epsilon, base);
  try {
    dp_epsilon(0.0, 1.0, 1, 1e-5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[privacy] the sampling rate must be in (0, 1], got 0");
  }
  EXPECT_THROW(dp_epsilon(0.1, 0.0, 1, 1e-5), Error);
  EXPECT_THROW(dp_epsilon(0.1, 1.0, 1, 0.0), Error);
}

Tensor random_activations(int64_t n, int64_t d, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(Shape{n, d});
  Rng rng(seed);
  for (int64_t i = 0; i < n * d; ++i) t.data()[i] = rng.uniform(-scale, scale);
  return t;
}

double row_norm(const Tensor& t, int64_t i) {
  const int64_t d = t.shape().item_numel();
  double sq = 0;
  for (int64_t j = 0; j < d; ++j) sq += static_cast<double>(t.data()[i * d + j]) * t.data()[i * d + j];
  return std::sqrt(sq);
}

TEST(CutNoise, ClipsEachSampleToTheNorm) {
  CutNoise noise(1.0f, 0.0f, 7);
  Tensor a = random_activations(16, 50, 3, 0.4f), out;
  for (int64_t j = 0; j < 50; ++j) a.data()[j] *= 0.01f;  // sample 0 stays under the clip
  std::vector<float> scales;
  noise.forward(a, out, scales);
  ASSERT_LT(row_norm(a, 0), 1.0);
  EXPECT_EQ(scales[0], 1.0f);
  for (int64_t j = 0; j < 50; ++j) EXPECT_EQ(out.data()[j], a.data()[j]) << "an unclipped sample is unchanged";
  int clipped = 0;
  for (int64_t i = 0; i < 16; ++i) {
    EXPECT_LE(row_norm(out, i), 1.0 + 1e-5) << "sample " << i;
    if (row_norm(a, i) > 1.0) {
      ++clipped;
      EXPECT_NEAR(row_norm(out, i), 1.0, 1e-5);
      EXPECT_NEAR(scales[static_cast<std::size_t>(i)], 1.0 / row_norm(a, i), 1e-6);
    }
  }
  EXPECT_GT(clipped, 10);
}

TEST(CutNoise, NoiseHasTheStatedSpreadAndTheOsSeedDiffers) {
  CutNoise noise(2.0f, 1.5f, 11);
  const Tensor zeros = Tensor::zeros(Shape{4, 50000});
  Tensor out;
  std::vector<float> scales;
  noise.forward(zeros, out, scales);
  double sum = 0, sq = 0;
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) sum += out.data()[i], sq += static_cast<double>(out.data()[i]) * out.data()[i];
  const double mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(stddev, 3.0, 0.03) << "sigma * clip";
  Tensor again, os1, os2;
  CutNoise(2.0f, 1.5f, 11).forward(zeros, again, scales);
  EXPECT_EQ(again.data()[12345], out.data()[12345]) << "a fixed seed repeats";
  CutNoise(2.0f, 1.5f).forward(zeros, os1, scales);
  CutNoise(2.0f, 1.5f).forward(zeros, os2, scales);
  EXPECT_NE(os1.data()[0], os2.data()[0]) << "the OS's entropy seeds each run differently";
}

// d/da of sum(g * clip(a)) by central differences, against backward (no noise: it is additive).
TEST(CutNoise, BackwardMatchesFiniteDifferences) {
  CutNoise noise(1.0f, 0.0f, 5);
  const int64_t n = 6, d = 9;
  Tensor a = random_activations(n, d, 21, 0.6f);
  for (int64_t j = 0; j < d; ++j) a.data()[j] *= 0.1f;  // one sample under the clip
  const Tensor g = random_activations(n, d, 22, 1.0f);
  Tensor out, grad;
  std::vector<float> scales;
  noise.forward(a, out, scales);
  noise.backward(g, a, scales, grad);
  auto loss = [&](const Tensor& x) {
    Tensor o;
    std::vector<float> s;
    CutNoise(1.0f, 0.0f, 5).forward(x, o, s);
    double l = 0;
    for (int64_t i = 0; i < n * d; ++i) l += static_cast<double>(g.data()[i]) * o.data()[i];
    return l;
  };
  const float h = 1e-3f;
  for (int64_t i = 0; i < n * d; ++i) {
    Tensor plus = a.clone(), minus = a.clone();
    plus.data()[i] += h;
    minus.data()[i] -= h;
    const double numeric = (loss(plus) - loss(minus)) / (2 * h);
    EXPECT_NEAR(grad.data()[i], numeric, 2e-3) << "element " << i;
  }
}

// Values from numpy on the definition (Szekely et al. 2007): double-centred distance
// matrices A, B; DCor = sqrt(mean(AB) / sqrt(mean(AA) mean(BB))).
TEST(NoPeek, DistanceCorrelationMatchesTheDefinition) {
  std::vector<double> work;
  const float x1[] = {1, 2, 3, 4}, z1[] = {1, 4, 9, 16};
  EXPECT_NEAR(distance_correlation(x1, 1, z1, 1, 4, nullptr, 1.0f, work), 0.9880575600825113, 1e-6);
  const float x2[] = {1, 0, 0, 1, 2, 2, 3, -1, 0, 0}, z2[] = {1, 0.5f, 2, -1, 4};
  EXPECT_NEAR(distance_correlation(x2, 2, z2, 1, 5, nullptr, 1.0f, work), 0.7759322833304452, 1e-6);
  // A copy, scaled and shifted, is fully dependent; a constant carries nothing.
  Tensor x = random_activations(8, 5, 31, 1.0f), z = x.clone();
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = 3.0f * z.data()[i] + 1.0f;
  EXPECT_NEAR(distance_correlation(x.data(), 5, z.data(), 5, 8, nullptr, 1.0f, work), 1.0, 1e-6);
  std::vector<float> flat(8 * 3, 0.25f);
  EXPECT_EQ(distance_correlation(x.data(), 5, flat.data(), 3, 8, nullptr, 1.0f, work), 0.0);
}

TEST(NoPeek, GradientMatchesFiniteDifferences) {
  const int64_t n = 6, dx = 4, dz = 7;
  const Tensor x = random_activations(n, dx, 41, 1.0f);
  Tensor z = random_activations(n, dz, 42, 1.0f);
  for (int64_t k = 0; k < dx; ++k) z.data()[k] += 2.0f * x.data()[k];  // some dependence
  std::vector<double> work;
  std::vector<float> grad(static_cast<std::size_t>(n * dz), 0.5f);  // adds to what is there
  const double d = distance_correlation(x.data(), dx, z.data(), dz, n, grad.data(), 2.0f, work);
  EXPECT_GT(d, 0.3);
  EXPECT_LT(d, 1.0);
  const double h = 1e-3;
  for (int64_t i = 0; i < n * dz; ++i) {
    Tensor plus = z.clone(), minus = z.clone();
    plus.data()[i] += static_cast<float>(h);
    minus.data()[i] -= static_cast<float>(h);
    const double numeric = 2.0 * (distance_correlation(x.data(), dx, plus.data(), dz, n, nullptr, 1.0f, work) -
                                  distance_correlation(x.data(), dx, minus.data(), dz, n, nullptr, 1.0f, work)) /
                           (2 * h);
    EXPECT_NEAR(grad[static_cast<std::size_t>(i)] - 0.5f, numeric, 2e-3) << "element " << i;
  }
}

}  // namespace
}  // namespace tandem::test
