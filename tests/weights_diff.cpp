// tandem_weights_diff A.safetensors B.safetensors TOLERANCE: prints the largest absolute
// difference between two exports of one model and exits 1 when it exceeds TOLERANCE, when a
// value is not finite, or when the files' tensors (names, dtypes, shapes) differ. A file
// named *.tdmc is a checkpoint (a cloud's round, a stage's): its parameters, buffers and
// optimizer state are compared. Tensors are
// matched by name: one process's export and the merged exports of a pipeline's stages order them
// differently.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>

#include "core/error.h"
#include "core/checkpoint/checkpoint.h"
#include "ports/files/atomic_file.h"
#include "ports/files/safetensors_file.h"

namespace tandem {
namespace {

std::vector<SafeTensor> tensors_of(const std::string& path) {
  if (!path.ends_with(".tdmc")) return read_safetensors_file(path, {});
  const CheckpointData c = decode_checkpoint(read_file(path));
  std::vector<SafeTensor> out;
  for (const auto* part : {&c.params, &c.buffers, &c.optimizer_state})
    for (const NamedTensor& t : *part) {
      SafeTensor s{t.name, "F32", {}, {}};
      for (int d = 0; d < t.value.shape().rank(); ++d) s.shape.push_back(t.value.shape()[d]);
      const auto* bytes = reinterpret_cast<const uint8_t*>(t.value.data());
      s.data.assign(bytes, bytes + t.value.numel() * static_cast<int64_t>(sizeof(float)));
      out.push_back(std::move(s));
    }
  return out;
}

int diff(const std::string& a_path, const std::string& b_path, double tolerance) {
  const auto a = tensors_of(a_path);
  const auto b = tensors_of(b_path);
  if (a.size() != b.size()) fail("weights diff", cat(a_path, " has ", a.size(), " tensors, ", b_path, " ", b.size()));
  if (a.empty()) fail("weights diff", cat(a_path, " holds no tensors"));
  double worst = 0;
  std::string worst_name = a[0].name;
  std::size_t values = 0;
  std::map<std::string, const SafeTensor*> by_name;
  for (const SafeTensor& y : b) by_name[y.name] = &y;
  for (const SafeTensor& x : a) {
    const auto it = by_name.find(x.name);
    if (it == by_name.end()) fail("weights diff", cat("'", x.name, "' is in ", a_path, " but not in ", b_path));
    const SafeTensor& y = *it->second;
    if (x.dtype != y.dtype || x.shape != y.shape || x.data.size() != y.data.size())
      fail("weights diff", cat("'", x.name, "' is ", x.dtype, " in ", a_path, " but ", y.dtype, " in ", b_path,
                               ", or their shapes differ"));
    if (x.dtype == "I64") {
      if (x.data != y.data) fail("weights diff", cat("the integers of '", x.name, "' differ"));
      continue;
    }
    for (std::size_t i = 0; i < x.data.size(); i += sizeof(float)) {
      float u = 0, v = 0;
      std::memcpy(&u, x.data.data() + i, sizeof u);
      std::memcpy(&v, y.data.data() + i, sizeof v);
      if (!std::isfinite(u) || !std::isfinite(v)) fail("weights diff", cat("'", x.name, "' holds a value that is not finite"));
      const double d = std::fabs(static_cast<double>(u) - static_cast<double>(v));
      if (d > worst) worst = d, worst_name = x.name;
      ++values;
    }
  }
  std::printf("max abs difference %.3g (in '%s') over %zu tensors, %zu values; tolerance %.3g\n", worst,
              worst_name.c_str(), a.size(), values, tolerance);
  return worst <= tolerance ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s A.safetensors B.safetensors TOLERANCE\n", argv[0]);
    return 2;
  }
  try {
    return tandem::diff(argv[1], argv[2], std::strtod(argv[3], nullptr));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
