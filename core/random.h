// Seeded random numbers that are bitwise identical on every compiler and platform (the
// standard's distributions are not), for parameter initialisation, shuffling and dropout.
#pragma once

#include <cstdint>
#include <random>

namespace tandem {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  // Uniform in [0, 1) with 24 random bits.
  float uniform01() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform01(); }
  // Uniform integer in [0, n) (n > 0), without modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }

 private:
  std::mt19937_64 engine_;  // its output sequence is fixed by the standard
};

}  // namespace tandem
