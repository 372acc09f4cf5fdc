#include "core/wire/tensor_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/vector.h"

namespace tandem {
namespace {

// std::bit_cast, which Emscripten's libc++ lacks.
template <typename To, typename From>
inline To bits(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// float -> IEEE half, round to nearest even, branch-free so the loop vectorises (after
// F. Giesen's float_to_half_fast3_rtne): NaN -> quiet NaN, overflow -> infinity.
inline uint16_t to_f16(float f) {
  const uint32_t u = bits<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t x = u & 0x7fffffffu;
  const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;  // exponent rebias - 112, round
  constexpr uint32_t kDenormMagic = ((127 - 15) + (23 - 10) + 1) << 23;
  const uint32_t sub = bits<uint32_t>(bits<float>(x) + bits<float>(kDenormMagic)) - kDenormMagic;
  const uint32_t special = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const uint32_t o = x >= 0x47800000u ? special : (x < 0x38800000u ? sub : normal);
  return static_cast<uint16_t>(o | sign);
}

// IEEE half -> float; `bad` collects whether it was an infinity or NaN.
inline float from_f16(uint16_t h, uint32_t& bad) {
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = o & 0x0f800000u;
  o += (127 - 15) << 23;
  const uint32_t sub = bits<uint32_t>(bits<float>(o + (1u << 23)) - bits<float>(113u << 23));
  o = exp == 0 ? sub : o;
  o = exp == 0x0f800000u ? o + ((128 - 16) << 23) : o;  // infinity or NaN stays one
  bad |= static_cast<uint32_t>(exp == 0x0f800000u);
  return bits<float>(o | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

inline uint16_t to_bf16(float f) {
  const uint32_t u = bits<uint32_t>(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float from_bf16(uint16_t b, uint32_t& bad) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
  return bits<float>(u);
}

TANDEM_SIMD_KERNEL
float max_abs(const float* src, int64_t count) {
  float m = 0.0f;
  for (int64_t i = 0; i < count; ++i) m = std::max(m, std::fabs(src[i]));
  return m;
}

TANDEM_SIMD_KERNEL
void encode_f16(const float* src, int64_t count, float inverse_scale, uint16_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = to_f16(src[i] * inverse_scale);
}

TANDEM_SIMD_KERNEL
uint32_t decode_f16(const uint16_t* src, int64_t count, float scale, float* dst) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) dst[i] = from_f16(src[i], bad) * scale;
  return bad;
}

TANDEM_SIMD_KERNEL
void encode_bf16(const float* src, int64_t count, uint16_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = to_bf16(src[i]);
}

TANDEM_SIMD_KERNEL
uint32_t decode_bf16(const uint16_t* src, int64_t count, float* dst) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) dst[i] = from_bf16(src[i], bad);
  return bad;
}

TANDEM_SIMD_KERNEL
void encode_i8(const float* src, int64_t count, float inverse_scale, int8_t* dst) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to nearest even
  for (int64_t i = 0; i < count; ++i) {
    const float r = (src[i] * inverse_scale + kRound) - kRound;
    // Clamped so that NaN (which std::clamp passes through, and whose conversion to an
    // integer is undefined) becomes 0; senders refuse non-finite tensors before this.
    const float q = r >= -127.0f ? (r <= 127.0f ? r : 127.0f) : (r < -127.0f ? -127.0f : 0.0f);
    dst[i] = static_cast<int8_t>(q);
  }
}

TANDEM_SIMD_KERNEL
void decode_i8(const int8_t* src, int64_t count, float scale, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]) * scale;
}

int64_t first_bad(const float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(values[i])) return i;
  return -1;
}

}  // namespace

std::size_t encoded_bytes(wire::DType d, int64_t count) {
  const auto n = static_cast<std::size_t>(count);
  switch (d) {
    case wire::DType::F32: return 4 * n;
    case wire::DType::F16:
    case wire::DType::BF16: return 2 * n;
    case wire::DType::I8: return n;
  }
  return 4 * n;
}

float encode_tensor(wire::DType d, const float* src, int64_t count, uint8_t* dst) {
  switch (d) {
    case wire::DType::F32:
      std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
      return 1.0f;
    case wire::DType::F16: {
      const float m = max_abs(src, count);
      // A power of two (exact to apply) that puts max |x| in [2^14, 2^15).
      const float scale = m > 0.0f && std::isfinite(m) ? std::ldexp(1.0f, std::ilogb(m) - 14) : 1.0f;
      encode_f16(src, count, 1.0f / scale, reinterpret_cast<uint16_t*>(dst));
      return scale;
    }
    case wire::DType::BF16:
      encode_bf16(src, count, reinterpret_cast<uint16_t*>(dst));
      return 1.0f;
    case wire::DType::I8: {
      const float m = max_abs(src, count);
      const float scale = m > 0.0f && std::isfinite(m) ? m / 127.0f : 1.0f;
      encode_i8(src, count, 1.0f / scale, reinterpret_cast<int8_t*>(dst));
      return scale;
    }
  }
  fail("wire", cat("cannot encode dtype ", static_cast<int>(d)));
}

bool decode_tensor(wire::DType d, const uint8_t* src, int64_t count, float scale, float* dst, std::string& why) {
  if (!std::isfinite(scale) || scale < 0.0f) {
    why = cat("scale ", scale, " is not a finite non-negative number");
    return false;
  }
  uint32_t bad = 0;
  switch (d) {
    case wire::DType::F32:
      std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
      bad = first_bad(dst, count) >= 0;
      break;
    case wire::DType::F16: {
      // src may sit at any even offset: copy-free reads of uint16 need 2-byte alignment only.
      bad = decode_f16(reinterpret_cast<const uint16_t*>(src), count, scale, dst);
      bad |= first_bad(dst, count) >= 0;  // finite halves times a huge scale
      break;
    }
    case wire::DType::BF16:
      bad = decode_bf16(reinterpret_cast<const uint16_t*>(src), count, dst);
      break;
    case wire::DType::I8:
      decode_i8(reinterpret_cast<const int8_t*>(src), count, scale, dst);
      bad = first_bad(dst, count) >= 0;
      break;
  }
  if (!bad) return true;
  // Name the element: the f16/bf16 specials decode to inf/NaN, so a scan finds it.
  why = cat("non-finite value at element ", std::max<int64_t>(0, first_bad(dst, count)));
  return false;
}

std::optional<wire::DType> parse_dtype(const std::string& name) {
  if (name == "f32") return wire::DType::F32;
  if (name == "f16") return wire::DType::F16;
  if (name == "bf16") return wire::DType::BF16;
  if (name == "i8") return wire::DType::I8;
  return std::nullopt;
}

const char* dtype_name(wire::DType d) {
  switch (d) {
    case wire::DType::F32: return "f32";
    case wire::DType::F16: return "f16";
    case wire::DType::BF16: return "bf16";
    case wire::DType::I8: return "i8";
  }
  return "unknown";
}

}  // namespace tandem
