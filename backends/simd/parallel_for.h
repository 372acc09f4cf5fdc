// How a core kernel spreads independent pieces of work over a backend's threads without
// knowing its thread pool: the backend hands over a ParallelFor and its thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace tandem::simd {

// Runs body(i) for every i in [0, count), in any order and on any threads, returning when
// all are done.
using ParallelFor = std::function<void(int64_t count, const std::function<void(int64_t)>& body)>;

// body(0) .. body(count - 1) through parallel_for when there is one and more than one piece,
// else in order on the caller's thread.
inline void run_pieces(const ParallelFor& parallel_for, int64_t count, const std::function<void(int64_t)>& body) {
  if (count > 1 && parallel_for) return parallel_for(count, body);
  for (int64_t i = 0; i < count; ++i) body(i);
}

}  // namespace tandem::simd
