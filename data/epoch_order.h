// The order the edge reads training samples in: each epoch a fresh permutation of the whole
// set drawn from (seed, epoch) alone, so a position (epoch, samples consumed) is all a
// checkpoint needs to resume mid-epoch exactly where the run stopped.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "core/random.h"

namespace tandem {

inline std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed ^ 0x5eedULL ^ (static_cast<uint64_t>(epoch) * 0x9e3779b97f4a7c15ULL));
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<std::size_t>(i)], order[rng.below(static_cast<uint64_t>(i + 1))]);
  return order;
}

}  // namespace tandem
