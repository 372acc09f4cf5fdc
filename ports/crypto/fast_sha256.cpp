#include "ports/crypto/fast_sha256.h"

#include <openssl/sha.h>

namespace tandem {

std::array<uint8_t, 32> fast_sha256(std::span<const uint8_t> bytes) {
  std::array<uint8_t, 32> out{};
  SHA256(bytes.data(), bytes.size(), out.data());
  return out;
}

}  // namespace tandem
