// The order the edge reads training samples in: each epoch a fresh permutation of the whole
// set drawn from (seed, epoch) alone, so a position (epoch, samples consumed) is all a
// checkpoint needs to resume mid-epoch exactly where the run stopped.
#pragma once

#include <algorithm>
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

// With length buckets (InputSpec::length_buckets), batches of samples of like length, as
// torchtext's bucket iterator and Hugging Face's group_by_length: the epoch's order cut into
// megabatches of kLengthGroupBatches batches, each sorted by length (ties keep their order),
// then its whole batches shuffled. A batch then runs at the bucket of its own longest sample
// instead of nearly always at the longest one; which samples meet in a megabatch stays
// random, and the shuffle keeps an epoch from going from long to short samples (measured on
// spam-bert: 1536 mails sorted but not shuffled lost 4 points of accuracy). A function of
// the order, the lengths and `seed` alone, so a checkpoint's (epoch, cursor) resumes exactly.
inline constexpr int64_t kLengthGroupBatches = 50;

inline void group_by_length(std::vector<int64_t>& order, const std::vector<int32_t>& lengths, int64_t batch,
                            uint64_t seed) {
  batch = std::max<int64_t>(1, batch);
  const auto mega = static_cast<std::ptrdiff_t>(batch * kLengthGroupBatches);
  Rng rng(seed ^ 0x1e9ULL);
  for (auto first = order.begin(); first != order.end();) {
    const auto last = order.end() - first > mega ? first + mega : order.end();
    std::stable_sort(first, last, [&](int64_t a, int64_t b) {
      return lengths[static_cast<std::size_t>(a)] > lengths[static_cast<std::size_t>(b)];
    });
    // Fisher-Yates over the whole batches (a partial one at the epoch's end stays last).
    const int64_t blocks = (last - first) / batch;
    for (int64_t i = blocks - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
      if (j != i) std::swap_ranges(first + i * batch, first + (i + 1) * batch, first + j * batch);
    }
    first = last;
  }
}

}  // namespace tandem
