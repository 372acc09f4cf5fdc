// Encryption at rest for the edge's checkpoints: AES-256-GCM (mbedTLS) under a 32-byte key
// kept in the identity folder. Sealed bytes: "TDMSEAL1", a random 12-byte nonce, the
// ciphertext and the 16-byte tag; opening checks the tag before returning anything.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

using AesKey = std::array<uint8_t, 32>;

std::vector<uint8_t> seal_aes_gcm(const AesKey& key, std::span<const uint8_t> plaintext);
// Throws Error("[aes-gcm] ...") for a short, foreign or tampered file or the wrong key.
std::vector<uint8_t> open_aes_gcm(const AesKey& key, std::span<const uint8_t> sealed);
bool is_sealed(std::span<const uint8_t> bytes);

// The key in `path` (64 hex digits); created with fresh random bytes (mode 0600) when the
// file does not exist and `create` is set.
AesKey load_key(const std::string& path, bool create);
AesKey random_key();

}  // namespace tandem
