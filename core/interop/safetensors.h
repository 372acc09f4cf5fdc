// The safetensors format (Hugging Face's, what PyTorch users exchange weights in): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and byte
// range, then the raw little-endian data. Reading checks every field and range, so a
// malformed file is refused with an Error, never read out of bounds.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace tandem {

struct SafeTensor {
  std::string name;
  std::string dtype;  // "F32", "I64", "I32" or "U8" (data sets); reading also takes HF's F16 and BF16 weights
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian values, numel * element size bytes
};

// A tensor's entry in the header: where its bytes lie after the header (checked against
// data_size, the bytes that follow it) and what they hold; `data` is left empty.
struct SafeTensorEntry {
  SafeTensor tensor;
  uint64_t begin = 0, end = 0;
};
// The header's length from the file's first 8 bytes.
uint64_t safetensors_header_size(std::span<const uint8_t> first8);
// Parses the JSON header (the bytes after the length) for a file with data_size data bytes.
std::vector<SafeTensorEntry> parse_safetensors_header(std::string_view header, uint64_t data_size,
                                                      std::map<std::string, std::string>* metadata = nullptr);

std::vector<uint8_t> write_safetensors(const std::vector<SafeTensor>& tensors,
                                       const std::map<std::string, std::string>& metadata = {});
// Throws Error("[safetensors] ...").
std::vector<SafeTensor> read_safetensors(std::span<const uint8_t> file,
                                         std::map<std::string, std::string>* metadata = nullptr);

SafeTensor f32_tensor(std::string name, std::vector<int64_t> shape, const float* values);
SafeTensor i64_tensor(std::string name, std::vector<int64_t> shape, const int64_t* values);
// Data sets' dtypes: token ids, boxes and labels (I32), masks (U8).
SafeTensor i32_tensor(std::string name, std::vector<int64_t> shape, const int32_t* values);
SafeTensor u8_tensor(std::string name, std::vector<int64_t> shape, const uint8_t* values);

}  // namespace tandem
