#include "ports/files/tensor_dataset.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "ports/files/safetensors_file.h"

namespace tandem {
namespace {

// Element i of a tensor of any dtype the reader accepts, as a double (exact for these).
double value_at(const SafeTensor& t, int64_t i) {
  const uint8_t* p = t.data.data();
  if (t.dtype == "F32") {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (t.dtype == "I32") {
    int32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (t.dtype == "I64") {
    int64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    return static_cast<double>(v);
  }
  if (t.dtype == "U8" || t.dtype == "BOOL") return p[i];  // torch saves a bool mask as BOOL, a byte each
  // The header reader also takes F16 and BF16 (Hugging Face's weights); a data set holds none.
  fail("data set", cat("'", t.name, "' is ", t.dtype, ": a data set's tensors are F32, I32, I64, U8 or BOOL"));
}

// "a, b and c"
std::string listing(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += cat(i == 0 ? "" : i + 1 == names.size() ? " and " : ", ", "'", names[i], "'");
  return out.empty() ? "nothing" : out;
}

const SafeTensor& named(const std::vector<SafeTensor>& all, const std::string& name, const std::string& path,
                        const std::vector<std::string>& wanted) {
  for (const SafeTensor& t : all)
    if (t.name == name) return t;
  std::vector<std::string> present;
  for (const SafeTensor& t : all) present.push_back(t.name);
  fail("data set", cat(path, " has no tensor '", name, "': the model reads ", listing(wanted),
                       " (a tensor per model input, named as in the spec, and the labels); the file has ",
                       listing(present)));
}

}  // namespace

LabelledInputs read_tensor_dataset(const std::string& path, const std::vector<GraphInput>& inputs, int64_t limit) {
  std::vector<std::string> names{"labels"};
  for (const GraphInput& in : inputs) names.push_back(in.name);
  if (!std::filesystem::is_regular_file(path))
    fail("data set", cat(path, " does not exist: a data folder holds train.safetensors and test.safetensors, each with ",
                         listing(names), " (a tensor per model input, named as in the spec, and the labels); "
                         "`tandem text encode` makes them from texts"));
  const std::vector<SafeTensor> all = read_safetensors_file(path, names);
  const SafeTensor& labels = named(all, "labels", path, names);
  if (labels.shape.size() != 1 || (labels.dtype != "I32" && labels.dtype != "I64"))
    fail("data set", cat(path, ": 'labels' must be I32 or I64 [N], got ", labels.dtype, " of rank ", labels.shape.size()));
  const int64_t total = labels.shape[0], n = limit > 0 ? std::min(limit, total) : total;
  LabelledInputs out;
  for (int64_t i = 0; i < n; ++i) out.labels.push_back(static_cast<int32_t>(value_at(labels, i)));
  for (const GraphInput& in : inputs) {
    const SafeTensor& t = named(all, in.name, path, names);
    const Shape want = in.shape.batched(total);
    bool fits = static_cast<int>(t.shape.size()) == want.rank();
    for (int d = 0; fits && d < want.rank(); ++d) fits = t.shape[static_cast<std::size_t>(d)] == want[d];
    if (!fits) {
      std::string got;
      for (int64_t d : t.shape) got += cat(got.empty() ? "" : ", ", d);
      fail("data set", cat(path, ": '", in.name, "' is [", got, "], the model wants ", want.str()));
    }
    Tensor v = Tensor::empty(in.shape.batched(n));
    for (int64_t i = 0; i < v.numel(); ++i) {
      const double x = value_at(t, i);
      if (!in.accepts(x)) fail("data set", cat(path, ": '", in.name, "' holds ", x, " at element ", i, ", not ", in.rule()));
      // A mask that marks padding (torch's key_padding_mask) becomes tandem's: 1 keep, 0 padding.
      v[i] = static_cast<float>(in.marks_padding ? 1.0 - x : x);
    }
    out.inputs.push_back(std::move(v));
  }
  return out;
}

}  // namespace tandem
