// bench/layer_norm: LayerNorm forward + backward (input and parameter gradients) per backend,
// one thread, on transformer shapes: the median seconds of one pass over [rows, features].
// bench/op_vs_pytorch.sh layer_norm prints these beside torch.nn.LayerNorm's on the same shapes
// (bench/pytorch_layer_norm.py) measured in the same run.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/registry.h"
#include "bench/bench_util.h"
#include "core/backend.h"

int main(int argc, char** argv) {
  using namespace tandem;
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 21;
  struct Shape2 {
    int64_t rows, features;
  };
  Rng rng(5);
  for (const Shape2 s : {Shape2{64 * 128, 256}, Shape2{16 * 128, 768}}) {
    const LayerNormGeometry g{s.rows, s.features, 1e-12f};
    const Shape data{s.rows, s.features}, param{s.features};
    const Tensor x = bench::random(data, rng), dy = bench::random(data, rng), gamma = bench::random(param, rng),
                 beta = bench::random(param, rng);
    Tensor y = Tensor::empty(data), dx = Tensor::empty(data), dg = Tensor::empty(param), db = Tensor::empty(param),
           stats = Tensor::empty({2 * s.rows});
    for (const std::string& name : backend_names()) {
      auto backend = make_backend(name, BackendOptions{1});
      auto k = backend->layer_norm(g);
      const double fwd = bench::median_seconds(
          [&] { k->forward(x.data(), gamma.data(), beta.data(), y.data(), stats.data(), stats.data() + s.rows); }, reps);
      const double bwd = bench::median_seconds(
          [&] {
            k->backward(x.data(), dy.data(), gamma.data(), stats.data(), stats.data() + s.rows, dx.data(), dg.data(),
                        db.data());
          },
          reps);
      std::printf("{\"bench\":\"layer_norm\",\"backend\":\"%s\",\"shape\":\"%lldx%lld\",\"forward_ms\":%.4f,"
                  "\"backward_ms\":%.4f,\"total_ms\":%.4f}\n",
                  name.c_str(), static_cast<long long>(s.rows), static_cast<long long>(s.features), fwd * 1e3, bwd * 1e3,
                  (fwd + bwd) * 1e3);
    }
  }
  return 0;
}
