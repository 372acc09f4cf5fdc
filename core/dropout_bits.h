// The dropout mask's bits, for the host and the cuda kernels alike: SplitMix64's finaliser
// over seed, call and index (a counter-based stream, so a checkpoint's counters replay it).
// keep[i] = dropout_keeps(dropout_base(seed, call), dropout_threshold(p), i).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tandem {

TANDEM_HOST_DEVICE inline uint64_t dropout_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

TANDEM_HOST_DEVICE inline uint64_t dropout_base(uint64_t seed, uint64_t call) {
  return dropout_mix(seed ^ dropout_mix(call));
}

// p of 2^64 (p < 1): an index drops when its value falls below.
TANDEM_HOST_DEVICE inline uint64_t dropout_threshold(float p) {
  return static_cast<uint64_t>(static_cast<double>(p) * 18446744073709551616.0);
}

TANDEM_HOST_DEVICE inline bool dropout_keeps(uint64_t base, uint64_t threshold, int64_t i) {
  return dropout_mix(base + static_cast<uint64_t>(i)) >= threshold;
}

}  // namespace tandem
