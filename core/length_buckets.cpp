#include "core/length_buckets.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace tandem {

int64_t kept_length(const float* mask_row, int64_t tokens) {
  while (tokens > 0 && mask_row[tokens - 1] == 0.0f) --tokens;
  return tokens;
}

int64_t bucket_for(const Graph& graph, std::span<const Tensor> inputs) {
  const auto& buckets = graph.length_buckets();
  if (buckets.empty()) return -1;
  const auto& in = graph.inputs();
  for (std::size_t i = 0; i < in.size() && i < inputs.size(); ++i) {
    if (!in[i].mask || !in[i].tokens) continue;
    const Tensor& mask = inputs[i];
    const int64_t n = mask.shape()[0], tokens = mask.shape()[1];
    int64_t longest = 1;  // a sample with nothing kept still runs one token
    for (int64_t b = 0; b < n; ++b) longest = std::max(longest, kept_length(mask.data() + b * tokens, tokens));
    const auto it = std::lower_bound(buckets.begin(), buckets.end(), longest);
    return it == buckets.end() ? buckets.back() : *it;
  }
  return -1;
}

void cut_to_length(const Graph& graph, std::span<const Tensor> inputs, int64_t length, LengthCut& out) {
  const auto& in = graph.inputs();
  out.length = length;
  out.inputs.resize(inputs.size());
  out.owned.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Shape& full = inputs[i].shape();
    if (length < 0 || i >= in.size() || !in[i].tokens || full[1] == length) {
      out.inputs[i] = inputs[i];
      continue;
    }
    if (length > full[1]) fail("length buckets", cat("cannot cut '", in[i].name, "' of ", full[1], " tokens to ", length));
    Shape shape = full;
    shape[1] = length;
    Tensor& copy = out.owned[i];
    if (!copy.defined() || copy.numel() < shape.numel()) copy = Tensor::empty(Shape{shape.numel()});
    out.inputs[i] = copy.prefix(shape);
    const int64_t n = full[0], row = full.item_numel(), kept = length * (row / full[1]);
    for (int64_t b = 0; b < n; ++b)
      std::memcpy(out.inputs[i].data() + b * kept, inputs[i].data() + b * row, static_cast<std::size_t>(kept) * sizeof(float));
  }
}

void fit_to_bucket(const Graph& graph, std::span<const Tensor> inputs, LengthCut& out) {
  cut_to_length(graph, inputs, bucket_for(graph, inputs), out);
}

}  // namespace tandem
