// Helpers shared by the C++ benchmarks: the median time of repeated calls, random tensors and a
// back shard's random inputs.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/random.h"
#include "core/tensor.h"

namespace tandem::bench {

// The value after `--name` among argv[2..] (argv[1] is the spec), else `fallback`.
inline std::string option(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 2; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) return argv[i + 1];
  return fallback;
}

// Median seconds of `reps` calls after one warm-up call.
inline double median_seconds(const std::function<void()>& f, int reps) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<std::size_t>(reps / 2)];
}

inline Tensor random(const Shape& s, Rng& rng) {
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = rng.uniform(-1.0f, 1.0f);
  return t;
}

// What a back shard reads for `rows` samples, as an edge would send it: the cut's activations
// at random, a mask that crosses with them keeping every token, integer inputs 0.
inline std::vector<Tensor> back_shard_inputs(const Graph& back, int64_t rows, Rng& rng) {
  std::vector<Tensor> inputs;
  for (const GraphInput& in : back.inputs()) {
    inputs.push_back(random(in.shape.batched(rows), rng));
    if (in.mask || in.integer) inputs.back().fill(in.mask ? 1.0f : 0.0f);
  }
  return inputs;
}

// Labels in [0, classes) at random.
inline std::vector<int32_t> random_labels(int64_t count, int64_t classes, Rng& rng) {
  std::vector<int32_t> labels(static_cast<std::size_t>(count));
  for (auto& l : labels) l = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(classes));
  return labels;
}

}  // namespace tandem::bench
