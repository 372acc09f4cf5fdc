// Helpers shared by the C++ benchmarks: the median time of repeated calls and random tensors.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace tandem::bench {

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

}  // namespace tandem::bench
