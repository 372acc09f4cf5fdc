// The tightest GEMM this machine runs on one thread (oneDNN's sgemm on a few squares), the
// peak the benchmarks quote their figures against; 0 in a build without oneDNN.
#pragma once

#include <algorithm>

#include "bench/bench_util.h"

#ifdef TANDEM_HAVE_ONEDNN
#include <dnnl.h>
#include <omp.h>
#endif

namespace tandem::bench {

// Rows are padded off 4 KiB strides, which alias in cache. One OpenMP thread whatever the
// caller's setting (OMP_NUM_THREADS set in main() comes too late once a static initialiser
// has started OpenMP).
inline double gemm_peak_gflops(int reps) {
#ifdef TANDEM_HAVE_ONEDNN
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  double best = 0.0;
  for (int64_t n : {512, 1000, 1024}) {
    const int64_t ld = n % 256 == 0 ? n + 16 : n;
    Rng rng(1);
    Tensor a = random({n, ld}, rng), b = random({n, ld}, rng), c = Tensor::zeros({n, ld});
    const double s = median_seconds(
        [&] { dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), ld, b.data(), ld, 0.0f, c.data(), ld); }, reps);
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s * 1e-9);
  }
  omp_set_num_threads(threads);
  return best;
#else
  (void)reps;
  return 0.0;
#endif
}

}  // namespace tandem::bench
