// Length buckets where the data is (the edge, local training): a micro-batch of sequences
// padded to the spec's length runs at the smallest bucket that holds its longest sequence.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/graph.h"
#include "core/tensor.h"

namespace tandem {

// A sample's length: one past its mask row's last kept token (0: none kept).
int64_t kept_length(const float* mask_row, int64_t tokens);

// The bucket for a micro-batch of `inputs` at the spec's length ([n, T, ...]): the smallest of
// graph.length_buckets() holding every sample's last kept token (the mask's last 1). -1 when
// the graph has no buckets or no mask input.
int64_t bucket_for(const Graph& graph, std::span<const Tensor> inputs);

// A micro-batch's inputs as a network runs them: the per-token ones cut to `length` tokens
// (copies, in `owned`, reused from call to call), the others shared as they are.
struct LengthCut {
  std::vector<Tensor> inputs;
  int64_t length = -1;  // -1: not cut (no buckets)
  std::vector<Tensor> owned;  // per input: the storage of its cut copy
};

// `inputs` with every per-token input cut to its first `length` tokens (< 0: none is).
void cut_to_length(const Graph& graph, std::span<const Tensor> inputs, int64_t length, LengthCut& out);

// Both: cut to the micro-batch's bucket.
void fit_to_bucket(const Graph& graph, std::span<const Tensor> inputs, LengthCut& out);

}  // namespace tandem
