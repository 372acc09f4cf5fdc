// How an f32 tensor travels: as is (F32), as f16 scaled by a power of two per tensor so its
// largest magnitude lands in [2^14, 2^15) (no overflow, small values stay normal), as bf16
// (round to nearest even), or as int8 with one scale per tensor (max |x| / 127).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "schema/wire_generated.h"

namespace tandem {

// Bytes of `count` values in dtype d.
std::size_t encoded_bytes(wire::DType d, int64_t count);

// Encodes src[0, count) into dst (encoded_bytes long); returns the scale to send with it
// (1 for F32 and BF16).
float encode_tensor(wire::DType d, const float* src, int64_t count, uint8_t* dst);

// Decodes src (encoded_bytes long) into dst. False when the scale or a value is not finite
// (an f16 or bf16 infinity or NaN), naming the first such element in `why`.
bool decode_tensor(wire::DType d, const uint8_t* src, int64_t count, float scale, float* dst, std::string& why);

// "f32", "f16", "bf16", "i8" (the CLI's names) and back.
std::optional<wire::DType> parse_dtype(const std::string& name);
const char* dtype_name(wire::DType d);

}  // namespace tandem
