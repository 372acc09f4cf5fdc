#include "ports/lws/ws_frame.h"

#include <cstring>

namespace tandem {

std::size_t write_client_frame(uint8_t* dst, const uint8_t* payload, std::size_t n, bool first, bool last,
                               uint32_t mask_key) {
  constexpr uint8_t kBinary = 0x2, kContinuation = 0x0, kFin = 0x80, kMasked = 0x80;
  std::size_t h = 0;
  dst[h++] = static_cast<uint8_t>((last ? kFin : 0) | (first ? kBinary : kContinuation));
  if (n < 126) {
    dst[h++] = static_cast<uint8_t>(kMasked | n);
  } else if (n < 65536) {
    dst[h++] = kMasked | 126;
    dst[h++] = static_cast<uint8_t>(n >> 8);
    dst[h++] = static_cast<uint8_t>(n);
  } else {
    dst[h++] = kMasked | 127;
    for (int shift = 56; shift >= 0; shift -= 8) dst[h++] = static_cast<uint8_t>(static_cast<uint64_t>(n) >> shift);
  }
  uint8_t key[4];
  for (int i = 0; i < 4; ++i) key[i] = static_cast<uint8_t>(mask_key >> (8 * i));
  std::memcpy(dst + h, key, 4);
  h += 4;
  // Payload byte i is XORed with key[i % 4]: eight at a time with the key repeated twice.
  uint64_t wide;
  uint8_t pattern[8];
  for (int i = 0; i < 8; ++i) pattern[i] = key[i % 4];
  std::memcpy(&wide, pattern, 8);
  uint8_t* out = dst + h;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, payload + i, 8);
    v ^= wide;
    std::memcpy(out + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = payload[i] ^ key[i % 4];
  return h + n;
}

}  // namespace tandem
