// The model spec as plain C++ values, read from the FlatBuffers binary form (verified) or
// the JSON text form; every semantic problem is reported with the node and field it concerns.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace tandem {

using Pair = std::array<int64_t, 2>;  // (height, width)

struct Conv2dAttrs {
  int64_t out_channels = 0;
  Pair kernel{0, 0}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  bool bias = true;
  int64_t groups = 1;
};

struct LinearAttrs {
  int64_t out_features = 0;
  bool bias = true;
};

struct Pool2dAttrs {
  Pair kernel{0, 0}, stride{0, 0}, padding{0, 0};
};

struct DropoutAttrs {
  float p = 0.5f;
};

struct BatchNormAttrs {
  float eps = 1e-5f, momentum = 0.1f;
};

struct LayerNormAttrs {
  float eps = 1e-5f;
};

struct AttentionAttrs {
  int64_t heads = 0;
  bool causal = false;
};

struct EmbeddingAttrs {
  int64_t count = 0, features = 0;
  // position_embedding only: a token-type table [types, features] whose row 0 is added to
  // every token too (one segment; parameter field "token_type_embeddings").
  int64_t types = 0;
};

struct TokenPoolAttrs {
  bool mean = false;  // "mean" over the kept tokens; else the first token
};

struct SliceAttrs {
  int64_t axis = -1, start = 0, end = 0;
};

struct ReduceAttrs {
  enum class Mode { sum, mean, max, min } mode = Mode::sum;
  std::vector<int> axes;  // per sample, as written (negative from the last)
};

struct BinaryAttrs {
  // The comparisons give 1 where true, else 0, and pass no gradient (torch's comparisons).
  enum class Mode { add, sub, mul, div, equal, not_equal, less, greater, less_equal, greater_equal } mode = Mode::add;
  static constexpr int kModes = 10;
  bool compares() const { return mode >= Mode::equal; }
  bool has_scalar = false;  // the node has one input; the other operand is `scalar`
  float scalar = 0.0f;       // b (a with scalar_first)
  bool scalar_first = false;
  std::vector<int64_t> operand;  // one input, no scalar: b is a trained tensor "operand" of this shape
  bool image_operand = false;    // the operand is an image's [H, W, C]; PyTorch holds it [C, H, W]
};

// cond ? a : b; a and b are inputs unless given here (constants; they may be infinite).
struct WhereAttrs {
  std::optional<float> a, b;
};

// "sum", "mean", "max" or "min".
const char* reduce_mode_name(ReduceAttrs::Mode m);
// "add", "sub", "mul", "div", "equal", "not_equal", "less", "greater", "less_equal" or "greater_equal".
const char* binary_mode_name(BinaryAttrs::Mode m);

struct LoraAttrs {
  int64_t rank = 0;  // 0: no adapter
  float alpha = 0.0f;
  float dropout = 0.0f;  // PEFT's lora_dropout: on the adapter's input, in training only
  float scale() const { return (alpha > 0.0f ? alpha : static_cast<float>(rank)) / static_cast<float>(rank); }
};

struct HeadsAttrs {
  int64_t count = 0, hidden = 0, out_features = 0;
};

struct NodeSpec {
  std::string name;
  std::string op;
  std::vector<std::string> inputs;
  Conv2dAttrs conv2d;
  LinearAttrs linear;
  Pool2dAttrs pool;
  HeadsAttrs heads;
  BatchNormAttrs batch_norm;
  DropoutAttrs dropout;
  LayerNormAttrs layer_norm;
  AttentionAttrs attention;
  EmbeddingAttrs embedding;
  TokenPoolAttrs token_pool;
  bool freeze = false;  // its parameters do not train (a LoRA adapter's base is frozen too)
  LoraAttrs lora;
  SliceAttrs slice;
  std::vector<int64_t> reshape;  // reshape: the per-sample shape it gives
  std::vector<int> perm;         // transpose: output axis i is input axis perm[i] (per sample)
  ReduceAttrs reduce;
  BinaryAttrs binary;
  std::vector<int64_t> expand;  // expand: the per-sample shape the input broadcasts to
  WhereAttrs where;
  // Fields whose PyTorch state-dict name is not "<name>.<field>" (schema: TorchName).
  std::vector<std::pair<std::string, std::string>> torch_names;
};

struct InputSpec {
  std::string name;
  Shape shape;  // per sample, no batch dimension
  // Token ids and coordinates are integers (carried in f32 tensors, exact below 2^24, and
  // checked to be integers when the data is read).
  bool integer = false;
  // A key padding mask [tokens] (1 keep, 0 padding): the one input that may cross a cut, with
  // the activations, when the cloud's shard reads it (its attention needs it).
  bool mask = false;
  // On the mask input only: its data marks padding with 1 and kept tokens with 0, as torch's
  // key_padding_mask does (True = padding). Data sets are read as 1 - mask, so everything past
  // the reader (the edge, the wire, attention, length buckets) sees 1 keep, 0 padding.
  bool marks_padding = false;
  // On the mask input only: the lengths a micro-batch may run at (increasing, the last is
  // shape[0]; empty: always shape[0]). Each runs at the smallest bucket that holds its longest
  // sequence (its last kept token), so short texts cost their length, not the spec's; a
  // few buckets keep the kernels and plans every backend caches per length few.
  std::vector<int64_t> length_buckets{};
};

struct ModelSpec {
  std::string name;
  std::vector<InputSpec> inputs;
  std::vector<NodeSpec> nodes;
  std::string output;  // logits node
  std::string loss = "softmax_cross_entropy";
  std::string cut;     // default cut, may be empty
  std::vector<uint8_t> binary;  // the canonical FlatBuffers form (what hashes and travels)
};

// The most elements one sample's tensor may have at any node (inputs included): 8 GiB of
// floats, far beyond any model trained here; it keeps every shape's arithmetic in range.
inline constexpr int64_t kMaxSampleElements = int64_t{1} << 31;
// At most this many length buckets (InputSpec::length_buckets): each is a kernel and a plan
// per layer and batch size on every backend.
inline constexpr std::size_t kMaxLengthBuckets = 8;

// The ops this engine knows, for error messages and validation.
const std::vector<std::string>& known_ops();

// Verifies a FlatBuffers binary spec and converts it; throws Error naming node and field.
ModelSpec parse_model_binary(const uint8_t* data, std::size_t size);
// Parses the JSON text form with FlatBuffers' parser (native builds only).
ModelSpec parse_model_json(std::string_view json, std::string_view origin = "model spec");
// Reads a file (native builds only): binary if it carries the "TDMS" identifier, JSON otherwise.
ModelSpec load_model_spec(const std::string& path);
// The JSON text form of `spec` (native builds only), one node a line: each node's attribute
// tables where they differ from the schema's defaults (a table an op requires always), so
// parse_model_json reads back the same values. What `tandem import` writes.
std::string model_spec_json(const ModelSpec& spec);

}  // namespace tandem
