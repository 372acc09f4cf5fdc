// The dropout mask that dropout nodes and LoRA's input dropout draw: a counter-based stream
// (SplitMix64's finaliser over seed, call and index), so a checkpoint's counters replay it.
#pragma once

#include <cstdint>

namespace tandem {

// keep[i] for i < n: 1 with probability 1 - p, 0 otherwise; call `call` of the stream `seed`.
void dropout_mask(uint64_t seed, uint64_t call, float p, int64_t n, uint8_t* keep);

}  // namespace tandem
