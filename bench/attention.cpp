// bench/attention: multi-head attention forward + backward (query, key and value gradients)
// per backend, one thread, with a key padding mask: the median seconds of one pass. Shapes:
// spam-bert's (8 sequences of 128 tokens, 4 heads of 64) and BERT-base's (4 x 128, 12 x 64).
// bench/attention.sh prints these beside PyTorch's eager attention (Hugging Face's
// BertSelfAttention core, bench/pytorch_attention.py) measured in the same run.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/registry.h"
#include "bench/bench_util.h"
#include "core/backend.h"

int main(int argc, char** argv) {
  using namespace tandem;
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 21;
  Rng rng(7);
  for (const AttentionGeometry g : {AttentionGeometry{8, 128, 4, 64, false}, AttentionGeometry{4, 128, 12, 64, false}}) {
    const Shape s{g.batch, g.tokens, g.features()};
    const Tensor q = bench::random(s, rng), k = bench::random(s, rng), v = bench::random(s, rng),
                 dout = bench::random(s, rng);
    Tensor mask = Tensor::empty({g.batch, g.tokens});
    for (int64_t b = 0; b < g.batch; ++b)  // sequence b keeps its first 128 - 12 b tokens
      for (int64_t t = 0; t < g.tokens; ++t) mask[b * g.tokens + t] = t < g.tokens - 12 * b ? 1.0f : 0.0f;
    Tensor out = Tensor::empty(s), dq = Tensor::empty(s), dk = Tensor::empty(s), dv = Tensor::empty(s),
           probs = Tensor::empty({g.batch, g.heads, g.tokens, g.tokens});
    for (const std::string& name : backend_names()) {
      if (name == "reference") continue;  // double loops: the oracle, not a contender
      auto backend = make_backend(name, BackendOptions{1});
      auto kernel = backend->attention(g);
      const double fwd = bench::median_seconds(
          [&] { kernel->forward(q.data(), k.data(), v.data(), mask.data(), out.data(), probs.data()); }, reps);
      const double bwd = bench::median_seconds(
          [&] {
            kernel->backward(q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(), dk.data(), dv.data());
          },
          reps);
      std::printf("{\"bench\":\"attention\",\"backend\":\"%s\",\"shape\":\"%lldx%lld h%lldx%lld\",\"forward_ms\":%.4f,"
                  "\"backward_ms\":%.4f,\"total_ms\":%.4f}\n",
                  name.c_str(), static_cast<long long>(g.batch), static_cast<long long>(g.tokens),
                  static_cast<long long>(g.heads), static_cast<long long>(g.head_dim), fwd * 1e3, bwd * 1e3,
                  (fwd + bwd) * 1e3);
    }
  }
  return 0;
}
