#include "ports/tls/ws_frame.h"

#include <cstring>

#include "core/error.h"

namespace tandem {
namespace {

constexpr uint8_t kFin = 0x80, kMasked = 0x80;

std::size_t write_masked(uint8_t* dst, uint8_t first_byte, const uint8_t* payload, std::size_t n, uint32_t mask_key) {
  std::size_t h = 0;
  dst[h++] = first_byte;
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

}  // namespace

std::size_t write_client_frame(uint8_t* dst, const uint8_t* payload, std::size_t n, bool first, bool last,
                               uint32_t mask_key) {
  const uint8_t op = first ? ws_opcode::kBinary : ws_opcode::kContinuation;
  return write_masked(dst, static_cast<uint8_t>((last ? kFin : 0) | op), payload, n, mask_key);
}

std::size_t write_client_control_frame(uint8_t* dst, uint8_t opcode, const uint8_t* payload, std::size_t n,
                                       uint32_t mask_key) {
  return write_masked(dst, static_cast<uint8_t>(kFin | opcode), payload, n < 125 ? n : 125, mask_key);
}

bool read_server_frame_header(const uint8_t* p, std::size_t n, ServerFrameHeader& h, std::string& error) {
  if (n < 2) return false;
  if (p[0] & 0x70) {
    error = "a frame with reserved bits set (no extension was agreed)";
    return false;
  }
  if (p[1] & kMasked) {
    error = "a masked frame from the server (RFC 6455 section 5.1: a server never masks)";
    return false;
  }
  h.fin = (p[0] & kFin) != 0;
  h.opcode = p[0] & 0x0F;
  const uint8_t len7 = p[1] & 0x7F;
  const bool control = h.opcode >= ws_opcode::kClose;
  if (h.opcode > ws_opcode::kBinary && !control) {
    error = cat("a frame with the reserved opcode ", static_cast<int>(h.opcode));
    return false;
  }
  if (control && h.opcode > ws_opcode::kPong) {
    error = cat("a frame with the reserved opcode ", static_cast<int>(h.opcode));
    return false;
  }
  if (control && (!h.fin || len7 > 125)) {
    error = "a fragmented or long control frame (RFC 6455 section 5.5)";
    return false;
  }
  if (len7 < 126) {
    h.length = len7;
    h.size = 2;
  } else if (len7 == 126) {
    if (n < 4) return false;
    h.length = (uint64_t{p[2]} << 8) | p[3];
    h.size = 4;
  } else {
    if (n < 10) return false;
    h.length = 0;
    for (int i = 0; i < 8; ++i) h.length = (h.length << 8) | p[2 + i];
    if (h.length >> 63) {
      error = "a frame length with its top bit set";
      return false;
    }
    h.size = 10;
  }
  return true;
}

}  // namespace tandem
