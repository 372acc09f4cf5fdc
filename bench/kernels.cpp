// bench/kernels: GFLOP/s of Linear and Conv2d forward, backward-data and backward-weights on
// every backend of this build, one thread, beside a tight GEMM peak (oneDNN's sgemm on a
// few squares) measured in the same run, so each figure reads as a share of peak.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/random.h"
#include "core/tensor.h"
#include "bench/bench_util.h"
#include "bench/gemm_peak.h"
#include "backends/registry.h"


namespace tandem {
namespace {

using bench::median_seconds;
using bench::gemm_peak_gflops;
using bench::random;

struct Row {
  std::string backend, op, pass;
  double gflops;
  double bar;
};

template <typename Kernel, typename Geometry>
void bench_weighted(Kernel& k, const Geometry& g, const std::string& backend, const std::string& op,
                    const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, double bar, int reps,
                    std::vector<Row>& rows) {
  Tensor y = Tensor::empty(dy.shape()), dx = Tensor::empty(x.shape()), dw = Tensor::empty(w.shape()),
         db = Tensor::empty(b.shape());
  const WeightsView view{w.data(), b.data(), 1};  // one version: as within a training step
  const double flops = g.flops();
  rows.push_back({backend, op, "forward", flops / median_seconds([&] { k.forward(x.data(), view, y.data()); }, reps) * 1e-9, bar});
  rows.push_back({backend, op, "backward_data",
                  flops / median_seconds([&] { k.backward_data(dy.data(), view, dx.data()); }, reps) * 1e-9, bar});
  rows.push_back({backend, op, "backward_weights",
                  flops / median_seconds([&] { k.backward_weights(x.data(), dy.data(), dw.data(), db.data()); }, reps) * 1e-9,
                  bar});
}

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 21;
  Rng rng(7);

  LinearGeometry lin{256, 784, 512, true};
  Conv2dGeometry conv;
  conv.batch = 64;
  conv.in_h = conv.in_w = 14;
  conv.in_c = 32;
  conv.out_c = 64;
  conv.kernel_h = conv.kernel_w = 3;
  conv.pad_h = conv.pad_w = 1;

  Tensor lx = random({lin.batch, lin.in_features}, rng), lw = random({lin.out_features, lin.in_features}, rng),
         lb = random({lin.out_features}, rng), ldy = random({lin.batch, lin.out_features}, rng);
  Tensor cx = random({conv.batch, conv.in_h, conv.in_w, conv.in_c}, rng),
         cw = random({conv.out_c, conv.kernel_h, conv.kernel_w, conv.in_c}, rng), cb = random({conv.out_c}, rng),
         cdy = random({conv.batch, conv.out_h(), conv.out_w(), conv.out_c}, rng);

  const double peak = gemm_peak_gflops(reps);
  std::vector<Row> rows;
  for (const std::string& name : backend_names()) {
    auto backend = make_backend(name, BackendOptions{1});
    const int r = name == "reference" ? 3 : reps;  // the oracle is slow; a few runs suffice
    // The core-engine issue's bars are for the edge's and the cloud's kernels; the reference
    // and the portable backend (the browser's, measured in bench/wasm_gemm.sh) have none.
    const bool barred = name == "xnnpack" || name == "onednn";
    auto lk = backend->linear(lin);
    bench_weighted(*lk, lin, name, "linear 256x784->512", lx, lw, lb, ldy, barred ? 60 : 0, r, rows);
    auto ck = backend->conv2d(conv);
    bench_weighted(*ck, conv, name, "conv2d 3x3 32->64 64x14x14", cx, cw, cb, cdy, barred ? 40 : 0, r, rows);
  }
  const double gemm_peak = peak;
  const double again = gemm_peak_gflops(reps);  // measured twice: the spread shows the noise
  std::printf("tight GEMM peak (best oneDNN sgemm of 512^3, 1000^3, 1024^3, 1 thread): %.1f GFLOP/s (again after the kernels: %.1f)\n",
              gemm_peak, again);
  std::printf("%-10s %-28s %-17s %9s %8s %6s\n", "backend", "op", "pass", "GFLOP/s", "of peak", "bar");
  bool ok = true;
  for (const Row& r : rows) {
    const bool pass = r.bar == 0 || r.gflops >= r.bar;
    ok = ok && pass;
    std::printf("%-10s %-28s %-17s %9.1f %7.0f%% %6s\n", r.backend.c_str(), r.op.c_str(), r.pass.c_str(), r.gflops,
                gemm_peak > 0 ? 100.0 * r.gflops / gemm_peak : 0.0,
                r.bar == 0 ? "-" : (pass ? ">=" + std::to_string(static_cast<int>(r.bar)) : "MISS").c_str());
  }
  for (const Row& r : rows)
    std::printf("{\"bench\":\"kernels\",\"backend\":\"%s\",\"op\":\"%s\",\"pass\":\"%s\",\"gflops\":%.2f,\"peak_gflops\":%.2f}\n",
                r.backend.c_str(), r.op.c_str(), r.pass.c_str(), r.gflops, gemm_peak);
  std::printf("bars (>= 60 GFLOP/s linear, >= 40 GFLOP/s conv2d, each pass, xnnpack and onednn): %s\n",
              ok ? "all met" : "some MISSED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  setenv("OMP_NUM_THREADS", "1", 0);  // one thread for oneDNN's OpenMP runtime, before it starts
  return tandem::run(argc, argv);
}
