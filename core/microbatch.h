// How a step's batch is cut into K micro-batches: sizes differ by at most one, the larger
// first. Edge, cloud and the local trainer must agree on it exactly.
#pragma once

#include <cstdint>

namespace tandem {

struct MicrobatchRange {
  int64_t begin = 0, count = 0;
};

inline MicrobatchRange microbatch_range(int64_t batch, int64_t microbatches, int64_t index) {
  const int64_t base = batch / microbatches, extra = batch % microbatches;
  return {index * base + (index < extra ? index : extra), base + (index < extra ? 1 : 0)};
}

}  // namespace tandem
