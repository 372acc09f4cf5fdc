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

// Lanes of `a` where `m` is set (all ones), of `b` elsewhere: the comparisons' results as
// masks, without the vector ?: that not every compiler here takes.
[[gnu::always_inline]] inline f32x16 select16(i32x16 m, f32x16 a, f32x16 b) {
  return reinterpret_cast<f32x16>((reinterpret_cast<i32x16>(a) & m) | (reinterpret_cast<i32x16>(b) & ~m));
}
[[gnu::always_inline]] inline f32x16 max16(f32x16 a, f32x16 b) { return select16(a > b, a, b); }

// e^x lane by lane, within 2 ulp of expf for x in [-87.3, 88.3] (Cephes' expf: x = n ln2 + r,
// a degree-6 polynomial for e^r, 2^n built in the exponent bits); x below -87.3 gives
// e^-87.3 (about 1e-38), so callers that need exact zeros select them.
[[gnu::always_inline]] inline f32x16 exp16(f32x16 x) {
  const f32x16 lo = f32x16{} - 87.3365447f, hi = f32x16{} + 88.3762626f;  // 2^n stays finite: n <= 127
  x = select16(x < lo, lo, select16(x > hi, hi, x));
  f32x16 fx = x * 1.44269504088896341f + 0.5f;
  const f32x16 t = __builtin_convertvector(__builtin_convertvector(fx, i32x16), f32x16);
  fx = t + __builtin_convertvector(t > fx, f32x16);  // floor: truncation, minus 1 where it rounded up
  x = x - fx * 0.693359375f - fx * -2.12194440e-4f;
  f32x16 y = x * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * x * x + x + 1.0f;
  const i32x16 n = __builtin_convertvector(fx, i32x16);
  return y * reinterpret_cast<f32x16>((n + 127) << 23);
}

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
