// Op tests: every kernel of the backend under test (TANDEM_BACKEND) against the reference
// backend, forward and both backward passes, over shapes that exercise stride, padding and
// dilation. Fluent testers in the style of XNNPACK's operator testers.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstring>
#include <typeinfo>
#include <limits>

#include "backends/reference/reference_backend.h"
#include "core/activation.h"
#include "core/error.h"
#include "core/ops/op.h"
#include "test_support.h"

namespace tandem::test {
namespace {

// Outputs start as NaN: a kernel that accumulates into its output instead of overwriting it
// fails. And they sit between guard zones holding a canary that must survive: Tensor::empty
// pads every allocation by 16 to 31 floats, so a SIMD tail store past the end (or before the
// start) would be invisible to ASan and to the NaN prefill. The guards are checked when the
// tensor is released, inside the test that made it. Under cuda the storage is a Tensor's, so a
// large output lies where that backend keeps tensors (managed memory: written in place);
// elsewhere it is exactly the floats asked for, so ASan sees a store past the guards too.
constexpr int64_t kGuardFloats = 32;         // 128 bytes each side; keeps the 64-byte alignment
constexpr uint32_t kCanaryBits = 0xdeadbeefu;  // a float no kernel computes by chance

struct Guarded {
  Tensor backing;          // under cuda
  float* exact = nullptr;  // elsewhere
  int64_t n = 0;
  std::string shape;
  ~Guarded() {
    const float* p = exact ? exact : backing.defined() ? backing.data() : nullptr;
    if (!p) return;
    for (int64_t i = 0; i < kGuardFloats; ++i) {
      uint32_t before = 0, after = 0;
      std::memcpy(&before, p + i, sizeof before);
      std::memcpy(&after, p + kGuardFloats + n + i, sizeof after);
      if (before != kCanaryBits) ADD_FAILURE() << "a kernel wrote " << (kGuardFloats - i) << " floats before its output " << shape;
      if (after != kCanaryBits) ADD_FAILURE() << "a kernel wrote " << (i + 1) << " floats past the end of its output " << shape;
      if (before != kCanaryBits || after != kCanaryBits) break;
    }
    if (exact) ::operator delete[](exact, std::align_val_t{kTensorAlignment});
  }
};

Tensor nan_tensor(const Shape& s) {
  const int64_t n = s.numel(), total = n + 2 * kGuardFloats;
  auto owner = std::make_shared<Guarded>();  // made in place: a moved-from copy would check too
  owner->n = n;
  owner->shape = s.str();
  float* base;
  if (backend_under_test() == "cuda") {
    base = (owner->backing = Tensor::empty({total})).data();
  } else {
    base = owner->exact = static_cast<float*>(
        ::operator new[](static_cast<std::size_t>(total) * sizeof(float), std::align_val_t{kTensorAlignment}));
  }
  for (int64_t i = 0; i < total; ++i) std::memcpy(base + i, &kCanaryBits, sizeof kCanaryBits);
  Tensor t = Tensor::borrow(owner, base + kGuardFloats, s);
  t.fill(std::numeric_limits<float>::quiet_NaN());
  return t;
}

// The guards fail a test whose kernel stores one float past the end or before the start.
TEST(Guards, CatchAStoreOutsideTheOutput) {
  EXPECT_NONFATAL_FAILURE(
      {
        Tensor t = nan_tensor({5});
        t.data()[5] = 0.0f;
      },
      "1 floats past the end of its output [5]");
  EXPECT_NONFATAL_FAILURE(
      {
        Tensor t = nan_tensor({3, 2});
        t.data()[-2] = 0.0f;
      },
      "2 floats before its output [3, 2]");
}

struct Backends {
  std::unique_ptr<Backend> tested = make_test_backend(backend_under_test());
  std::unique_ptr<Backend> reference = make_reference_backend({});
};

// The ops the CPU backends hand to the reference's own code (make_reference_batch_norm and
// its kin, core/host_vectors.cpp): `backend` has a kernel of its own for `op` when it returns
// another kernel than the reference's. Their op tests run only where one has (a test of the
// reference's code against itself would check nothing): tests/CMakeLists.txt's
// own_kernel_backends, held to this by OwnKernels.EachHasItsOpTest.
constexpr const char* kSharedKernelOps[] = {"batch_norm", "token_pool", "dropout", "vectors"};
bool has_own_kernel(Backend& backend, Backend& reference, std::string_view op) {
  if (op == "vectors") return &backend.vectors() != &reference.vectors();
  if (op == "batch_norm") {
    const BatchNormGeometry g{2, 3, 1e-5f};
    auto a = backend.batch_norm(g), b = reference.batch_norm(g);
    return typeid(*a) != typeid(*b);
  }
  if (op == "token_pool") {
    const TokenPoolGeometry g{1, 2, 3};
    auto a = backend.token_pool(g), b = reference.token_pool(g);
    return typeid(*a) != typeid(*b);
  }
  auto a = backend.dropout(4), b = reference.dropout(4);
  return typeid(*a) != typeid(*b);
}

// Fails an op test of `op` registered for a backend that runs the reference's own kernel.
#define EXPECT_OWN_KERNEL(b, op)                                                                             \
  ASSERT_TRUE(has_own_kernel(*(b).tested, *(b).reference, op))                                             \
      << backend_under_test() << " runs the reference's own " << (op)                                      \
      << " kernel: this test would compare the reference with itself. Register it only for "               \
         "own_kernel_backends (tests/CMakeLists.txt)"

class Conv2dTester {
 public:
  Conv2dTester& batch(int64_t n) { return g_.batch = n, *this; }
  Conv2dTester& input(int64_t h, int64_t w, int64_t c) { return g_.in_h = h, g_.in_w = w, g_.in_c = c, *this; }
  Conv2dTester& out_channels(int64_t c) { return g_.out_c = c, *this; }
  Conv2dTester& kernel(int64_t h, int64_t w) { return g_.kernel_h = h, g_.kernel_w = w, *this; }
  Conv2dTester& stride(int64_t h, int64_t w) { return g_.stride_h = h, g_.stride_w = w, *this; }
  Conv2dTester& padding(int64_t h, int64_t w) { return g_.pad_h = h, g_.pad_w = w, *this; }
  Conv2dTester& dilation(int64_t h, int64_t w) { return g_.dilation_h = h, g_.dilation_w = w, *this; }
  Conv2dTester& bias(bool b) { return g_.bias = b, *this; }
  Conv2dTester& groups(int64_t n) { return g_.groups = n, *this; }

  void test() const {
    SCOPED_TRACE(g_.str());
    Backends b;
    Rng rng(42);
    const int64_t oh = g_.out_h(), ow = g_.out_w();
    Tensor x = random_tensor({g_.batch, g_.in_h, g_.in_w, g_.in_c}, rng);
    Tensor w = random_tensor({g_.out_c, g_.kernel_h, g_.kernel_w, g_.in_c / g_.groups}, rng);
    Tensor bias = random_tensor({g_.out_c}, rng);
    Tensor dy = random_tensor({g_.batch, oh, ow, g_.out_c}, rng);
    auto run = [&](Backend& backend, uint64_t version) {
      auto k = backend.conv2d(g_);
      WeightsView view{w.data(), g_.bias ? bias.data() : nullptr, version};
      Outputs o{nan_tensor(dy.shape()), nan_tensor(x.shape()), nan_tensor(w.shape()), nan_tensor(bias.shape())};
      k->forward(x.data(), view, o.y.data());
      k->forward(x.data(), view, o.y.data());  // a second call reuses the planned kernel
      k->backward_data(dy.data(), view, o.dx.data());
      k->backward_weights(x.data(), dy.data(), o.dw.data(), g_.bias ? o.db.data() : nullptr);
      return std::make_pair(std::move(o), std::move(k));
    };
    auto [want, ref_kernel] = run(*b.reference, 1);
    auto [got, kernel] = run(*b.tested, 1);
    expect_close(got.y.data(), want.y.data(), want.y.numel(), "forward");
    expect_close(got.dx.data(), want.dx.data(), want.dx.numel(), "backward_data");
    expect_close(got.dw.data(), want.dw.data(), want.dw.numel(), "backward_weights dw");
    if (g_.bias) expect_close(got.db.data(), want.db.data(), want.db.numel(), "backward_weights db");

    // New weight values under a new version must be picked up (backends that pack weights),
    // and every pass must follow new input and output buffers (another micro-batch's).
    for (int64_t i = 0; i < w.numel(); ++i) w[i] = -w[i] * 0.5f;
    WeightsView updated{w.data(), g_.bias ? bias.data() : nullptr, 2};
    Tensor x2 = random_tensor(x.shape(), rng), dy2 = random_tensor(dy.shape(), rng);
    Outputs want2{nan_tensor(dy.shape()), nan_tensor(x.shape()), nan_tensor(w.shape()), nan_tensor(bias.shape())};
    Outputs got2{nan_tensor(dy.shape()), nan_tensor(x.shape()), nan_tensor(w.shape()), nan_tensor(bias.shape())};
    for (auto [k, o] : {std::pair{ref_kernel.get(), &want2}, std::pair{kernel.get(), &got2}}) {
      k->forward(x2.data(), updated, o->y.data());
      k->backward_data(dy2.data(), updated, o->dx.data());
      k->backward_weights(x2.data(), dy2.data(), o->dw.data(), g_.bias ? o->db.data() : nullptr);
    }
    expect_close(got2.y.data(), want2.y.data(), want2.y.numel(), "forward after a weight update, new buffers");
    expect_close(got2.dx.data(), want2.dx.data(), want2.dx.numel(), "backward_data after a weight update, new buffers");
    expect_close(got2.dw.data(), want2.dw.data(), want2.dw.numel(), "backward_weights dw, new buffers");
    // And back to the first buffers.
    kernel->backward_data(dy.data(), updated, got.dx.data());
    ref_kernel->backward_data(dy.data(), updated, want.dx.data());
    expect_close(got.dx.data(), want.dx.data(), want.dx.numel(), "backward_data, first buffers again");
  }

 private:
  struct Outputs {
    Tensor y, dx, dw, db;
  };
  Conv2dGeometry g_;
};

class LinearTester {
 public:
  LinearTester& batch(int64_t n) { return g_.batch = n, *this; }
  LinearTester& features(int64_t in, int64_t out) { return g_.in_features = in, g_.out_features = out, *this; }
  LinearTester& bias(bool b) { return g_.bias = b, *this; }

  void test() const {
    SCOPED_TRACE(g_.str());
    Backends b;
    Rng rng(7);
    Tensor x = random_tensor({g_.batch, g_.in_features}, rng);
    Tensor w = random_tensor({g_.out_features, g_.in_features}, rng);
    Tensor bias = random_tensor({g_.out_features}, rng);
    Tensor dy = random_tensor({g_.batch, g_.out_features}, rng);
    struct Out {
      Tensor y, dx, dw, db;
    };
    auto run = [&](Backend& backend, uint64_t version) {
      auto k = backend.linear(g_);
      WeightsView view{w.data(), g_.bias ? bias.data() : nullptr, version};
      Out o{nan_tensor(dy.shape()), nan_tensor(x.shape()), nan_tensor(w.shape()), nan_tensor(bias.shape())};
      k->forward(x.data(), view, o.y.data());
      k->forward(x.data(), view, o.y.data());
      k->backward_data(dy.data(), view, o.dx.data());
      k->backward_weights(x.data(), dy.data(), o.dw.data(), g_.bias ? o.db.data() : nullptr);
      // Backward of another micro-batch with the same kernel.
      k->backward_weights(x.data(), dy.data(), o.dw.data(), g_.bias ? o.db.data() : nullptr);
      return std::make_pair(std::move(o), std::move(k));
    };
    auto [want, ref_kernel] = run(*b.reference, 1);
    auto [got, kernel] = run(*b.tested, 1);
    expect_close(got.y.data(), want.y.data(), want.y.numel(), "forward");
    expect_close(got.dx.data(), want.dx.data(), want.dx.numel(), "backward_data");
    expect_close(got.dw.data(), want.dw.data(), want.dw.numel(), "backward_weights dw");
    if (g_.bias) expect_close(got.db.data(), want.db.data(), want.db.numel(), "backward_weights db");

    for (int64_t i = 0; i < w.numel(); ++i) w[i] = w[i] * 0.25f + 0.125f;
    WeightsView updated{w.data(), g_.bias ? bias.data() : nullptr, 2};
    ref_kernel->forward(x.data(), updated, want.y.data());
    kernel->forward(x.data(), updated, got.y.data());
    expect_close(got.y.data(), want.y.data(), want.y.numel(), "forward after a weight update");
    ref_kernel->backward_data(dy.data(), updated, want.dx.data());
    kernel->backward_data(dy.data(), updated, got.dx.data());
    expect_close(got.dx.data(), want.dx.data(), want.dx.numel(), "backward_data after a weight update");
  }

 private:
  LinearGeometry g_;
};

// G linear layers in one call (heads): against the reference, with fresh buffers per pass.
class GroupedLinearTester {
 public:
  GroupedLinearTester& batch(int64_t n) { return g_.batch = n, *this; }
  GroupedLinearTester& groups(int64_t n) { return g_.groups = n, *this; }
  GroupedLinearTester& features(int64_t in, int64_t out) { return g_.in_features = in, g_.out_features = out, *this; }
  GroupedLinearTester& bias(bool b) { return g_.bias = b, *this; }

  void test() const {
    SCOPED_TRACE(g_.str());
    Backends b;
    if (const Support s = b.tested->supports("heads", {}); !s) GTEST_SKIP() << b.tested->name() << ": " << s.why;
    std::unique_ptr<GroupedLinearKernel> k = b.tested->grouped_linear(g_);
    auto ref = b.reference->grouped_linear(g_);
    Rng rng(9);
    const int64_t G = g_.groups, I = g_.in_features, O = g_.out_features;
    Tensor x = random_tensor({g_.batch, G * I}, rng), w = random_tensor({G, O, I}, rng);
    Tensor bias = random_tensor({G * O}, rng), dy = random_tensor({g_.batch, G * O}, rng);
    const WeightsView view{w.data(), g_.bias ? bias.data() : nullptr, 1};
    Tensor want_y = nan_tensor(dy.shape()), got_y = nan_tensor(dy.shape());
    Tensor want_dx = nan_tensor(x.shape()), got_dx = nan_tensor(x.shape());
    Tensor want_dw = nan_tensor(w.shape()), got_dw = nan_tensor(w.shape());
    Tensor want_db = nan_tensor(bias.shape()), got_db = nan_tensor(bias.shape());
    ref->forward(x.data(), view, want_y.data());
    k->forward(x.data(), view, got_y.data());
    ref->backward_data(dy.data(), view, want_dx.data());
    k->backward_data(dy.data(), view, got_dx.data());
    ref->backward_weights(x.data(), dy.data(), want_dw.data(), g_.bias ? want_db.data() : nullptr);
    k->backward_weights(x.data(), dy.data(), got_dw.data(), g_.bias ? got_db.data() : nullptr);
    expect_close(got_y.data(), want_y.data(), want_y.numel(), "forward");
    expect_close(got_dx.data(), want_dx.data(), want_dx.numel(), "backward_data");
    expect_close(got_dw.data(), want_dw.data(), want_dw.numel(), "backward_weights dw");
    if (g_.bias) expect_close(got_db.data(), want_db.data(), want_db.numel(), "backward_weights db");
  }

 private:
  GroupedLinearGeometry g_;
};

class MaxPool2dTester {
 public:
  MaxPool2dTester& batch(int64_t n) { return g_.batch = n, *this; }
  MaxPool2dTester& input(int64_t h, int64_t w, int64_t c) { return g_.in_h = h, g_.in_w = w, g_.channels = c, *this; }
  MaxPool2dTester& kernel(int64_t h, int64_t w) { return g_.kernel_h = h, g_.kernel_w = w, *this; }
  MaxPool2dTester& stride(int64_t h, int64_t w) { return g_.stride_h = h, g_.stride_w = w, *this; }
  MaxPool2dTester& padding(int64_t h, int64_t w) { return g_.pad_h = h, g_.pad_w = w, *this; }
  // Values from {-1, 0, 1}: windows hold ties, and the first maximum in row order must win.
  MaxPool2dTester& ties(bool t) { return ties_ = t, *this; }

  void test() const {
    SCOPED_TRACE(g_.str());
    Backends b;
    Rng rng(3);
    // Distinct values, so the maximum of every window is unique and both sides agree on it.
    Tensor x = Tensor::empty({g_.batch, g_.in_h, g_.in_w, g_.channels});
    for (int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(i) * 0.01f;
    for (int64_t i = x.numel() - 1; i > 0; --i) std::swap(x[i], x[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)))]);
    if (ties_)
      for (int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(static_cast<int64_t>(rng.below(3))) - 1.0f;
    Tensor dy = random_tensor({g_.batch, g_.out_h(), g_.out_w(), g_.channels}, rng);
    auto run = [&](Backend& backend, Tensor& y, Tensor& dx) {
      auto k = backend.max_pool2d(g_);
      std::vector<std::byte> stash(k->stash_bytes());
      k->forward(x.data(), y.data(), stash.data());
      dx.fill(123.0f);  // backward must overwrite, not accumulate
      k->backward(dy.data(), stash.data(), dx.data());
    };
    Tensor want_y = nan_tensor(dy.shape()), got_y = nan_tensor(dy.shape());
    Tensor want_dx = nan_tensor(x.shape()), got_dx = nan_tensor(x.shape());
    run(*b.reference, want_y, want_dx);
    run(*b.tested, got_y, got_dx);
    expect_close(got_y.data(), want_y.data(), want_y.numel(), "forward", 0.0f);
    expect_close(got_dx.data(), want_dx.data(), want_dx.numel(), "backward", 1e-6f);

    // Two micro-batches in flight through one kernel, each with its own stash, while the
    // gradient buffers are shared (as the network does): backward must use the given stash.
    auto ref = b.reference->max_pool2d(g_);
    auto tested = b.tested->max_pool2d(g_);
    Tensor x2 = x.clone();
    for (int64_t i = x2.numel() - 1; i > 0; --i) std::swap(x2[i], x2[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)))]);

    std::vector<std::byte> stash_a(tested->stash_bytes()), stash_b(tested->stash_bytes());
    std::vector<std::byte> ref_a(ref->stash_bytes()), ref_b(ref->stash_bytes());
    Tensor y_a = nan_tensor(dy.shape()), y_b = nan_tensor(dy.shape());
    tested->forward(x.data(), y_a.data(), stash_a.data());
    tested->forward(x2.data(), y_b.data(), stash_b.data());
    ref->forward(x.data(), y_a.data(), ref_a.data());
    ref->forward(x2.data(), y_b.data(), ref_b.data());
    for (auto [stash, ref_stash] : {std::pair{&stash_a, &ref_a}, std::pair{&stash_b, &ref_b}, std::pair{&stash_a, &ref_a}}) {
      tested->backward(dy.data(), stash->data(), got_dx.data());
      ref->backward(dy.data(), ref_stash->data(), want_dx.data());
      expect_close(got_dx.data(), want_dx.data(), want_dx.numel(), "backward of interleaved micro-batches", 1e-6f);
    }
  }

 private:
  Pool2dGeometry g_;
  bool ties_ = false;
};

class AvgPool2dTester {
 public:
  AvgPool2dTester& batch(int64_t n) { return g_.batch = n, *this; }
  AvgPool2dTester& input(int64_t h, int64_t w, int64_t c) { return g_.in_h = h, g_.in_w = w, g_.channels = c, *this; }
  AvgPool2dTester& kernel(int64_t h, int64_t w) { return g_.kernel_h = h, g_.kernel_w = w, *this; }
  AvgPool2dTester& stride(int64_t h, int64_t w) { return g_.stride_h = h, g_.stride_w = w, *this; }
  AvgPool2dTester& padding(int64_t h, int64_t w) { return g_.pad_h = h, g_.pad_w = w, *this; }

  void test() const {
    SCOPED_TRACE(g_.str());
    Backends b;
    Rng rng(4);
    Tensor x = random_tensor({g_.batch, g_.in_h, g_.in_w, g_.channels}, rng);
    Tensor dy = random_tensor({g_.batch, g_.out_h(), g_.out_w(), g_.channels}, rng);
    auto run = [&](Backend& backend, const Tensor& in, Tensor& y, Tensor& dx) {
      auto k = backend.avg_pool2d(g_);
      k->forward(in.data(), y.data());
      dx.fill(123.0f);  // backward must overwrite, not accumulate
      k->backward(dy.data(), dx.data());
    };
    Tensor want_y = nan_tensor(dy.shape()), got_y = nan_tensor(dy.shape());
    Tensor want_dx = nan_tensor(x.shape()), got_dx = nan_tensor(x.shape());
    run(*b.reference, x, want_y, want_dx);
    run(*b.tested, x, got_y, got_dx);
    expect_close(got_y.data(), want_y.data(), want_y.numel(), "forward", 1e-5f);
    expect_close(got_dx.data(), want_dx.data(), want_dx.numel(), "backward", 1e-6f);
    // One kernel, two input buffers in turn (as micro-batch slots are): no stale pointers.
    auto k = b.tested->avg_pool2d(g_);
    Tensor x2 = random_tensor(x.shape(), rng), want2 = nan_tensor(dy.shape()), got2 = nan_tensor(dy.shape());
    b.reference->avg_pool2d(g_)->forward(x2.data(), want2.data());
    k->forward(x.data(), got_y.data());
    k->forward(x2.data(), got2.data());
    expect_close(got2.data(), want2.data(), want2.numel(), "forward of a second buffer", 1e-5f);
  }

 private:
  Pool2dGeometry g_;
};

TEST(Conv2d, Basic3x3) { Conv2dTester().batch(2).input(7, 6, 3).out_channels(5).kernel(3, 3).padding(1, 1).test(); }
TEST(Conv2d, Grouped) { Conv2dTester().batch(2).input(7, 6, 6).out_channels(4).kernel(3, 3).padding(1, 1).groups(2).test(); }
TEST(Conv2d, Depthwise3x3Stride2) { Conv2dTester().batch(2).input(9, 8, 8).out_channels(8).kernel(3, 3).stride(2, 2).padding(1, 1).groups(8).test(); }
TEST(Conv2d, DepthwiseMultiplier2NoBias) { Conv2dTester().batch(3).input(6, 6, 4).out_channels(8).kernel(3, 3).groups(4).bias(false).test(); }
TEST(Conv2d, NoBias) { Conv2dTester().batch(1).input(5, 5, 4).out_channels(3).kernel(3, 3).bias(false).test(); }
TEST(Conv2d, Stride2Padding1) { Conv2dTester().batch(3).input(9, 8, 4).out_channels(6).kernel(3, 3).stride(2, 2).padding(1, 1).test(); }
TEST(Conv2d, Stride2OddNoPad) { Conv2dTester().batch(2).input(11, 9, 2).out_channels(3).kernel(3, 2).stride(2, 2).test(); }
TEST(Conv2d, Dilation2) { Conv2dTester().batch(2).input(10, 9, 3).out_channels(4).kernel(3, 3).dilation(2, 2).padding(2, 2).test(); }
TEST(Conv2d, Pointwise) { Conv2dTester().batch(4).input(6, 6, 16).out_channels(8).kernel(1, 1).test(); }
TEST(Conv2d, Kernel5Stride3) { Conv2dTester().batch(2).input(13, 12, 3).out_channels(4).kernel(5, 5).stride(3, 2).padding(2, 1).test(); }
// 3x3, stride 1, pad 1 with channels in 16s: xnnpack's forward and backward_data run as
// Winograd F(2x2, 3x3) (backends/simd/winograd_conv2d). The Fashion-MNIST model's conv2 (784
// tiles: 12 chunks of 64 and a partial one), and odd sizes whose last tiles are cut off.
TEST(Conv2d, WinogradShapes) { Conv2dTester().batch(16).input(14, 14, 32).out_channels(64).kernel(3, 3).padding(1, 1).test(); }
TEST(Conv2d, WinogradOddSizesNoBias) {
  Conv2dTester().batch(3).input(7, 5, 16).out_channels(48).kernel(3, 3).padding(1, 1).bias(false).test();
}
// Fewer taps x input channels than output channels (a first layer). On xnnpack, Cout % 16 == 0
// takes the direct SIMD weight gradient; other Cout the GEMM over an im2col, whose packed
// side may then be the im2col; 16 x 28 x 28 spans several chunks of either.
TEST(Conv2d, FirstLayerShapes) { Conv2dTester().batch(16).input(28, 28, 1).out_channels(32).kernel(3, 3).padding(1, 1).test(); }
TEST(Conv2d, FewInputChannelsStride2) { Conv2dTester().batch(3).input(11, 10, 2).out_channels(24).kernel(3, 3).stride(2, 2).padding(1, 1).test(); }
// xnnpack's direct SIMD passes (weight gradient; forward when K = kh*kw*Cin <= 32): blocks of
// 64 + 16 channels, 48 = 32 + 16, rows not a multiple of the 6- or 12-row tiles, strides,
// dilation, asymmetric padding and none, no bias.
TEST(Conv2d, SimdChannels80Pointwise) { Conv2dTester().batch(3).input(5, 7, 5).out_channels(80).kernel(1, 1).test(); }
TEST(Conv2d, SimdChannels48Kernel5x3) {
  Conv2dTester().batch(2).input(9, 9, 7).out_channels(48).kernel(5, 3).stride(1, 2).padding(1, 2).test();
}
TEST(Conv2d, SimdChannels16Dilated) {
  Conv2dTester().batch(3).input(12, 11, 3).out_channels(16).kernel(3, 3).stride(2, 2).dilation(2, 2).padding(2, 2).test();
}
TEST(Conv2d, SimdFirstLayerNoBias) {
  Conv2dTester().batch(2).input(6, 7, 2).out_channels(32).kernel(3, 3).padding(1, 1).bias(false).test();
}
TEST(Conv2d, SimdChannels128Unpadded) { Conv2dTester().batch(2).input(6, 5, 9).out_channels(128).kernel(2, 2).test(); }
TEST(Conv2d, FashionMnistShapes) { Conv2dTester().batch(8).input(14, 14, 32).out_channels(64).kernel(3, 3).padding(1, 1).test(); }

TEST(GroupedLinear, Basic) { GroupedLinearTester().batch(5).groups(3).features(7, 4).test(); }
TEST(GroupedLinear, NoBiasOneGroup) { GroupedLinearTester().batch(4).groups(1).features(9, 6).bias(false).test(); }
TEST(GroupedLinear, ManyHeads) { GroupedLinearTester().batch(16).groups(64).features(32, 10).test(); }

TEST(Linear, Basic) { LinearTester().batch(4).features(17, 9).test(); }
TEST(Linear, NoBias) { LinearTester().batch(3).features(8, 5).bias(false).test(); }
TEST(Linear, BatchOne) { LinearTester().batch(1).features(33, 10).test(); }
TEST(Linear, Wide) { LinearTester().batch(16).features(784, 128).test(); }
// A micro-batch on weights that onednn reorders to its blocked layout for the forward, with
// outputs that do not fill its blocks.
TEST(Linear, MicroBatchBlockedWeights) { LinearTester().batch(8).features(1000, 77).test(); }

// One layer's kernels at several row counts (micro-batch sizes, length buckets) share a
// weights_id: each computes its own rows right, and a backend that packs weights packs once
// per version for all of them. Seen from outside: values changed without a version bump
// are seen by no kernel of the id after one of them packed (xnnpack), or by all (backends that
// read the weights as they are); never by some and not others.
TEST(Linear, KernelsOfOneLayerShareItsWeights) {
  std::unique_ptr<Backend> b = make_test_backend(backend_under_test());
  std::unique_ptr<Backend> reference = make_reference_backend({});
  Backend& ref = *reference;
  const int64_t in = 12, out = 7;
  Rng rng(3);
  std::vector<float> w(static_cast<std::size_t>(in * out)), bias(static_cast<std::size_t>(out));
  for (float& v : w) v = rng.uniform01() - 0.5f;
  for (float& v : bias) v = rng.uniform01() - 0.5f;
  const uint64_t id = new_weights_id();
  WeightsView view{w.data(), bias.data(), 1};
  std::vector<std::unique_ptr<LinearKernel>> kernels;
  std::vector<std::vector<float>> x;
  for (const int64_t rows : {4, 9, 2}) {
    kernels.push_back(b->linear(LinearGeometry{rows, in, out, true, id}));
    std::vector<float> xs(static_cast<std::size_t>(rows * in));
    for (float& v : xs) v = rng.uniform01() - 0.5f;
    x.push_back(std::move(xs));
    std::vector<float> got(static_cast<std::size_t>(rows * out)), want(got.size());
    kernels.back()->forward(x.back().data(), view, got.data());
    ref.linear(LinearGeometry{rows, in, out, true})->forward(x.back().data(), view, want.data());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << rows << " rows, at " << i;
  }
  // Version 2 packed by the 4-row kernel, then other values under the same version (against
  // the contract, to see who packed): the 2-row kernel, not run at version 2 before, answers
  // with the values the 4-row kernel packed when it shares that packing (xnnpack), else with
  // the values as they are.
  for (float& v : w) v += 1.0f;
  view.version = 2;
  std::vector<float> packed_out(static_cast<std::size_t>(2 * out)), ignored(static_cast<std::size_t>(4 * out));
  ref.linear(LinearGeometry{2, in, out, true})->forward(x[2].data(), view, packed_out.data());
  kernels[0]->forward(x[0].data(), view, ignored.data());
  for (float& v : w) v += 1.0f;
  std::vector<float> got(packed_out.size()), as_they_are(packed_out.size());
  kernels[2]->forward(x[2].data(), view, got.data());
  ref.linear(LinearGeometry{2, in, out, true})->forward(x[2].data(), view, as_they_are.data());
  const std::vector<float>& want = b->name() == "xnnpack" ? packed_out : as_they_are;
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << "at " << i;
}

// Every activation op the registry has (relu6, hardswish, gelu, sigmoid, tanh, silu, ...)
// against the reference, on values spanning the kinks (not on them: at a kink the one-sided
// choices may differ).
TEST(Activation, ForwardBackward) {
  Backends b;
  int tested = 0;
  for (const std::string& op : op_names()) {
    const Activation* a = find_activation(op);
    if (!a) continue;
    const Activation& kind = *a;
    ++tested;
    SCOPED_TRACE(op);
    for (int64_t n : {1, 37, 4099}) {
      Rng rng(6);
      Tensor x = random_tensor({n}, rng, -8.0f, 8.0f), dy = random_tensor({n}, rng);
      Tensor want_y = nan_tensor({n}), got_y = nan_tensor({n}), want_dx = nan_tensor({n}), got_dx = nan_tensor({n});
      auto r = b.reference->activation(kind, n);
      auto t = b.tested->activation(kind, n);
      r->forward(x.data(), want_y.data());
      t->forward(x.data(), got_y.data());
      r->backward(x.data(), want_y.data(), dy.data(), want_dx.data());
      t->backward(x.data(), got_y.data(), dy.data(), got_dx.data());
      expect_close(got_y.data(), want_y.data(), n, "forward");
      expect_close(got_dx.data(), want_dx.data(), n, "backward");
    }
  }
  EXPECT_GE(tested, 6) << "the registry lost activation ops";
}

TEST(Add, Forward) {
  Backends b;
  for (int64_t n : {1, 33, 10000}) {
    Rng rng(11);
    Tensor a = random_tensor({n}, rng), c = random_tensor({n}, rng);
    Tensor want = nan_tensor({n}), got = nan_tensor({n});
    b.reference->add(n)->forward(a.data(), c.data(), want.data());
    b.tested->add(n)->forward(a.data(), c.data(), got.data());
    expect_close(got.data(), want.data(), n, "add", 0.0f);
  }
}

// The passes over parameters and gradients (VectorKernel) against the reference's host loops:
// fills, copies (strided too), sums, scaling, the squared norm (relative 1e-6: a device sums in another
// order) and one update of each optimizer rule (SGD plain, with momentum's first and later
// steps, dampening and Nesterov; Adam and AdamW), at lengths from 1 to past cuda's managed
// threshold (64 KiB): with TANDEM_CUDA_MEMORY=managed (device_check.sh's managed stage) cuda
// runs those on the device in place, else the host loops it falls back to.
TEST(Vectors, MatchTheReference) {
  Backends b;
  EXPECT_OWN_KERNEL(b, "vectors");
  VectorKernel& want = b.reference->vectors();
  VectorKernel& got = b.tested->vectors();
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{70001}}) {
    SCOPED_TRACE(cat(n, " floats"));
    Rng rng(43);
    const Tensor w0 = random_tensor({n}, rng), g = random_tensor({n}, rng), m0 = random_tensor({n}, rng),
                 v0 = random_tensor({n}, rng, 0.0f, 0.01f);
    auto pair = [&](const Tensor& from) {
      Tensor a = nan_tensor({n}), c = nan_tensor({n});
      a.copy_from(from);
      c.copy_from(from);
      return std::make_pair(a, c);
    };
    {
      auto [r, t] = pair(w0);
      want.fill(r.data(), 0.25f, n);
      got.fill(t.data(), 0.25f, n);
      expect_close(t.data(), r.data(), n, "fill", 0.0f);
      want.copy(r.data(), g.data(), n);
      got.copy(t.data(), g.data(), n);
      expect_close(t.data(), r.data(), n, "copy", 0.0f);
      // Columns [2, 5) of rows 7 wide: into a row of 11 at column 4, and back out.
      if (const int64_t rows = n / 11; rows > 0) {
        want.copy_rows(r.data() + 4, 11, w0.data() + 2, 7, 3, rows);
        got.copy_rows(t.data() + 4, 11, w0.data() + 2, 7, 3, rows);
        expect_close(t.data(), r.data(), n, "copy_rows", 0.0f);
        want.copy_rows(r.data(), 7, g.data() + 1, 11, 5, rows);
        got.copy_rows(t.data(), 7, g.data() + 1, 11, 5, rows);
        expect_close(t.data(), r.data(), n, "copy_rows back", 0.0f);
      }
      want.accumulate(r.data(), w0.data(), n);
      got.accumulate(t.data(), w0.data(), n);
      expect_close(t.data(), r.data(), n, "accumulate", 0.0f);
      want.scale(r.data(), 0.3, n);
      got.scale(t.data(), 0.3, n);
      expect_close(t.data(), r.data(), n, "scale", 1e-6f);
      const double norm = want.squared_norm(r.data(), n);
      EXPECT_NEAR(got.squared_norm(t.data(), n), norm, 1e-6 * norm) << "squared norm";
      // Three at once, one of them empty: each as alone.
      const float* arrays[3] = {r.data(), g.data(), w0.data()};
      const int64_t lengths[3] = {n, 0, n / 2};
      double want_norms[3], got_norms[3] = {-1.0, -1.0, -1.0};
      want.squared_norms(arrays, lengths, 3, want_norms);
      got.squared_norms(arrays, lengths, 3, got_norms);
      for (int i = 0; i < 3; ++i)
        EXPECT_NEAR(got_norms[i], want_norms[i], 1e-6 * want_norms[i]) << "squared norms, array " << i;
      EXPECT_EQ(want_norms[1], 0.0);
    }
    for (const SgdUpdate u : {SgdUpdate{0.1f, 0.0f, 0.0f, 0.01f, false, true}, SgdUpdate{0.1f, 0.9f, 0.0f, 0.0f, false, true},
                              SgdUpdate{0.1f, 0.9f, 0.2f, 0.01f, false, false},
                              SgdUpdate{0.05f, 0.9f, 0.0f, 0.001f, true, false}}) {
      SCOPED_TRACE(cat("sgd momentum ", u.momentum, " dampening ", u.dampening, u.nesterov ? " nesterov" : "",
                       u.first ? " first" : ""));
      auto [rw, tw] = pair(w0);
      auto [rm, tm] = pair(m0);
      const bool momentum = u.momentum != 0.0f;
      want.sgd(u, rw.data(), g.data(), momentum ? rm.data() : nullptr, n);
      got.sgd(u, tw.data(), g.data(), momentum ? tm.data() : nullptr, n);
      expect_close(tw.data(), rw.data(), n, "weights", 1e-5f);
      if (momentum) expect_close(tm.data(), rm.data(), n, "momentum", 1e-5f);
    }
    for (const bool decoupled : {false, true}) {
      SCOPED_TRACE(decoupled ? "adamw" : "adam");
      const AdamUpdate u{0.01f / 0.1f, 0.0447f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f - 0.01f * 0.01f, decoupled};
      auto [rw, tw] = pair(w0);
      auto [rm, tm] = pair(m0);
      auto [rv, tv] = pair(v0);
      want.adam(u, rw.data(), g.data(), rm.data(), rv.data(), n);
      got.adam(u, tw.data(), g.data(), tm.data(), tv.data(), n);
      expect_close(tw.data(), rw.data(), n, "weights", 1e-5f);
      expect_close(tm.data(), rm.data(), n, "first moment", 1e-5f);
      expect_close(tv.data(), rv.data(), n, "second moment", 1e-5f);
    }
  }
}

// Dropout against the reference: the same mask bit for bit (every backend draws core/
// dropout_bits.h's stream), outputs and the gradient after a training pass (scale 1 / (1 - p))
// and after an evaluation pass (scale 1), for p of 0.1 and 0.5, at a toy length and at a BERT
// layer's activations (past cuda's managed threshold).
TEST(Dropout, ForwardBackward) {
  Backends b;
  EXPECT_OWN_KERNEL(b, "dropout");
  for (const int64_t n : {int64_t{37}, int64_t{16 * 128 * 256}}) {
    for (const float p : {0.1f, 0.5f}) {
      SCOPED_TRACE(cat(n, " values, p ", p));
      Rng rng(53);
      Tensor x = random_tensor({n}, rng), dy = random_tensor({n}, rng);
      auto r = b.reference->dropout(n);
      auto t = b.tested->dropout(n);
      std::vector<uint8_t> want_keep(static_cast<std::size_t>(n), 7), got_keep(static_cast<std::size_t>(n), 7);
      Tensor want_y = nan_tensor({n}), got_y = nan_tensor({n});
      r->forward(1234, 5, p, x.data(), want_y.data(), want_keep.data());
      t->forward(1234, 5, p, x.data(), got_y.data(), got_keep.data());
      EXPECT_EQ(got_keep, want_keep) << "the masks differ";
      int64_t kept = 0;
      for (uint8_t k : want_keep) kept += k;
      EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(n), 1.0 - p, n > 1000 ? 0.01 : 0.35);
      expect_close(got_y.data(), want_y.data(), n, "forward", 1e-6f);
      for (const float scale : {1.0f / (1.0f - p), 1.0f}) {
        Tensor want_dx = nan_tensor({n}), got_dx = nan_tensor({n});
        r->backward(want_keep.data(), scale, dy.data(), want_dx.data());
        t->backward(want_keep.data(), scale, dy.data(), got_dx.data());
        expect_close(got_dx.data(), want_dx.data(), n, cat("backward, scale ", scale), 1e-6f);
      }
    }
  }
}

// Token pooling against the reference: BERT's first token, a masked mean with a sample whose
// mask keeps nothing (all weights 0) and one that keeps everything, at a toy size and at
// spam-bert's pooler ([16, 128, 256]: past cuda's managed threshold, used in place under
// TANDEM_CUDA_MEMORY=managed).
TEST(TokenPool, ForwardBackward) {
  Backends b;
  EXPECT_OWN_KERNEL(b, "token_pool");
  for (const TokenPoolGeometry g : {TokenPoolGeometry{3, 5, 7}, TokenPoolGeometry{16, 128, 256}}) {
    for (const bool mean : {false, true}) {
      SCOPED_TRACE(cat(g.str(), mean ? " mean" : " first"));
      Rng rng(47);
      const int64_t n = g.batch * g.tokens * g.features;
      Tensor x = random_tensor({n}, rng), dy = random_tensor({g.batch * g.features}, rng);
      Tensor w = Tensor::zeros({g.batch * g.tokens});
      for (int64_t s = 0; s < g.batch; ++s) {
        const int64_t kept = s == 0 ? 0 : s == 1 ? g.tokens : 1 + s % g.tokens;
        for (int64_t t = 0; t < g.tokens; ++t)
          w[s * g.tokens + t] = !mean ? (t == 0 ? 1.0f : 0.0f) : t < kept ? 1.0f / static_cast<float>(kept) : 0.0f;
      }
      auto r = b.reference->token_pool(g);
      auto t = b.tested->token_pool(g);
      Tensor want_y = nan_tensor({g.batch * g.features}), got_y = nan_tensor({g.batch * g.features});
      r->forward(x.data(), w.data(), want_y.data());
      t->forward(x.data(), w.data(), got_y.data());
      expect_close(got_y.data(), want_y.data(), want_y.numel(), "forward", 1e-5f);
      Tensor want_dx = nan_tensor({n}), got_dx = nan_tensor({n});
      r->backward(dy.data(), w.data(), want_dx.data());
      t->backward(dy.data(), w.data(), got_dx.data());
      expect_close(got_dx.data(), want_dx.data(), n, "backward", 1e-6f);
    }
  }
}

// Batch normalisation against the reference: training's outputs and statistics, evaluation
// with given statistics, every gradient in both modes and without the input gradient; rows
// far from zero (an offset of 300, where a one-pass variance in float would cancel); NHWC
// shapes of a ResNet stage and a BatchNorm1d of 10 features.
TEST(BatchNorm, ForwardBackward) {
  Backends b;
  EXPECT_OWN_KERNEL(b, "batch_norm");
  struct Case {
    int64_t rows, channels;
    float offset;
  };
  for (const Case c : {Case{1, 3, 0.0f}, Case{7, 10, 0.0f}, Case{4096, 128, 0.0f}, Case{200, 33, 300.0f},
                       Case{70000, 5, 0.0f}}) {
    SCOPED_TRACE(cat(c.rows, "x", c.channels, " offset ", c.offset));
    Rng rng(41);
    const BatchNormGeometry g{c.rows, c.channels, 1e-5f};
    const int64_t n = c.rows * c.channels;
    Tensor x = random_tensor({n}, rng, -3.0f, 3.0f), dy = random_tensor({n}, rng);
    for (int64_t i = 0; i < n; ++i) x[i] += c.offset + static_cast<float>(i % c.channels);  // channels differ
    Tensor gamma = random_tensor({c.channels}, rng, 0.5f, 1.5f), beta = random_tensor({c.channels}, rng);
    auto r = b.reference->batch_norm(g);
    auto t = b.tested->batch_norm(g);
    for (const bool training : {true, false}) {
      SCOPED_TRACE(training ? "training" : "evaluation");
      // stats: mean, inv_std, var; evaluation's are given (the reference's training ones).
      Tensor want_stats = nan_tensor({3 * c.channels}), got_stats = nan_tensor({3 * c.channels});
      if (!training) {
        Tensor ignored = nan_tensor({n});
        r->forward(x.data(), gamma.data(), beta.data(), true, want_stats.data(), want_stats.data() + c.channels,
                   want_stats.data() + 2 * c.channels, ignored.data());
        std::memcpy(got_stats.data(), want_stats.data(), 3 * c.channels * sizeof(float));
      }
      Tensor want_y = nan_tensor({n}), got_y = nan_tensor({n});
      r->forward(x.data(), gamma.data(), beta.data(), training, want_stats.data(), want_stats.data() + c.channels,
                 want_stats.data() + 2 * c.channels, want_y.data());
      t->forward(x.data(), gamma.data(), beta.data(), training, got_stats.data(), got_stats.data() + c.channels,
                 got_stats.data() + 2 * c.channels, got_y.data());
      expect_close(got_y.data(), want_y.data(), n, "forward", 1e-4f);
      if (training) expect_close(got_stats.data(), want_stats.data(), 3 * c.channels, "statistics", 1e-4f);
      for (const bool want_input : {true, false}) {
        Tensor want_dx = nan_tensor({n}), got_dx = nan_tensor({n});
        Tensor want_dg = nan_tensor({c.channels}), got_dg = nan_tensor({c.channels});
        Tensor want_db = nan_tensor({c.channels}), got_db = nan_tensor({c.channels});
        r->backward(x.data(), dy.data(), gamma.data(), want_stats.data(), want_stats.data() + c.channels, training,
                    want_input ? want_dx.data() : nullptr, want_dg.data(), want_db.data());
        t->backward(x.data(), dy.data(), gamma.data(), want_stats.data(), want_stats.data() + c.channels, training,
                    want_input ? got_dx.data() : nullptr, got_dg.data(), got_db.data());
        if (want_input) expect_close(got_dx.data(), want_dx.data(), n, "backward dx", 1e-3f);
        expect_close(got_dg.data(), want_dg.data(), c.channels, "backward dgamma", 1e-3f);
        expect_close(got_db.data(), want_db.data(), c.channels, "backward dbeta", 1e-4f);
      }
    }
  }
}

// Layer normalisation against the reference: outputs, statistics, and every gradient, for a
// row of one feature, BERT-sized rows, and rows far from zero (a large common offset, where a
// one-pass variance would cancel); backward without the input gradient too.
TEST(LayerNorm, ForwardBackward) {
  Backends b;
  struct Case {
    int64_t rows, features;
    float eps, offset;
  };
  for (const Case c : {Case{3, 1, 1e-5f, 0.0f}, Case{7, 33, 1e-5f, 0.0f}, Case{64, 256, 1e-12f, 0.0f},
                       Case{5, 40, 1e-5f, 300.0f}}) {
    SCOPED_TRACE(cat(c.rows, "x", c.features, " offset ", c.offset));
    Rng rng(21);
    const LayerNormGeometry g{c.rows, c.features, c.eps};
    const int64_t n = c.rows * c.features;
    Tensor x = random_tensor({n}, rng, -3.0f, 3.0f), dy = random_tensor({n}, rng);
    for (int64_t i = 0; i < n; ++i) x[i] += c.offset;
    Tensor gamma = random_tensor({c.features}, rng, 0.5f, 1.5f), beta = random_tensor({c.features}, rng);
    auto r = b.reference->layer_norm(g);
    auto t = b.tested->layer_norm(g);
    Tensor want_y = nan_tensor({n}), got_y = nan_tensor({n});
    Tensor want_stats = nan_tensor({2 * c.rows}), got_stats = nan_tensor({2 * c.rows});
    r->forward(x.data(), gamma.data(), beta.data(), want_y.data(), want_stats.data(), want_stats.data() + c.rows);
    t->forward(x.data(), gamma.data(), beta.data(), got_y.data(), got_stats.data(), got_stats.data() + c.rows);
    expect_close(got_y.data(), want_y.data(), n, "forward", 1e-4f);
    for (const bool want_input : {true, false}) {
      Tensor want_dx = nan_tensor({n}), got_dx = nan_tensor({n});
      Tensor want_dg = nan_tensor({c.features}), got_dg = nan_tensor({c.features});
      Tensor want_db = nan_tensor({c.features}), got_db = nan_tensor({c.features});
      r->backward(x.data(), dy.data(), gamma.data(), want_stats.data(), want_stats.data() + c.rows,
                  want_input ? want_dx.data() : nullptr, want_dg.data(), want_db.data());
      t->backward(x.data(), dy.data(), gamma.data(), got_stats.data(), got_stats.data() + c.rows,
                  want_input ? got_dx.data() : nullptr, got_dg.data(), got_db.data());
      if (want_input) expect_close(got_dx.data(), want_dx.data(), n, "backward dx", 1e-3f);
      expect_close(got_dg.data(), want_dg.data(), c.features, "backward dgamma", 1e-3f);
      expect_close(got_db.data(), want_db.data(), c.features, "backward dbeta", 1e-4f);
    }
  }
}

// Attention: masked, causal, a sample whose keys are all padding (its output and gradients
// must be 0, not NaN), scores near 1e3 (the softmax must subtract its row's maximum), and each
// input gradient asked for alone.
TEST(Attention, ForwardBackward) {
  Backends b;
  struct Case {
    int64_t batch, tokens, heads, head_dim;
    bool causal, masked;
    float range;
  };
  for (const Case c : {Case{2, 5, 2, 4, false, false, 1.0f}, Case{3, 7, 3, 8, false, true, 1.0f},
                       Case{2, 9, 1, 16, true, false, 1.0f}, Case{2, 6, 2, 8, true, true, 1.0f},
                       Case{1, 33, 4, 16, false, true, 1.0f}, Case{2, 8, 2, 4, false, true, 40.0f}}) {
    SCOPED_TRACE(cat("N", c.batch, " T", c.tokens, " heads ", c.heads, "x", c.head_dim, c.causal ? " causal" : "",
                     c.masked ? " masked" : "", " range ", c.range));
    const AttentionGeometry g{c.batch, c.tokens, c.heads, c.head_dim, c.causal};
    const Shape s{c.batch, c.tokens, g.features()}, ps{c.batch, c.heads, c.tokens, c.tokens};
    Rng rng(31);
    Tensor q = random_tensor(s, rng, -c.range, c.range), k = random_tensor(s, rng, -c.range, c.range);
    Tensor v = random_tensor(s, rng), dout = random_tensor(s, rng);
    // Sample 0 keeps a random prefix of at least one token; the last sample keeps none.
    Tensor mask = Tensor::zeros({c.batch, c.tokens});
    for (int64_t t = 0; t < c.tokens; ++t) mask[t] = t <= static_cast<int64_t>(rng.below(static_cast<uint64_t>(c.tokens))) ? 1.0f : 0.0f;
    mask[0] = 1.0f;
    for (int64_t n = 1; n + 1 < c.batch; ++n)
      for (int64_t t = 0; t < c.tokens; ++t) mask[n * c.tokens + t] = (t % 3 != 1) ? 1.0f : 0.0f;
    const float* m = c.masked ? mask.data() : nullptr;
    auto r = b.reference->attention(g);
    auto t = b.tested->attention(g);
    Tensor want = nan_tensor(s), got = nan_tensor(s), want_p = nan_tensor(ps), got_p = nan_tensor(ps);
    r->forward(q.data(), k.data(), v.data(), m, want.data(), want_p.data());
    t->forward(q.data(), k.data(), v.data(), m, got.data(), got_p.data());
    expect_close(got.data(), want.data(), want.numel(), "forward", 1e-4f);
    expect_close(got_p.data(), want_p.data(), want_p.numel(), "probabilities", 1e-3f);
    if (c.masked && c.batch > 1) {
      const int64_t last = (c.batch - 1) * c.tokens * g.features();
      for (int64_t i = 0; i < c.tokens * g.features(); ++i) ASSERT_EQ(got[last + i], 0.0f) << "fully masked sample, " << i;
    }
    for (int which = -1; which < 3; ++which) {  // all three gradients, then each alone
      Tensor want_d[3] = {nan_tensor(s), nan_tensor(s), nan_tensor(s)}, got_d[3] = {nan_tensor(s), nan_tensor(s), nan_tensor(s)};
      auto ptr = [&](Tensor* d, int i) { return which < 0 || which == i ? d[i].data() : nullptr; };
      r->backward(q.data(), k.data(), v.data(), want_p.data(), dout.data(), ptr(want_d, 0), ptr(want_d, 1), ptr(want_d, 2));
      t->backward(q.data(), k.data(), v.data(), got_p.data(), dout.data(), ptr(got_d, 0), ptr(got_d, 1), ptr(got_d, 2));
      const char* names[3] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i)
        if (which < 0 || which == i) expect_close(got_d[i].data(), want_d[i].data(), want_d[i].numel(), names[i], 2e-3f);
    }
  }
}

TEST(Softmax, ForwardBackward) {
  Backends b;
  for (const auto& [rows, channels] : {std::pair<int64_t, int64_t>{1, 10}, {7, 3}, {64, 1000}}) {
    Rng rng(10);
    Tensor x = random_tensor({rows, channels}, rng, -6.0f, 6.0f), dy = random_tensor({rows, channels}, rng);
    Tensor want_y = nan_tensor(x.shape()), got_y = nan_tensor(x.shape());
    Tensor want_dx = nan_tensor(x.shape()), got_dx = nan_tensor(x.shape());
    auto r = b.reference->softmax(rows, channels);
    auto t = b.tested->softmax(rows, channels);
    r->forward(x.data(), want_y.data());
    t->forward(x.data(), got_y.data());
    r->backward(want_y.data(), dy.data(), want_dx.data());
    t->backward(want_y.data(), dy.data(), got_dx.data());
    expect_close(got_y.data(), want_y.data(), want_y.numel(), "forward");
    expect_close(got_dx.data(), want_dx.data(), want_dx.numel(), "backward");
  }
}

TEST(GlobalAvgPool, ForwardBackward) {
  Backends b;
  for (const GlobalPoolGeometry g : {GlobalPoolGeometry{2, 5, 3, 7}, GlobalPoolGeometry{4, 7, 7, 64}, GlobalPoolGeometry{1, 1, 1, 3}}) {
    SCOPED_TRACE(g.str());
    Rng rng(8);
    Tensor x = random_tensor({g.batch, g.in_h, g.in_w, g.channels}, rng), dy = random_tensor({g.batch, g.channels}, rng);
    Tensor want_y = nan_tensor(dy.shape()), got_y = nan_tensor(dy.shape());
    Tensor want_dx = nan_tensor(x.shape()), got_dx = nan_tensor(x.shape());
    auto r = b.reference->global_avg_pool(g);
    auto t = b.tested->global_avg_pool(g);
    r->forward(x.data(), want_y.data());
    t->forward(x.data(), got_y.data());
    r->backward(dy.data(), want_dx.data());
    t->backward(dy.data(), got_dx.data());
    expect_close(got_y.data(), want_y.data(), want_y.numel(), "forward");
    expect_close(got_dx.data(), want_dx.data(), want_dx.numel(), "backward");
  }
}

TEST(Relu, ForwardBackward) {
  Backends b;
  Rng rng(5);
  for (int64_t n : {1, 7, 1000}) {
    Tensor x = random_tensor({n}, rng), dy = random_tensor({n}, rng);
    x[0] = 0.0f;  // the kink: both sides use y > 0
    Tensor want_y = nan_tensor({n}), got_y = nan_tensor({n}), want_dx = nan_tensor({n}), got_dx = nan_tensor({n});
    auto r = b.reference->relu(n);
    auto t = b.tested->relu(n);
    r->forward(x.data(), want_y.data());
    t->forward(x.data(), got_y.data());
    r->backward(want_y.data(), dy.data(), want_dx.data());
    t->backward(got_y.data(), dy.data(), got_dx.data());
    expect_close(got_y.data(), want_y.data(), n, "relu forward", 0.0f);
    expect_close(got_dx.data(), want_dx.data(), n, "relu backward", 0.0f);
  }
}

TEST(AvgPool2d, Tiled2x2) { AvgPool2dTester().batch(2).input(8, 6, 5).kernel(2, 2).stride(2, 2).test(); }
TEST(AvgPool2d, Overlapping3x3Stride1) { AvgPool2dTester().batch(2).input(7, 6, 4).kernel(3, 3).stride(1, 1).test(); }
TEST(AvgPool2d, Padded3x3Stride2) { AvgPool2dTester().batch(3).input(9, 7, 3).kernel(3, 3).stride(2, 2).padding(1, 1).test(); }
TEST(AvgPool2d, OneByOne) { AvgPool2dTester().batch(2).input(4, 4, 3).kernel(1, 1).stride(2, 2).test(); }
// PyTorch's count_include_pad: a 2x2 window over a padded 2x2 image of ones divides by 4.
TEST(AvgPool2d, PaddingCountsAsZerosLikePyTorch) {
  Backends b;
  Pool2dGeometry g;
  g.in_h = g.in_w = 2;
  g.kernel_h = g.kernel_w = 2;
  g.pad_h = g.pad_w = 1;
  for (Backend* backend : {b.reference.get(), b.tested.get()}) {
    Tensor x = Tensor::empty({1, 2, 2, 1}), y = nan_tensor({1, 3, 3, 1});
    x.fill(1.0f);
    backend->avg_pool2d(g)->forward(x.data(), y.data());
    const float want[9] = {0.25f, 0.5f, 0.25f, 0.5f, 1.0f, 0.5f, 0.25f, 0.5f, 0.25f};
    expect_close(y.data(), want, 9, std::string(backend->name()), 1e-6f);
  }
}
TEST(MaxPool2d, Tiled2x2) { MaxPool2dTester().batch(2).input(8, 6, 5).kernel(2, 2).stride(2, 2).test(); }
TEST(MaxPool2d, FashionMnistShapes) { MaxPool2dTester().batch(4).input(28, 28, 32).kernel(2, 2).stride(2, 2).test(); }
TEST(MaxPool2d, Overlapping3x3Stride2Pad1) { MaxPool2dTester().batch(2).input(9, 7, 3).kernel(3, 3).stride(2, 2).padding(1, 1).test(); }
// 2x2 (xnnpack: the vectorised kernel, 16 channels a vector plus a tail) and tiled 3x3
// (XNNPACK's argmax pooling, ties moved to row order) on values with ties.
TEST(MaxPool2d, Ties2x2) { MaxPool2dTester().batch(2).input(6, 8, 20).kernel(2, 2).stride(2, 2).ties(true).test(); }
TEST(MaxPool2d, Ties3x3Tiled) { MaxPool2dTester().batch(2).input(9, 6, 5).kernel(3, 3).stride(3, 3).ties(true).test(); }
TEST(MaxPool2d, RaggedEdge) { MaxPool2dTester().batch(1).input(7, 7, 4).kernel(2, 2).stride(2, 2).test(); }

// Every backend of this build with its own kernel for an op the CPU backends share with the
// reference has that op's test registered (own_kernel_backends, passed in by CMake), and no
// other backend has: a backend that gains a kernel of its own fails here until its op test is
// registered. A backend that cannot be made here (cuda without a GPU) is named and left out.
TEST(OwnKernels, EachHasItsOpTest) {
  const std::string listed = "," TANDEM_OWN_KERNEL_BACKENDS ",";
  std::unique_ptr<Backend> reference = make_reference_backend({});
  int checked = 0;
  for (const std::string& name : backend_names()) {
    if (name == "reference") continue;
    std::unique_ptr<Backend> backend;
    try {
      backend = make_backend(name);
    } catch (const Error& e) {
      std::printf("%s left out: %s\n", name.c_str(), e.what());
      continue;
    }
    const bool registered = listed.find("," + name + ",") != std::string::npos;
    for (const char* op : kSharedKernelOps)
      EXPECT_EQ(has_own_kernel(*backend, *reference, op), registered)
          << name << "'s " << op << (registered ? " is the reference's own, yet its op test is registered"
                                                : " is its own kernel, yet its op test is not registered")
          << " (own_kernel_backends in tests/CMakeLists.txt)";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace tandem::test
