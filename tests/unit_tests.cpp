// Unit tests of the engine's small pieces: tensor storage and views, the seeded generator,
// PyTorch-style initialisation bounds, SGD's update rule, the backend registry's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <vector>
#include <utility>

#include "core/error.h"
#include "core/graph.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "core/schedule.h"
#include "backends/simd/gemm.h"
#include "core/vector.h"
#include "core/wire/frame.h"
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

// The storage hook a GPU backend installs (set_tensor_memory): only tensors of at least
// min_bytes are offered, with aligned_floats' padded size; the storage is the tensor's and is
// released once its last view goes; a refusal (null) leaves the tensor to core's own memory and
// is never released; uninstalled, nothing is offered.
struct FakeMemory {
  static inline std::vector<std::pair<void*, std::size_t>> made;
  static inline std::vector<void*> released;
  static inline bool accept = true;
  static void* allocate(std::size_t bytes, std::size_t) {
    if (!accept) return nullptr;
    void* p = ::operator new[](bytes, std::align_val_t{kTensorAlignment});
    made.emplace_back(p, bytes);
    return p;
  }
  static void release(void* p) {
    released.push_back(p);
    ::operator delete[](p, std::align_val_t{kTensorAlignment});
  }
};
constexpr std::size_t kFakeMinBytes = 4096;
constexpr TensorMemory kFakeMemory{kFakeMinBytes, FakeMemory::allocate, FakeMemory::release};

// Uninstalls the hook however the test ends (an ASSERT returns early).
struct FakeMemoryInstalled {
  FakeMemoryInstalled() { set_tensor_memory(&kFakeMemory); }
  ~FakeMemoryInstalled() { set_tensor_memory(nullptr); }
};

TEST(Tensor, MemoryHookMakesLargeStorageAndReleasesItAfterTheLastView) {
  std::optional<FakeMemoryInstalled> hook(std::in_place);
  const int64_t large = static_cast<int64_t>(kFakeMinBytes / sizeof(float));
  {
    Tensor small = Tensor::zeros({large - 1});
    EXPECT_TRUE(FakeMemory::made.empty()) << "a tensor under the threshold was offered";
    Tensor big = Tensor::zeros({large});
    ASSERT_EQ(FakeMemory::made.size(), 1u);
    EXPECT_EQ(FakeMemory::made[0].first, big.data());
    EXPECT_EQ(FakeMemory::made[0].second, padded_tensor_bytes(static_cast<std::size_t>(large)));
    EXPECT_GE(FakeMemory::made[0].second, kFakeMinBytes + 16 * sizeof(float)) << "no spare line past the end";
    EXPECT_EQ(big[large - 1], 0.0f);
    Tensor view = big.reshape({2, large / 2});
    big = Tensor();
    EXPECT_TRUE(FakeMemory::released.empty()) << "released while a view still held the storage";
    view[0] = 1.0f;
    view = Tensor();
    ASSERT_EQ(FakeMemory::released.size(), 1u);
    EXPECT_EQ(FakeMemory::released[0], FakeMemory::made[0].first);
    FakeMemory::accept = false;
    Tensor refused = Tensor::empty({large});
    refused[large - 1] = 2.0f;
  }
  EXPECT_EQ(FakeMemory::made.size(), 1u);
  EXPECT_EQ(FakeMemory::released.size(), 1u) << "a refused tensor was released by the hook";
  hook.reset();
  FakeMemory::accept = true;
  Tensor later = Tensor::empty({large});
  EXPECT_EQ(FakeMemory::made.size(), 1u) << "offered after the hook was uninstalled";
}

// Large received frames (activations) take tensors' storage, through the memory hook, from a
// pool that reuses a released one for the next frame of its size class; small frames do not.
TEST(Frame, LargeFramesReuseTensorStorageFromTheMemoryHook) {
  FakeMemoryInstalled hook;
  const std::size_t before = FakeMemory::made.size();
  std::vector<uint8_t> bytes(100 << 10);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  const uint8_t* first = nullptr;
  {
    Frame f = Frame::copy_of(bytes.data(), bytes.size());
    ASSERT_EQ(FakeMemory::made.size(), before + 1) << "a large frame's storage did not come from the hook";
    first = f.data();
    EXPECT_EQ(static_cast<const void*>(first), FakeMemory::made.back().first);
    EXPECT_EQ(std::memcmp(f.data(), bytes.data(), bytes.size()), 0);
    EXPECT_EQ(f.size(), bytes.size());
  }
  {
    Frame g = Frame::copy_of(bytes.data() + 1, 70 << 10);  // the same 128 KiB class
    EXPECT_EQ(g.data(), first) << "the released buffer was not reused";
    EXPECT_EQ(FakeMemory::made.size(), before + 1);
    EXPECT_EQ(std::memcmp(g.data(), bytes.data() + 1, 70 << 10), 0);
    Frame h = Frame::copy_of(bytes.data(), 90 << 10);  // g still holds the cached one
    EXPECT_NE(h.data(), first);
    EXPECT_EQ(FakeMemory::made.size(), before + 2);
    Frame small = Frame::copy_of(bytes.data(), 1000);
    EXPECT_EQ(FakeMemory::made.size(), before + 2) << "a small frame went to the pool";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small.data()) % kTensorAlignment, 0u);
  }
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

// Adam and AdamW against torch.optim's formulas, evaluated in double precision here.
TEST(Adam, MatchesPyTorchRuleWithAndWithoutDecoupledDecay) {
  for (const char* kind : {"adam", "adamw"}) {
    SCOPED_TRACE(kind);
    Param p("w", Shape{2});
    p.value()[0] = 1.0f;
    p.value()[1] = -2.0f;
    OptimizerOptions o;
    o.kind = kind;
    o.lr = 0.01f;
    o.weight_decay = 0.1f;
    auto opt = make_optimizer({&p}, o);
    double w[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
    const double g_of_step[3][2] = {{0.5, -0.25}, {0.1, 0.3}, {-0.4, 0.05}};
    for (int t = 1; t <= 3; ++t) {
      p.zero_grad();
      for (int i = 0; i < 2; ++i) p.grad()[i] = static_cast<float>(g_of_step[t - 1][i]);
      opt->step();
      for (int i = 0; i < 2; ++i) {
        double g = g_of_step[t - 1][i];
        if (std::string(kind) == "adamw")
          w[i] *= 1.0 - 0.01 * 0.1;
        else
          g += 0.1 * w[i];
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        const double mhat = m[i] / (1 - std::pow(0.9, t)), vhat = v[i] / (1 - std::pow(0.999, t));
        w[i] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
        EXPECT_NEAR(p.value()[i], w[i], 1e-6) << "step " << t << " element " << i;
      }
    }
    EXPECT_EQ(opt->state().size(), 2u);  // both moments
  }
}

// The same rules over parameters long enough for the vectorised loops and their tails (8-lane
// norm, Adam's element loop): 37 and 19 elements.
TEST(Optimizer, LongParametersMatchTheRulesElementwise) {
  Param a("a", Shape{37}), b("b", Shape{19});
  double want_sq = 0.0;
  for (Param* p : {&a, &b})
    for (int64_t i = 0; i < p->grad().numel(); ++i) {
      p->value()[i] = 0.05f * static_cast<float>(i) - 0.5f;
      p->grad()[i] = 0.1f * static_cast<float>(i % 11) - 0.4f;
      want_sq += static_cast<double>(p->grad()[i]) * p->grad()[i];
    }
  std::vector<float> w0(b.value().data(), b.value().data() + 19), g(b.grad().data(), b.grad().data() + 19);
  OptimizerOptions o;
  o.kind = "adamw";
  o.lr = 0.01f;
  o.weight_decay = 0.1f;
  auto opt = make_optimizer({&a, &b}, o);
  opt->step();
  EXPECT_NEAR(opt->last_grad_norm(), std::sqrt(want_sq), 1e-12 * std::sqrt(want_sq));
  for (int i = 0; i < 19; ++i) {  // first step: m = 0.1 g, v = 0.001 g^2, bias-corrected to g and g^2
    const double w = w0[i] * (1.0 - 0.01 * 0.1) - 0.01 * g[i] / (std::fabs(g[i]) + 1e-8);
    EXPECT_NEAR(b.value()[i], w, 1e-6) << "element " << i;
  }
}

TEST(Optimizer, ClipsTheGlobalNormAndScalesTheLearningRate) {
  Param a("a", Shape{1}), b("b", Shape{1});
  OptimizerOptions o;
  o.lr = 1.0f;
  o.clip_norm = 1.0f;
  Sgd sgd({&a, &b}, o);
  a.grad()[0] = 3.0f;  // global norm 5: clipped to 1 -> (0.6, 0.8) (torch: max / (norm + 1e-6))
  b.grad()[0] = 4.0f;
  sgd.set_lr_scale(0.5f);
  sgd.step();
  EXPECT_DOUBLE_EQ(sgd.last_grad_norm(), 5.0);
  EXPECT_NEAR(a.value()[0], -0.5f * 3.0f / (5.0f + 1e-6f), 1e-6);
  EXPECT_NEAR(b.value()[0], -0.5f * 4.0f / (5.0f + 1e-6f), 1e-6);
  EXPECT_FLOAT_EQ(sgd.lr(), 0.5f);
  try {
    make_optimizer({&a},
                   {.lr = 0.1f, .momentum = 0, .dampening = 0, .weight_decay = 0, .nesterov = false, .kind = "lamb"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[optimizer] unknown optimizer 'lamb' (known: sgd, adam, adamw)");
  }
}

TEST(Schedule, WarmupStepAndCosineFactors) {
  ScheduleOptions s;
  EXPECT_FLOAT_EQ(lr_factor(s, 123), 1.0f);
  s.warmup_steps = 4;
  EXPECT_FLOAT_EQ(lr_factor(s, 0), 0.25f);
  EXPECT_FLOAT_EQ(lr_factor(s, 3), 1.0f);
  s.kind = "step";
  s.step_size = 10;
  s.gamma = 0.5f;
  validate(s);
  EXPECT_FLOAT_EQ(lr_factor(s, 13), 1.0f);  // 9 steps after warm-up
  EXPECT_FLOAT_EQ(lr_factor(s, 14), 0.5f);
  EXPECT_FLOAT_EQ(lr_factor(s, 34), 0.125f);
  s.kind = "cosine";
  s.total_steps = 104;
  s.min_factor = 0.1f;
  validate(s);
  EXPECT_FLOAT_EQ(lr_factor(s, 4), 1.0f);
  EXPECT_NEAR(lr_factor(s, 54), 0.55f, 1e-6);  // half-way: min + (1 - min) / 2
  EXPECT_NEAR(lr_factor(s, 104), 0.1f, 1e-6);
  EXPECT_NEAR(lr_factor(s, 500), 0.1f, 1e-6);  // stays at the end
  s.total_steps = 3;
  try {
    validate(s);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "[schedule] cosine needs total steps (3) above the warm-up (4) and a final factor in [0, 1], got 0.1");
  }
}

// The portable GEMM against a double-precision loop: row and column remainders, K across
// its cache blocks, leading dimensions wider than the matrices, and accumulation.
TEST(PortableGemm, MatchesALoopOnEveryShapeEdge) {
  Rng rng(7);
  for (const bool native : {false, true})  // gemm, then gemm_native (16-wide tiles)
  for (const auto [m, n, k] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {4, 8, 3}, {7, 13, 300}, {5, 17, 513}, {9, 3, 0}, {6, 37, 20}})
    for (const bool accumulate : {false, true}) {
      const int64_t lda = k + 2, ldb = n + 3, ldc = n + 1;
      const Tensor a = random_tensor({m, lda}, rng), b = random_tensor({std::max<int64_t>(k, 1), ldb}, rng);
      Tensor c = random_tensor({m, ldc}, rng);
      const Tensor c0 = c.clone();
      (native ? simd::gemm_native : simd::gemm)(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          double want = j < n && accumulate ? c0.data()[i * ldc + j] : 0.0;
          for (int64_t p = 0; p < k && j < n; ++p) want += double(a.data()[i * lda + p]) * b.data()[p * ldb + j];
          if (j >= n) want = c0.data()[i * ldc + j];  // outside C: untouched
          ASSERT_NEAR(c.data()[i * ldc + j], want, 1e-4 * (1 + std::abs(want)))
              << (native ? "native " : "") << m << "x" << n << "x" << k << " at " << i << "," << j;
        }
    }
  Tensor t = random_tensor({5, 7}, rng), tt = random_tensor({7, 5}, rng);
  simd::transpose(5, 7, t.data(), 7, tt.data());
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 7; ++j) EXPECT_EQ(tt.data()[j * 5 + i], t.data()[i * 7 + j]);
}

// The softmax's vector exp: within 4 float ulps (relative 5e-7) of expf over its range, and
// tiny (not 0, not NaN, not inf) below it, capped above it.
TEST(Vector, Exp16MatchesExpf) {
  float worst = 0.0f;
  for (float x0 = -87.0f; x0 < 88.5f; x0 += 0.37f * 16) {
    float in[16], out[16];
    for (int i = 0; i < 16; ++i) in[i] = x0 + 0.37f * static_cast<float>(i) * 0.999f;
    simd::store16(out, simd::exp16(simd::load16(in)));
    for (int i = 0; i < 16; ++i) {
      if (in[i] > 88.3f) continue;
      const double want = std::exp(static_cast<double>(in[i]));
      worst = std::max(worst, static_cast<float>(std::fabs(out[i] - want) / want));
    }
  }
  EXPECT_LT(worst, 5e-7f);
  float in[16], out[16];
  for (int i = 0; i < 16; ++i) in[i] = i < 8 ? -1000.0f - static_cast<float>(i) : 1000.0f;
  simd::store16(out, simd::exp16(simd::load16(in)));
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(out[i] > 0.0f && out[i] < 1e-37f) << out[i];
  for (int i = 8; i < 16; ++i) EXPECT_TRUE(std::isfinite(out[i]) && out[i] > 1e38f) << out[i];
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
