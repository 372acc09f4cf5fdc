#include "core/interop/safetensors.h"

#include <cstring>
#include <limits>

#include "core/error.h"

namespace tandem {
namespace {

std::size_t element_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "I64") return 8;
  if (dtype == "U8" || dtype == "BOOL") return 1;  // BOOL: torch's bool tensors (a data set's mask)
  if (dtype == "F16" || dtype == "BF16") return 2;  // Hugging Face's half-precision weights (widened on import)
  fail("safetensors", cat("dtype '", dtype, "' is not supported (tandem reads F32, F16, BF16, I32, I64, U8 and BOOL)"));
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) fail("safetensors", "control character in a name");
    out += c;
  }
  return out + "\"";
}

// A recursive-descent reader for the header's JSON: objects, arrays, strings, integers.
class HeaderReader {
 public:
  explicit HeaderReader(std::string_view text) : s_(text) {}

  void expect(char c) {
    skip();
    if (i_ >= s_.size() || s_[i_] != c) bad(cat("expected '", c, "'"));
    ++i_;
  }
  bool peek(char c) {
    skip();
    return i_ < s_.size() && s_[i_] == c;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) bad("unterminated escape");
        c = s_[i_++];
        if (c == 'u') bad("\\u escapes are not supported in names");
        if (c == 'n') c = '\n';
        else if (c == 't') c = '\t';
        else if (c != '"' && c != '\\' && c != '/') bad("unknown escape");
      }
      out += c;
    }
    expect('"');
    return out;
  }
  int64_t integer() {
    skip();
    const std::size_t start = i_;
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) bad("integer too large");
      v = v * 10 + (s_[i_++] - '0');
    }
    if (i_ == start) bad("expected a non-negative integer");
    return v;
  }
  std::vector<int64_t> integers() {
    std::vector<int64_t> out;
    expect('[');
    if (peek(']')) return ++i_, out;
    do out.push_back(integer());
    while (comma());
    expect(']');
    return out;
  }
  bool comma() {
    if (!peek(',')) return false;
    ++i_;
    return true;
  }
  void end() {
    skip();
    if (i_ != s_.size()) bad("trailing characters after the header");
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail("safetensors", cat("malformed header at byte ", i_, ": ", what));
  }

 private:
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  std::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace

namespace {
SafeTensor packed(std::string name, const char* dtype, std::vector<int64_t> shape, const void* values) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  SafeTensor t{std::move(name), dtype, std::move(shape), std::vector<uint8_t>(static_cast<std::size_t>(n) * element_size(dtype))};
  if (n > 0) std::memcpy(t.data.data(), values, t.data.size());
  return t;
}
}  // namespace

SafeTensor f32_tensor(std::string name, std::vector<int64_t> shape, const float* values) {
  return packed(std::move(name), "F32", std::move(shape), values);
}

SafeTensor i64_tensor(std::string name, std::vector<int64_t> shape, const int64_t* values) {
  return packed(std::move(name), "I64", std::move(shape), values);
}

SafeTensor i32_tensor(std::string name, std::vector<int64_t> shape, const int32_t* values) {
  return packed(std::move(name), "I32", std::move(shape), values);
}

SafeTensor u8_tensor(std::string name, std::vector<int64_t> shape, const uint8_t* values) {
  return packed(std::move(name), "U8", std::move(shape), values);
}

std::vector<uint8_t> write_safetensors(const std::vector<SafeTensor>& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += cat(first ? "" : ",", quoted(k), ":", quoted(v));
      first = false;
    }
    header += "}";
  }
  std::size_t offset = 0;
  for (const SafeTensor& t : tensors) {
    std::string shape;
    for (int64_t d : t.shape) shape += cat(shape.empty() ? "" : ",", d);
    header += cat(header.size() > 1 ? "," : "", quoted(t.name), ":{\"dtype\":\"", t.dtype, "\",\"shape\":[", shape,
                  "],\"data_offsets\":[", offset, ",", offset + t.data.size(), "]}");
    offset += t.data.size();
  }
  header += "}";
  while ((8 + header.size()) % 8 != 0) header += ' ';  // the data starts 8-byte aligned
  std::vector<uint8_t> out(8 + header.size() + offset);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<uint8_t>(header.size() >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  uint8_t* data = out.data() + 8 + header.size();
  for (const SafeTensor& t : tensors) {
    if (!t.data.empty()) std::memcpy(data, t.data.data(), t.data.size());
    data += t.data.size();
  }
  return out;
}

uint64_t safetensors_header_size(std::span<const uint8_t> first8) {
  if (first8.size() < 8) fail("safetensors", "shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(first8[static_cast<std::size_t>(i)]) << (8 * i);
  if (n > (uint64_t{100} << 20)) fail("safetensors", cat("a header of ", n, " bytes is not plausible"));
  return n;
}

std::vector<SafeTensorEntry> parse_safetensors_header(std::string_view header, uint64_t data_size,
                                                      std::map<std::string, std::string>* metadata) {
  HeaderReader r(header);
  std::vector<SafeTensorEntry> out;
  r.expect('{');
  if (!r.peek('}')) do {
      const std::string name = r.string();
      r.expect(':');
      r.expect('{');
      if (name == "__metadata__") {
        if (!r.peek('}')) do {
            const std::string k = r.string();
            r.expect(':');
            const std::string v = r.string();
            if (metadata) (*metadata)[k] = v;
          } while (r.comma());
        r.expect('}');
        continue;
      }
      SafeTensorEntry e{{name, "", {}, {}}, 0, 0};
      SafeTensor& t = e.tensor;
      std::vector<int64_t> offsets;
      bool has_shape = false;
      do {
        const std::string key = r.string();
        r.expect(':');
        if (key == "dtype") t.dtype = r.string();
        else if (key == "shape") t.shape = r.integers(), has_shape = true;
        else if (key == "data_offsets") offsets = r.integers();
        else r.bad(cat("unknown field '", key, "' of tensor '", name, "'"));
      } while (r.comma());
      r.expect('}');
      if (t.dtype.empty() || !has_shape || offsets.size() != 2)
        fail("safetensors", cat("tensor '", name, "' lacks its dtype, shape or data_offsets"));
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        if (d > (int64_t{1} << 32)) fail("safetensors", cat("tensor '", name, "' has a dimension of ", d));
        numel *= static_cast<uint64_t>(d);
        if (numel > (uint64_t{1} << 36)) fail("safetensors", cat("tensor '", name, "' is too large"));
      }
      e.begin = static_cast<uint64_t>(offsets[0]);
      e.end = static_cast<uint64_t>(offsets[1]);
      if (e.begin > e.end || e.end > data_size)
        fail("safetensors", cat("tensor '", name, "' spans bytes ", e.begin, "..", e.end, " of ", data_size));
      if (e.end - e.begin != numel * element_size(t.dtype))
        fail("safetensors",
             cat("tensor '", name, "' holds ", e.end - e.begin, " bytes for ", numel, " ", t.dtype, " values"));
      for (const SafeTensorEntry& o : out)
        if (o.tensor.name == name) fail("safetensors", cat("tensor '", name, "' appears twice"));
      out.push_back(std::move(e));
    } while (r.comma());
  r.expect('}');
  r.end();
  return out;
}

std::vector<SafeTensor> read_safetensors(std::span<const uint8_t> file, std::map<std::string, std::string>* metadata) {
  const uint64_t n = safetensors_header_size(file);
  if (n > file.size() - 8) fail("safetensors", cat("the header length ", n, " runs past the end of the file"));
  const std::span<const uint8_t> data = file.subspan(8 + n);
  std::vector<SafeTensor> out;
  for (SafeTensorEntry& e : parse_safetensors_header(
           std::string_view(reinterpret_cast<const char*>(file.data() + 8), n), data.size(), metadata)) {
    e.tensor.data.assign(data.begin() + static_cast<std::ptrdiff_t>(e.begin),
                         data.begin() + static_cast<std::ptrdiff_t>(e.end));
    out.push_back(std::move(e.tensor));
  }
  return out;
}

}  // namespace tandem
