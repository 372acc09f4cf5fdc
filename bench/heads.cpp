// bench/heads: N heads (each Linear F->H, ReLU, Linear H->O on the same input) trained one
// step (forward, backward data and weights) as one call per layer (a Linear F->N*H, one ReLU,
// a grouped linear of N x (H->O)) against the loop of N separate heads, on each backend
// that has the grouped kernel, for N = 1, 8, 128. Prints times and the ratio.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bench/bench_util.h"
#include "core/backend.h"
#include "core/error.h"
#include "tools/all_backends.h"

namespace tandem {
namespace {

int64_t kBatch = 64, kFeatures = 256, kHidden = 64, kOut = 10;  // bench_heads [reps [F H O]]

// One training step of Linear F -> n*H, ReLU and a second layer: a grouped linear of
// n x (H -> O) (the batched heads), or for one head as a user would write it, Linear H -> O.
// Both kernels take the same calls.
template <typename SecondKernel>
struct TwoLayers {
  std::unique_ptr<LinearKernel> first;
  std::unique_ptr<ReluKernel> relu;
  std::unique_ptr<SecondKernel> second;
  Tensor w1, b1, w2, b2, h, a, y, dy, da, dh, dx, dw1, db1, dw2, db2;
  TwoLayers(Backend& be, int64_t n, std::unique_ptr<SecondKernel> second_kernel, const Shape& w2_shape, Rng& rng)
      : first(be.linear({kBatch, kFeatures, n * kHidden, true})), relu(be.relu(kBatch * n * kHidden)),
        second(std::move(second_kernel)) {
    w1 = bench::random({n * kHidden, kFeatures}, rng), b1 = bench::random({n * kHidden}, rng);
    w2 = bench::random(w2_shape, rng), b2 = bench::random({n * kOut}, rng);
    h = Tensor::empty({kBatch, n * kHidden}), a = Tensor::empty(h.shape()), y = Tensor::empty({kBatch, n * kOut});
    dy = bench::random(y.shape(), rng), da = Tensor::empty(h.shape()), dh = Tensor::empty(h.shape());
    dx = Tensor::empty({kBatch, kFeatures}), dw1 = Tensor::empty(w1.shape()), db1 = Tensor::empty(b1.shape());
    dw2 = Tensor::empty(w2.shape()), db2 = Tensor::empty(b2.shape());
  }
  void step(const Tensor& x) {
    const WeightsView v1{w1.data(), b1.data(), 1}, v2{w2.data(), b2.data(), 1};
    first->forward(x.data(), v1, h.data());
    relu->forward(h.data(), a.data());
    second->forward(a.data(), v2, y.data());
    second->backward_data(dy.data(), v2, da.data());
    second->backward_weights(a.data(), dy.data(), dw2.data(), db2.data());
    relu->backward(a.data(), da.data(), dh.data());
    first->backward_data(dh.data(), v1, dx.data());
    first->backward_weights(x.data(), dh.data(), dw1.data(), db1.data());
  }
};

// N heads as three calls a pass.
struct Batched : TwoLayers<GroupedLinearKernel> {
  Batched(Backend& be, int64_t n, Rng& rng)
      : TwoLayers(be, n, be.grouped_linear({kBatch, n, kHidden, kOut, true}), Shape{n, kOut, kHidden}, rng) {}
};

// One head: Linear, ReLU, Linear.
struct Head : TwoLayers<LinearKernel> {
  Head(Backend& be, Rng& rng) : TwoLayers(be, 1, be.linear({kBatch, kHidden, kOut, true}), Shape{kOut, kHidden}, rng) {}
};

// The same N heads, one at a time; their input gradients summed.
struct Looped {
  std::vector<std::unique_ptr<Head>> heads;
  Tensor dx_sum = Tensor::empty({kBatch, kFeatures});
  Looped(Backend& be, int64_t n, Rng& rng) {
    for (int64_t i = 0; i < n; ++i) heads.push_back(std::make_unique<Head>(be, rng));
  }
  void step(const Tensor& x) {
    dx_sum.fill(0.0f);
    for (auto& h : heads) {
      h->step(x);
      float* s = dx_sum.data();
      const float* d = h->dx.data();
      for (int64_t i = 0; i < dx_sum.numel(); ++i) s[i] += d[i];
    }
  }
};

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 11;
  if (argc > 4) {
    kFeatures = std::atoi(argv[2]);
    kHidden = std::atoi(argv[3]);
    kOut = std::atoi(argv[4]);
  }
  register_built_backends();
  Rng rng(3);
  const Tensor x = bench::random({kBatch, kFeatures}, rng);
  std::printf("heads: batch %lld, %lld features -> %lld hidden (ReLU) -> %lld outputs each; one step (forward, "
              "backward data and weights), median of %d\n",
              static_cast<long long>(kBatch), static_cast<long long>(kFeatures), static_cast<long long>(kHidden),
              static_cast<long long>(kOut), reps);
  std::printf("%-10s %5s %14s %14s %8s\n", "backend", "N", "one call ms", "loop ms", "ratio");
  bool met = true, measured = false;
  for (const std::string& name : backend_names()) {
    auto be = make_backend(name, BackendOptions{1});
    try {
      (void)be->grouped_linear({1, 1, 1, 1, true});
    } catch (const Error& e) {
      std::printf("%-10s skipped: %s\n", name.c_str(), e.what());
      continue;
    }
    for (int64_t n : {1, 8, 128}) {
      if (name == "reference" && n > 8) continue;  // the oracle is slow and not the point
      Batched batched(*be, n, rng);
      Looped looped(*be, n, rng);
      const double one = bench::median_seconds([&] { batched.step(x); }, reps);
      const double loop = bench::median_seconds([&] { looped.step(x); }, reps);
      std::printf("%-10s %5lld %14.3f %14.3f %7.1fx\n", name.c_str(), static_cast<long long>(n), one * 1e3, loop * 1e3,
                  loop / one);
      std::printf("{\"bench\":\"heads\",\"backend\":\"%s\",\"heads\":%lld,\"batched_s\":%.6f,\"loop_s\":%.6f}\n",
                  name.c_str(), static_cast<long long>(n), one, loop);
      if (name == "onednn" && n == 128) {
        measured = true;
        met = loop / one >= 5.0;
      }
    }
  }
  std::printf("bar (onednn, N = 128, one call >= 5x the loop): %s\n",
              measured ? (met ? "met" : "MISSED") : "not measured (no onednn in this build)");
  return met ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  setenv("OMP_NUM_THREADS", "1", 0);
  try {
    return tandem::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_heads: %s\n", e.what());
    return 1;
  }
}
