// Unit tests of the engine's small pieces: tensor storage and views, the seeded generator,
// PyTorch-style initialisation bounds, SGD's update rule, the backend registry's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/graph.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "test_support.h"

namespace tandem::test {
namespace {

TEST(Tensor, AlignedStorageAndSharedViews) {
  Tensor t = Tensor::zeros({4, 3, 2, 1});
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % kTensorAlignment, 0u);
  Tensor rows = t.slice_batch(1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 3, 2, 1}));
  rows[0] = 5.0f;
  EXPECT_EQ(t[6], 5.0f);  // a view writes through to the shared storage
  Tensor flat = t.reshape({4, 6});
  EXPECT_EQ(flat[6], 5.0f);
  Tensor copy = t.clone();
  copy[6] = 1.0f;
  EXPECT_EQ(t[6], 5.0f);
}

TEST(Tensor, BadViewsAreRefused) {
  Tensor t = Tensor::zeros({4, 3});
  EXPECT_THROW(t.slice_batch(3, 2), Error);
  EXPECT_THROW(t.reshape({5, 3}), Error);
}

TEST(Rng, FixedSequence) {
  // mt19937_64's 10000th output is fixed by the C++ standard: the generator is portable.
  Rng rng(5489u);
  uint64_t x = 0;
  for (int i = 0; i < 10000; ++i) x = rng.next();
  EXPECT_EQ(x, 9981545732273789042ull);
}

TEST(Init, PyTorchDefaultBounds) {
  auto backend = make_test_backend("reference");
  NodeSpec conv;
  conv.name = "c";
  conv.op = "conv2d";
  conv.conv2d.out_channels = 64;
  conv.conv2d.kernel = {3, 3};
  Network net(Graph::build(one_node_spec({8, 8, 32}, conv)), *backend, 3);
  const float bound = 1.0f / std::sqrt(32.0f * 9.0f);  // kaiming_uniform(a=sqrt(5)) and bias rule
  for (Param* p : net.params()) {
    double sum_sq = 0.0;
    float peak = 0.0f;
    for (int64_t i = 0; i < p->value().numel(); ++i) {
      peak = std::max(peak, std::fabs(p->value()[i]));
      sum_sq += static_cast<double>(p->value()[i]) * p->value()[i];
    }
    EXPECT_LE(peak, bound) << p->name();
    EXPECT_GT(peak, 0.9f * bound) << p->name();
    if (p->value().numel() > 1000) {  // U(-b, b) has standard deviation b / sqrt(3)
      EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(p->value().numel())), bound / std::sqrt(3.0), 0.02 * bound);
    }
  }
}

TEST(Sgd, MatchesPyTorchRule) {
  Param p("w", Shape{1});
  p.value()[0] = 1.0f;
  Sgd sgd({&p}, {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.01f, .nesterov = false});
  float w = 1.0f, buf = 0.0f;
  for (int step = 0; step < 3; ++step) {
    p.zero_grad();
    p.grad()[0] = 0.5f;
    const uint64_t version = p.version();
    sgd.step();
    EXPECT_GT(p.version(), version);
    const float d = 0.5f + 0.01f * w;
    buf = step == 0 ? d : 0.9f * buf + d;
    w -= 0.1f * buf;
    EXPECT_FLOAT_EQ(p.value()[0], w) << "step " << step;
  }
}

TEST(Backends, UnknownNameListsTheKnownOnes) {
  try {
    make_test_backend("tpu");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[backend] unknown backend 'tpu'; this build has: ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace tandem::test
