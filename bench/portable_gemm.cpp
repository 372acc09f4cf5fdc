// The portable GEMM (backends/simd/gemm.h) timed on the shapes the browser edge's Fashion-MNIST
// front runs (im2col convolutions and linear layers), in GFLOP/s, median of repeats. Built
// natively and with em++ -msimd128 (run under node); bench/wasm_gemm.sh prints the ratio.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "backends/simd/gemm.h"

int main() {
  struct Shape {
    const char* what;
    long m, n, k;
  };
  const Shape shapes[] = {{"conv1 im2col 16x28x28 x 32 x 9", 16 * 784, 32, 9},
                          {"conv2 im2col 16x14x14 x 64 x 288", 16 * 196, 64, 288},
                          {"square 256", 256, 256, 256},
                          {"linear 16 x 128 x 3136", 16, 128, 3136}};
  double total_flops = 0, total_s = 0;
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)), c(static_cast<size_t>(s.m * s.n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 17) * 0.01f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 13) * 0.02f;
    const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const int reps = std::max(3, static_cast<int>(4e8 / flops));
    std::vector<double> times;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) tandem::simd::gemm(s.m, s.n, s.k, a.data(), s.k, b.data(), s.n, c.data(), s.n, false);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    total_flops += flops;
    total_s += t;
    std::printf("{\"shape\":\"%s\",\"gflops\":%.3f,\"checksum\":%.6g}\n", s.what, flops / t * 1e-9, static_cast<double>(c[7]));
  }
  std::printf("{\"shape\":\"all\",\"gflops\":%.3f}\n", total_flops / total_s * 1e-9);
  return 0;
}
