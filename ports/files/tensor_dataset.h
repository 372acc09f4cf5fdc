// A data set as one safetensors file: a tensor per model input, named as the spec names it,
// and "labels". How a sequence model's data reaches the edge (ids, masks, boxes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/tensor.h"

namespace tandem {

struct LabelledInputs {
  std::vector<Tensor> inputs;  // the model's inputs in its spec's order, each [N, per-sample shape]
  std::vector<int32_t> labels;
};

// Reads `path`: for every graph input a tensor of that name (F32, I32, I64 or U8; [N, its
// per-sample shape...]) and "labels" (I32 or I64, [N]); `limit` > 0 keeps the first `limit`
// samples. Values become f32 (ids and coordinates exact below 2^24, checked). Errors name the
// file, the tensor and what is wrong.
LabelledInputs read_tensor_dataset(const std::string& path, const std::vector<GraphInput>& inputs, int64_t limit = 0);

}  // namespace tandem
