// bench/heads: N heads (each Linear F->H, ReLU, Linear H->O on the same input) trained one
// step as one call per layer (a Linear F->N*H, one ReLU, a grouped linear of N x (H->O))
// against the loop of N separate heads, N = 1, 8, 128: as kernels, and as models (a heads
// node against N branches and a concat, with the optimizer). Each ratio is printed beside its
// ceiling: the loop's time over the step's multiply-adds at this machine's GEMM peak.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gemm_peak.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "backends/registry.h"

namespace tandem {
namespace {

struct Options {
  int reps = 11;
  int64_t batch = 64, features = 256, hidden = 64, out = 10;
  int threads = 1;
};
Options opt;

// Multiply-adds x 2 of one training step of n heads (forward, backward data and weights).
double step_flops(int64_t n) {
  return 3.0 * 2.0 * static_cast<double>(opt.batch * n * opt.hidden * (opt.features + opt.out));
}

// One training step of Linear F -> n*H, ReLU and a second layer: a grouped linear of
// n x (H -> O) (the batched heads), or for one head as a user would write it, Linear H -> O.
// Both kernels take the same calls.
template <typename SecondKernel>
struct TwoLayers {
  std::unique_ptr<LinearKernel> first;
  std::unique_ptr<ReluKernel> relu;
  std::unique_ptr<SecondKernel> second;
  Tensor w1, b1, w2, b2, h, a, y, dy, da, dh, dx, dw1, db1, dw2, db2;
  uint64_t version = 0;  // a new one each step, as after an optimizer step: no cached weight layouts
  TwoLayers(Backend& be, int64_t n, std::unique_ptr<SecondKernel> second_kernel, const Shape& w2_shape, Rng& rng)
      : first(be.linear({opt.batch, opt.features, n * opt.hidden, true})),
        relu(be.relu(opt.batch * n * opt.hidden)),
        second(std::move(second_kernel)) {
    w1 = bench::random({n * opt.hidden, opt.features}, rng), b1 = bench::random({n * opt.hidden}, rng);
    w2 = bench::random(w2_shape, rng), b2 = bench::random({n * opt.out}, rng);
    // Every buffer holds numbers before the first call: uninitialised memory can hold
    // denormals, which ran oneDNN's GEMMs here at half speed.
    h = Tensor::zeros({opt.batch, n * opt.hidden}), a = Tensor::zeros(h.shape()),
    y = Tensor::zeros({opt.batch, n * opt.out});
    dy = bench::random(y.shape(), rng), da = Tensor::zeros(h.shape()), dh = Tensor::zeros(h.shape());
    dx = Tensor::zeros({opt.batch, opt.features}), dw1 = Tensor::zeros(w1.shape()), db1 = Tensor::zeros(b1.shape());
    dw2 = Tensor::zeros(w2.shape()), db2 = Tensor::zeros(b2.shape());
  }
  void step(const Tensor& x) {
    ++version;
    const WeightsView v1{w1.data(), b1.data(), version}, v2{w2.data(), b2.data(), version};
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
      : TwoLayers(be, n, be.grouped_linear({opt.batch, n, opt.hidden, opt.out, true}), Shape{n, opt.out, opt.hidden},
                  rng) {}
};

// One head: Linear, ReLU, Linear.
struct Head : TwoLayers<LinearKernel> {
  Head(Backend& be, Rng& rng)
      : TwoLayers(be, 1, be.linear({opt.batch, opt.hidden, opt.out, true}), Shape{opt.out, opt.hidden}, rng) {}
};

// The same N heads, one at a time; their input gradients summed.
struct Looped {
  std::vector<std::unique_ptr<Head>> heads;
  Tensor dx_sum = Tensor::zeros({opt.batch, opt.features});
  Looped(Backend& be, int64_t n, Rng& rng) {
    for (int64_t i = 0; i < n; ++i) heads.push_back(std::make_unique<Head>(be, rng));
  }
  void step(const Tensor& x) {
    float* s = dx_sum.data();
    const int64_t count = dx_sum.numel();
    std::fill_n(s, count, 0.0f);
    for (auto& h : heads) {
      h->step(x);
      const float* d = h->dx.data();
      for (int64_t i = 0; i < count; ++i) s[i] += d[i];
    }
  }
};

// Heads as a model: one heads node, or n branches (linear, relu, linear) and a concat. A
// step is zero_grad, forward, backward to the input and an SGD step with momentum.
struct Model {
  Graph graph;
  Network net;
  Sgd sgd;
  Tensor dy;
  static Graph build(int64_t n, bool batched) {
    ModelSpec spec;
    spec.name = "heads";
    spec.inputs = {{"x", Shape{opt.features}}};
    auto node = [&](std::string name, std::string op, std::vector<std::string> in) {
      NodeSpec s;
      s.name = std::move(name), s.op = std::move(op), s.inputs = std::move(in);
      return s;
    };
    if (batched) {
      NodeSpec h = node("heads", "heads", {"x"});
      h.heads = {n, opt.hidden, opt.out};
      spec.nodes.push_back(h);
      spec.output = "heads";
      return Graph::build(spec);
    }
    std::vector<std::string> outs;
    for (int64_t i = 0; i < n; ++i) {
      const std::string id = std::to_string(i);
      NodeSpec l1 = node("fc1_" + id, "linear", {"x"}), l2 = node("fc2_" + id, "linear", {"relu_" + id});
      l1.linear.out_features = opt.hidden, l2.linear.out_features = opt.out;
      spec.nodes.push_back(l1);
      spec.nodes.push_back(node("relu_" + id, "relu", {"fc1_" + id}));
      spec.nodes.push_back(l2);
      outs.push_back("fc2_" + id);
    }
    spec.output = n > 1 ? "all" : outs[0];
    if (n > 1) spec.nodes.push_back(node("all", "concat", outs));
    return Graph::build(spec);
  }
  Model(Backend& be, int64_t n, bool batched, Rng& rng)
      : graph(build(n, batched)),
        net(graph, be, 7),
        sgd(net.params(), OptimizerOptions{0.01f, 0.9f}),
        dy(bench::random({opt.batch, n * opt.out}, rng)) {}
  void step(const Tensor& x) {
    net.zero_grad();
    net.forward(x, 0);
    net.backward(dy, 0, true);
    sgd.step();
  }
};

struct BatchedModel : Model {
  BatchedModel(Backend& be, int64_t n, Rng& rng) : Model(be, n, true, rng) {}
};
struct LoopedModel : Model {
  LoopedModel(Backend& be, int64_t n, Rng& rng) : Model(be, n, false, rng) {}
};

struct Times {
  double one, loop;
};

template <typename One, typename Loop>
Times measure(Backend& be, int64_t n, const Tensor& x, Rng& rng) {
  One one(be, n, rng);
  Loop loop(be, n, rng);
  return {bench::median_seconds([&] { one.step(x); }, opt.reps),
          bench::median_seconds([&] { loop.step(x); }, opt.reps)};
}

void print_row(const char* what, const std::string& backend, int64_t n, const Times& t, double peak) {
  const double ceiling = peak > 0 ? t.loop / (step_flops(n) / (peak * 1e9 * opt.threads)) : 0.0;
  std::printf("%-7s %-10s %5lld %12.3f %12.3f %7.1fx %9.1fx\n", what, backend.c_str(), static_cast<long long>(n),
              t.one * 1e3, t.loop * 1e3, t.loop / t.one, ceiling);
  std::printf(
      "{\"bench\":\"heads\",\"level\":\"%s\",\"backend\":\"%s\",\"heads\":%lld,\"batch\":%lld,\"features\":%lld,"
      "\"hidden\":%lld,\"out\":%lld,\"threads\":%d,\"batched_s\":%.6f,\"loop_s\":%.6f,\"ceiling\":%.2f}\n",
      what, backend.c_str(), static_cast<long long>(n), static_cast<long long>(opt.batch),
      static_cast<long long>(opt.features), static_cast<long long>(opt.hidden), static_cast<long long>(opt.out),
      opt.threads, t.one, t.loop, ceiling);
}

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> const char* {
    if (i + 1 >= argc) fail("bench_heads", cat(argv[i], " needs a value"));
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps") {
      o.reps = std::max(3, std::atoi(value(i)));
    } else if (a == "--batch") {
      o.batch = std::atoll(value(i));
    } else if (a == "--threads") {
      o.threads = std::atoi(value(i));
    } else if (a == "--shape") {
      const char* v = value(i);
      long long f = 0, h = 0, out = 0;
      if (std::sscanf(v, "%lld,%lld,%lld", &f, &h, &out) != 3)
        fail("bench_heads", cat("--shape wants F,H,O (e.g. 256,64,10), got '", v, "'"));
      o.features = f, o.hidden = h, o.out = out;
    } else {
      fail("bench_heads",
           cat("unknown argument '", a, "'; usage: bench_heads [--reps R] [--shape F,H,O] [--batch B] [--threads T]"));
    }
  }
  if (o.batch < 1 || o.features < 1 || o.hidden < 1 || o.out < 1 || o.threads < 1)
    fail("bench_heads", "--batch, --shape and --threads take positive numbers");
  return o;
}

int run(int argc, char** argv) {
  opt = parse(argc, argv);
  Rng rng(3);
  const Tensor x = bench::random({opt.batch, opt.features}, rng);
  const double peak = bench::gemm_peak_gflops(opt.reps);
  std::printf(
      "heads: batch %lld, %lld features -> %lld hidden (ReLU) -> %lld outputs each; one training step, "
      "median of %d; %d thread(s); GEMM peak %.1f GFLOP/s a thread\n",
      static_cast<long long>(opt.batch), static_cast<long long>(opt.features), static_cast<long long>(opt.hidden),
      static_cast<long long>(opt.out), opt.reps, opt.threads, peak);
  std::printf("%-7s %-10s %5s %12s %12s %8s %10s\n", "level", "backend", "N", "one call ms", "loop ms", "ratio",
              "ceiling");
  double bar_ratio = 0.0;
  for (const std::string& name : backend_names()) {
    auto be = make_backend(name, BackendOptions{opt.threads});
    try {
      (void)be->grouped_linear({1, 1, 1, 1, true});
    } catch (const Error& e) {
      std::printf("%-7s %-10s skipped: %s\n", "", name.c_str(), e.what());
      continue;
    }
    for (int64_t n : {1, 8, 128}) {
      if (name == "reference" && n > 8) continue;  // the oracle is slow and not the point
      const Times kernels = measure<Batched, Looped>(*be, n, x, rng);
      print_row("kernels", name, n, kernels, name == "onednn" ? peak : 0.0);
      if (name == "onednn" && n == 128) bar_ratio = kernels.loop / kernels.one;
      if (name != "onednn") continue;
      print_row("model", name, n, measure<BatchedModel, LoopedModel>(*be, n, x, rng), peak);
    }
  }
  std::printf(
      "ceiling: the loop's time over the step's multiply-adds at the GEMM peak (x threads), the most a one-call "
      "version could gain\n");
  std::printf("bar (onednn kernels, N = 128, one call >= 5x the loop): %s\n",
              bar_ratio == 0.0   ? "not measured (no onednn in this build)"
              : bar_ratio >= 5.0 ? "met"
                                 : "MISSED");
  return bar_ratio >= 5.0 ? 0 : 1;
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
