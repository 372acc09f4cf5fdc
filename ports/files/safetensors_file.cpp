#include "ports/files/safetensors_file.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace tandem {

std::vector<SafeTensor> read_safetensors_file(const std::string& path, const std::vector<std::string>& names) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("safetensors", cat("cannot open ", path));
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint8_t first8[8] = {};
  if (!in.read(reinterpret_cast<char*>(first8), 8)) fail("safetensors", cat(path, " is shorter than 8 bytes"));
  const uint64_t n = safetensors_header_size(first8);
  if (n > size - 8) fail("safetensors", cat(path, ": the header length ", n, " runs past the end of the file"));
  std::string header(n, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n))) fail("safetensors", cat("cannot read ", path));
  std::vector<SafeTensor> out;
  for (SafeTensorEntry& e : parse_safetensors_header(header, size - 8 - n)) {
    if (!names.empty() && std::find(names.begin(), names.end(), e.tensor.name) == names.end()) continue;
    e.tensor.data.resize(e.end - e.begin);
    in.seekg(static_cast<std::streamoff>(8 + n + e.begin));
    if (!in.read(reinterpret_cast<char*>(e.tensor.data.data()), static_cast<std::streamsize>(e.tensor.data.size())))
      fail("safetensors", cat("cannot read tensor '", e.tensor.name, "' of ", path));
    out.push_back(std::move(e.tensor));
  }
  return out;
}

}  // namespace tandem
