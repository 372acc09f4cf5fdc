// SHA-256 in portable C++ (FIPS 180-4), for model-spec hashes that every edge, including
// the browser build, computes the same way without a crypto library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  std::array<uint8_t, 32> finish();  // the object is spent afterwards

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  uint64_t total_ = 0;
};

std::array<uint8_t, 32> sha256(const void* data, std::size_t size);
std::string to_hex(const uint8_t* data, std::size_t size);

}  // namespace tandem
