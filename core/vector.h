// Portable 16-float vectors (GCC/Clang vector extensions) for hand kernels, and the
// attribute that compiles a kernel for AVX-512, AVX2+FMA and baseline x86-64 and picks one
// at load time; elsewhere (aarch64, wasm with -msimd128) the compiler lowers the vectors.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
// The vectors never cross a non-inlined call (the helpers below are always inlined); the
// ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#include <cstdint>
#include <cstring>

namespace tandem::simd {

// Unaligned (4-byte) loads and stores through this type are allowed.
using f32x16 = float __attribute__((vector_size(64), aligned(4)));

using u32x16 = uint32_t __attribute__((vector_size(64), aligned(4)));
using i32x16 = int32_t __attribute__((vector_size(64), aligned(4)));  // comparison results

// Always inlined: out of line (at -O0) they would be compiled for baseline x86-64, whose ABI
// passes these vectors differently from the AVX-512 clone calling them.
[[gnu::always_inline]] inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store16(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }
[[gnu::always_inline]] inline void store16u(uint32_t* p, u32x16 v) { std::memcpy(p, &v, sizeof v); }

}  // namespace tandem::simd

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// a * b + c may become one FMA: the kernels' results then differ from the reference by
// rounding only, within the tests' tolerances.
#define TANDEM_SIMD_KERNEL \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("fp-contract=fast")))
#elif defined(__GNUC__) && !defined(__clang__)
#define TANDEM_SIMD_KERNEL __attribute__((optimize("fp-contract=fast")))
#else
#define TANDEM_SIMD_KERNEL
#endif
