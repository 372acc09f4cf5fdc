// PyTorch's names and layouts for a tandem model's tensors. Names are the same
// ("<node>.weight", "<node>.running_mean") but where a node's torch_names renames a field
// (an imported model's "class_token", "in_proj_weight"); layouts differ in two places: convolution
// weights (tandem OHWI, torch OIHW), and a layer reading a flattened image (tandem flattens
// NHWC in (h, w, c) order, torch NCHW in (c, h, w)): its input columns are permuted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/interop/safetensors.h"
#include "core/network.h"

namespace tandem {

// The state-dict name of tandem's tensor `name` ("<node>.<field>"): the node's torch_names
// entry for the field, else `name`.
std::string torch_name(const Graph& whole, const std::string& name);
// One tensor of `shard` (a Network over part or all of `whole`) in torch's layout and name.
SafeTensor to_torch(const Graph& whole, const std::string& name, const Tensor& value);
// Fills `out`, tandem's tensor `name` (tandem's layout and shape), from the torch-layout
// tensor `t`; throws Error when its dtype or shape does not fit.
void from_torch(const Graph& whole, const std::string& name, const SafeTensor& t, Tensor& out);

// Every parameter and buffer of `shard` as torch tensors, plus batch norms' num_batches_tracked.
std::vector<SafeTensor> shard_to_torch(const Graph& whole, Network& shard, int64_t batches_tracked);
// The names of a shard's parameters and buffers (what shard_from_torch reads).
std::vector<std::string> tensor_names(Network& shard);
// tensor_names as the state dict names them (torch_name).
std::vector<std::string> torch_tensor_names(const Graph& whole, Network& shard);
// torch_tensor_names and the other names a Hugging Face file may hold them under (hugging_face.h):
// what a reader of only the shard's tensors fetches.
std::vector<std::string> import_names(const Graph& whole, Network& shard);
// Sets every parameter and buffer of `shard` from `tensors` (e.g. a safetensors file of the
// whole model, tandem's or Hugging Face's: hugging_face_tensor adapts names, dtypes and BERT's
// position and token-type tables); extra tensors are ignored, a missing or misshapen one is an
// Error naming it, except LoRA adapters (lora_A, lora_B) a base model's file lacks: they keep
// their start.
void shard_from_torch(const Graph& whole, const std::vector<SafeTensor>& tensors, Network& shard);

}  // namespace tandem
