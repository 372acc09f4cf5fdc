// Every op of the registry, on the backend under test, from one case description each (as
// ggml's test-backend-ops): a small spec around the op, written as the model JSON users write.
// Each case runs forward and backward on the backend and on the reference (the same weights)
// and compares outputs and every gradient, then checks the backend's gradients of a random
// weighted sum of the output (input and parameters) by central finite differences, every
// tensor between guard zones (GuardedMemory). A case for
// a new op is one entry of cases(); OpCases.EveryRegisteredOpHasACase fails for an op without
// one, so "every op on every backend" holds by construction (ctest runs OpCases.* on each).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "grad_support.h"
#include "test_support.h"

namespace tandem::test {
namespace {

// How a case's float input is drawn: uniform in [-1, 1]; away from 0 (|x| in [0.1, 1], for
// the kinks of relu and its kind); or spaced (distinct values 0.03 apart in random order, so
// a finite difference never swaps a window's maximum).
enum class Draw { Uniform, AwayFromZero, Spaced };

struct OpCase {
  std::string op;    // the registry's op the case covers
  std::string name;  // the case's name (gtest's), unique
  std::string nodes; // the spec's nodes, JSON; its output is the node named "y"
  std::string inputs;  // the spec's inputs, JSON; the first is float and differentiated unless `ids_first`
  Draw draw = Draw::Uniform;
  int64_t ids_below = 0;     // integer inputs: ids in [0, ids_below); boxes: coordinates too
  bool ids_first = false;    // the first input is token ids (no input gradient)
  bool finite_differences = true;  // false: a training forward draws anew (dropout)
  int64_t batch = 2;
  uint64_t seed = 7;  // the inputs' and weights' draw
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

std::vector<OpCase> cases() {
  const std::string vec6 = R"({ name: "x", shape: [6] })";
  const std::string img = R"({ name: "x", shape: [5, 4, 3] })";
  const std::string seq = R"({ name: "x", shape: [4, 6] })";
  const std::string seq_mask = R"({ name: "x", shape: [4, 6] }, { name: "mask", shape: [4], mask: true })";
  auto activation = [&](const std::string& op, Draw draw = Draw::Uniform) {
    return OpCase{op, op, cat(R"({ name: "y", op: ")", op, R"(", inputs: ["x"] })"), vec6, draw};
  };
  std::vector<OpCase> c = {
      {"conv2d", "conv2d_strided_padded", R"({ name: "y", op: "conv2d", inputs: ["x"], conv2d: { out_channels: 4, kernel: [3], stride: [2], padding: [1] } })", img},
      {"conv2d", "conv2d_depthwise", R"({ name: "y", op: "conv2d", inputs: ["x"], conv2d: { out_channels: 3, kernel: [3], padding: [1], groups: 3 } })", img},
      {"conv2d", "conv2d_pooled_1x1", R"({ name: "p", op: "global_avg_pool", inputs: ["x"] },
        { name: "y", op: "conv2d", inputs: ["p"], conv2d: { out_channels: 5, kernel: [1] } })", img},
      {"linear", "linear", R"({ name: "y", op: "linear", inputs: ["x"], linear: { out_features: 5 } })", vec6},
      {"linear", "linear_tokens_lora", R"({ name: "y", op: "linear", inputs: ["x"], linear: { out_features: 5 }, lora: { rank: 2, alpha: 4 } })", seq},
      activation("relu", Draw::AwayFromZero),
      activation("relu6", Draw::AwayFromZero),
      activation("hardswish", Draw::AwayFromZero),
      activation("gelu"),
      activation("gelu_tanh"),
      activation("sigmoid"),
      activation("tanh"),
      activation("silu"),
      activation("hardsigmoid", Draw::AwayFromZero),
      activation("softmax"),
      {"max_pool2d", "max_pool2d", R"({ name: "y", op: "max_pool2d", inputs: ["x"], pool: { kernel: [2] } })", img, Draw::Spaced},
      {"avg_pool2d", "avg_pool2d_padded", R"({ name: "y", op: "avg_pool2d", inputs: ["x"], pool: { kernel: [3], stride: [2], padding: [1] } })", img},
      {"global_avg_pool", "global_avg_pool", R"({ name: "y", op: "global_avg_pool", inputs: ["x"] })", img},
      {"batch_norm", "batch_norm", R"({ name: "y", op: "batch_norm", inputs: ["x"] })", img, Draw::Uniform, 0, false, true, 3},
      {"flatten", "flatten", R"({ name: "f", op: "flatten", inputs: ["x"] }, { name: "y", op: "linear", inputs: ["f"], linear: { out_features: 3 } })", img},
      // Layer shards' joins in a group of one member (the sum of one is the value itself):
      // a copy forward and back; pipeline.replicas' LayerShards cases run them over 2 members.
      {"tp_copy", "tp_copy", R"({ name: "c", op: "tp_copy", inputs: ["x"] }, { name: "y", op: "linear", inputs: ["c"], linear: { out_features: 3 } })", vec6},
      {"tp_reduce", "tp_reduce", R"({ name: "l", op: "linear", inputs: ["x"], linear: { out_features: 3 } }, { name: "y", op: "tp_reduce", inputs: ["l"] })", vec6},
      {"add", "add_residual", R"({ name: "l", op: "linear", inputs: ["x"], linear: { out_features: 6 } }, { name: "y", op: "add", inputs: ["l", "x"] })", vec6},
      {"concat", "concat_two_branches", R"({ name: "l", op: "linear", inputs: ["x"], linear: { out_features: 3 } }, { name: "y", op: "concat", inputs: ["x", "l"] })", vec6},
      // mul: MobileNetV3's squeeze-excitation (an image times its channels' gates) and a
      // product of one shape (a gated unit)
      {"mul", "mul_channel_gates", R"({ name: "p", op: "global_avg_pool", inputs: ["x"] },
        { name: "g", op: "conv2d", inputs: ["p"], conv2d: { out_channels: 3, kernel: [1] } },
        { name: "s", op: "hardsigmoid", inputs: ["g"] },
        { name: "y", op: "mul", inputs: ["x", "s"] })", img},
      {"mul", "mul_same_shape", R"({ name: "l", op: "linear", inputs: ["x"], linear: { out_features: 6 } },
        { name: "y", op: "mul", inputs: ["l", "x"] })", seq},
      {"dropout", "dropout", R"({ name: "y", op: "dropout", inputs: ["x"], dropout: { p: 0.25 } })", R"({ name: "x", shape: [64] })",
       Draw::Uniform, 0, false, false},
      {"layer_norm", "layer_norm_tokens", R"({ name: "y", op: "layer_norm", inputs: ["x"] })", seq},
      {"attention", "attention_masked", R"({ name: "q", op: "linear", inputs: ["x"], linear: { out_features: 8 } },
        { name: "k", op: "linear", inputs: ["x"], linear: { out_features: 8 } },
        { name: "v", op: "linear", inputs: ["x"], linear: { out_features: 8 } },
        { name: "y", op: "attention", inputs: ["q", "k", "v", "mask"], attention: { heads: 2 } })", seq_mask},
      {"attention", "attention_causal", R"({ name: "q", op: "linear", inputs: ["x"], linear: { out_features: 8 } },
        { name: "y", op: "attention", inputs: ["q", "q", "q"], attention: { heads: 4, causal: true } })", seq},
      {"token_pool", "token_pool_masked_mean", R"({ name: "y", op: "token_pool", inputs: ["x", "mask"], token_pool: { mode: "mean" } })", seq_mask},
      {"token_pool", "token_pool_first", R"({ name: "y", op: "token_pool", inputs: ["x"] })", seq},
      {"embedding", "embedding", R"({ name: "y", op: "embedding", inputs: ["x"], embedding: { count: 10, features: 6 } })",
       R"({ name: "x", shape: [4], dtype: "int32" })", Draw::Uniform, 10, true},
      {"position_embedding", "position_embedding", R"({ name: "y", op: "position_embedding", inputs: ["x"], embedding: { count: 5 } })", seq},
      // with a token-type table, its row 0 at every token (Hugging Face's one segment)
      {"position_embedding", "position_embedding_types",
       R"({ name: "y", op: "position_embedding", inputs: ["x"], embedding: { count: 5, types: 2 } })", seq},
      {"layout_embedding", "layout_embedding", R"({ name: "y", op: "layout_embedding", inputs: ["x", "boxes"], embedding: { count: 9 } })",
       R"({ name: "x", shape: [4, 6] }, { name: "boxes", shape: [4, 4], dtype: "int32" })", Draw::Uniform, 9},
      {"class_token", "class_token", R"({ name: "y", op: "class_token", inputs: ["x"] })", seq},
      // slice: a packed in-projection's query, key and value (nn.MultiheadAttention's), and a
      // middle axis of an image (rows 1..3 of 5)
      {"slice", "slice_packed_qkv", R"({ name: "p", op: "linear", inputs: ["x"], linear: { out_features: 12 } },
        { name: "q", op: "slice", inputs: ["p"], slice: { axis: -1, start: 0, end: 4 } },
        { name: "k", op: "slice", inputs: ["p"], slice: { axis: 1, start: 4, end: 8 } },
        { name: "v", op: "slice", inputs: ["p"], slice: { start: 8, end: 12 } },
        { name: "y", op: "attention", inputs: ["q", "k", "v"], attention: { heads: 2 } })", seq},
      {"slice", "slice_image_rows", R"({ name: "y", op: "slice", inputs: ["x"], slice: { axis: 0, start: 1, end: 4 } })", img},
      // reshape and transpose: a channel shuffle in tandem's layout (ShuffleNet's, 2 groups of
      // 3: [H, W, 2, 3] -> [H, W, 3, 2]), and an image's axes turned to torch's [C, H, W]
      {"reshape", "reshape_channel_shuffle", R"({ name: "l", op: "conv2d", inputs: ["x"], conv2d: { out_channels: 6, kernel: [1] } },
        { name: "g", op: "reshape", inputs: ["l"], reshape: { shape: [5, 4, 2, 3] } },
        { name: "t", op: "transpose", inputs: ["g"], transpose: { perm: [0, 1, 3, 2] } },
        { name: "y", op: "reshape", inputs: ["t"], reshape: { shape: [5, 4, 6] } })", img},
      {"transpose", "transpose_image_to_chw", R"({ name: "y", op: "transpose", inputs: ["x"], transpose: { perm: [2, 0, 1] } })", img},
      {"transpose", "transpose_tokens_features", R"({ name: "t", op: "transpose", inputs: ["x"], transpose: { perm: [1, 0] } },
        { name: "y", op: "linear", inputs: ["t"], linear: { out_features: 3 } })", seq},
      // reduce: the mean over an image's rows and columns (a permute first: channels stay),
      // and the sum over a sequence's features (the last axis, no permute)
      {"reduce", "reduce_mean_image_rows_columns", R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { mode: "mean", axes: [0, 1] } })", img},
      {"reduce", "reduce_sum_features", R"({ name: "l", op: "linear", inputs: ["x"], linear: { out_features: 5 } },
        { name: "y", op: "reduce", inputs: ["l"], reduce: { axes: [-1] } })", seq},
      {"reduce", "reduce_sum_middle_axis", R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { mode: "sum", axes: [1] } })", img},
      // max and min: an image's maximum over rows and columns (a global max pool; a permute
      // first), a sequence's minimum over its features; spaced values, so no two tie and a
      // finite difference never swaps the extreme
      {"reduce", "reduce_max_image_rows_columns", R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { mode: "max", axes: [0, 1] } })",
       img, Draw::Spaced},
      {"reduce", "reduce_min_features", R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { mode: "min", axes: [-1] } })", seq,
       Draw::Spaced},
      // binary: an image less its channels' means ([3] repeated over rows and columns), divided
      // by a column's gate ([1, 4, 1]: the repeated axes not last, a permute in backward); a
      // token less the first (a [1, 6] slice repeated over the tokens); scalars either side
      {"binary", "binary_sub_channel_means", R"({ name: "m", op: "reduce", inputs: ["x"], reduce: { mode: "mean", axes: [0, 1] } },
        { name: "y", op: "binary", inputs: ["x", "m"], binary: { mode: "sub" } })", img},
      {"binary", "binary_div_column_gates", R"({ name: "c", op: "reduce", inputs: ["x"], reduce: { axes: [0, 2] } },
        { name: "r", op: "reshape", inputs: ["c"], reshape: { shape: [1, 4, 1] } },
        { name: "s", op: "sigmoid", inputs: ["r"] },
        { name: "g", op: "binary", inputs: ["s"], binary: { mode: "add", scalar: 0.5 } },
        { name: "y", op: "binary", inputs: ["x", "g"], binary: { mode: "div" } })", img},
      {"binary", "binary_mul_rows_both_ways", R"({ name: "c", op: "reduce", inputs: ["x"], reduce: { axes: [1, 2] } },
        { name: "r", op: "reshape", inputs: ["c"], reshape: { shape: [5, 1, 1] } },
        { name: "y", op: "binary", inputs: ["r", "x"], binary: { mode: "mul" } })", img},
      {"binary", "binary_tokens_less_the_first", R"({ name: "f", op: "slice", inputs: ["x"], slice: { axis: 0, start: 0, end: 1 } },
        { name: "l", op: "linear", inputs: ["f"], linear: { out_features: 6 } },
        { name: "y", op: "binary", inputs: ["x", "l"], binary: { mode: "sub" } })", seq},
      {"binary", "binary_scalars_first", R"({ name: "s", op: "sigmoid", inputs: ["x"] },
        { name: "t", op: "binary", inputs: ["s"], binary: { mode: "sub", scalar: 1.5, scalar_first: true } },
        { name: "y", op: "binary", inputs: ["t"], binary: { mode: "div", scalar: 2, scalar_first: true } })", seq},
      {"binary", "binary_scalar_times", R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "mul", scalar: -0.75 } })", vec6},
      // comparisons: 1 where true, else 0, no gradient; a gate that keeps the values above a
      // threshold (x * (x > t), the threshold between the spaced draw's values, so a finite
      // difference never crosses it), a token's features against a linear of the first token
      {"binary", "binary_compare_threshold_gate", R"({ name: "c", op: "binary", inputs: ["x"], binary: { mode: "greater", scalar: 0.005 } },
        { name: "y", op: "binary", inputs: ["x", "c"], binary: { mode: "mul" } })", seq, Draw::Spaced},
      {"binary", "binary_compare_two_tensors", R"({ name: "m", op: "reduce", inputs: ["x"], reduce: { mode: "mean", axes: [0] } },
        { name: "r", op: "reshape", inputs: ["m"], reshape: { shape: [1, 6] } },
        { name: "c", op: "binary", inputs: ["r", "x"], binary: { mode: "less_equal" } },
        { name: "e", op: "binary", inputs: ["c"], binary: { mode: "equal", scalar: 0 } },
        { name: "g", op: "binary", inputs: ["x", "c"], binary: { mode: "mul" } },
        { name: "y", op: "binary", inputs: ["g", "e"], binary: { mode: "sub" } })", seq, Draw::Spaced},
      // where: a leaky gate (x > t ? x : 0.1 x); a constant branch, and -inf before a softmax
      // (masked_fill); cond [4, 1] picking between x [4, 6] and a linear's row [6] (both
      // repeated: sums in backward)
      {"where", "where_leaky_gate", R"({ name: "c", op: "binary", inputs: ["x"], binary: { mode: "greater", scalar: 0.005 } },
        { name: "s", op: "binary", inputs: ["x"], binary: { mode: "mul", scalar: 0.1 } },
        { name: "y", op: "where", inputs: ["c", "x", "s"] })", seq, Draw::Spaced},
      {"where", "where_masked_fill_softmax", R"({ name: "c", op: "binary", inputs: ["x"], binary: { mode: "less", scalar: -0.595 } },
        { name: "w", op: "where", inputs: ["c", "x"], where: { a: -inf } },
        { name: "y", op: "softmax", inputs: ["w"] })", seq, Draw::Spaced},
      {"where", "where_constant_first", R"({ name: "c", op: "binary", inputs: ["x"], binary: { mode: "greater_equal", scalar: 0.005 } },
        { name: "y", op: "where", inputs: ["c", "x"], where: { a: 2.5 } })", vec6, Draw::Spaced},
      {"where", "where_broadcast_branches", R"({ name: "m", op: "reduce", inputs: ["x"], reduce: { mode: "mean", axes: [1] } },
        { name: "r", op: "reshape", inputs: ["m"], reshape: { shape: [4, 1] } },
        { name: "c", op: "binary", inputs: ["r"], binary: { mode: "greater", scalar: 0.0 } },
        { name: "f", op: "slice", inputs: ["x"], slice: { axis: 0, start: 0, end: 1 } },
        { name: "l", op: "linear", inputs: ["f"], linear: { out_features: 6 } },
        { name: "v", op: "reshape", inputs: ["l"], reshape: { shape: [6] } },
        { name: "y", op: "where", inputs: ["c", "x", "v"] })", seq},
      // expand: a vector's [1, 6] repeated over 4 rows (into a linear), an image's channel
      // means [1, 1, 3] over its rows and columns, a [6] to [3, 6] (a leading axis added)
      {"expand", "expand_rows", R"({ name: "r", op: "reshape", inputs: ["x"], reshape: { shape: [1, 6] } },
        { name: "e", op: "expand", inputs: ["r"], expand: { shape: [4, 6] } },
        { name: "y", op: "linear", inputs: ["e"], linear: { out_features: 3 } })", vec6},
      {"expand", "expand_channel_means", R"({ name: "m", op: "reduce", inputs: ["x"], reduce: { mode: "mean", axes: [0, 1] } },
        { name: "r", op: "reshape", inputs: ["m"], reshape: { shape: [1, 1, 3] } },
        { name: "e", op: "expand", inputs: ["r"], expand: { shape: [5, 4, 1] } },
        { name: "y", op: "binary", inputs: ["x", "e"], binary: { mode: "mul" } })", img},
      {"expand", "expand_leading_axis", R"({ name: "e", op: "expand", inputs: ["x"], expand: { shape: [3, 6] } },
        { name: "y", op: "linear", inputs: ["e"], linear: { out_features: 2 } })", vec6},
      // a trained operand: a layer scale over the features (x * gamma), one per row less the
      // input, one over an image's rows and channels (repeated over the batch and the columns:
      // a permute in backward), divided by a positive one
      {"binary", "binary_trained_scale", R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "mul", operand: [6] } })", seq},
      {"binary", "binary_trained_rows_first", R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "sub", operand: [4, 1], scalar_first: true } })", seq},
      {"binary", "binary_trained_image_shift", R"({ name: "a", op: "binary", inputs: ["x"], binary: { mode: "add", operand: [5, 1, 3] } },
        { name: "y", op: "binary", inputs: ["a"], binary: { mode: "div", operand: [3] } })", img},
      // matmul: scores written by hand (q @ x^T); heads [2, 4, 4] times one value matrix [4, 3]
      // (b's missing head axis repeated); an image's rows times a [1, 3, 4] matrix (b's axis of
      // 1 repeated over 5)
      {"matmul", "matmul_scores", R"({ name: "q", op: "linear", inputs: ["x"], linear: { out_features: 6 } },
        { name: "t", op: "transpose", inputs: ["x"], transpose: { perm: [1, 0] } },
        { name: "y", op: "matmul", inputs: ["q", "t"] })", seq},
      {"matmul", "matmul_heads_times_shared_values", R"({ name: "h", op: "linear", inputs: ["x"], linear: { out_features: 8 } },
        { name: "r", op: "reshape", inputs: ["h"], reshape: { shape: [4, 2, 4] } },
        { name: "p", op: "transpose", inputs: ["r"], transpose: { perm: [1, 0, 2] } },
        { name: "v", op: "linear", inputs: ["x"], linear: { out_features: 3 } },
        { name: "y", op: "matmul", inputs: ["p", "v"] })", seq},
      {"matmul", "matmul_rows_times_repeated_matrix", R"({ name: "m", op: "reduce", inputs: ["x"], reduce: { mode: "mean", axes: [0] } },
        { name: "t", op: "transpose", inputs: ["m"], transpose: { perm: [1, 0] } },
        { name: "r", op: "reshape", inputs: ["t"], reshape: { shape: [1, 3, 4] } },
        { name: "y", op: "matmul", inputs: ["x", "r"] })", img},
      {"tokens", "tokens", R"({ name: "t", op: "tokens", inputs: ["x"] }, { name: "y", op: "linear", inputs: ["t"], linear: { out_features: 2 } })", img},
      // heads' hidden ReLU: a draw whose pre-activations stay clear of the kink by more than
      // the finite differences' step
      {"heads", "heads", R"({ name: "y", op: "heads", inputs: ["x"], heads: { count: 3, hidden: 4, out_features: 2 } })", vec6,
       Draw::Uniform, 0, false, true, 2, 1},
  };
  return c;
}

// The case's inputs for `batch` samples: floats as drawn, ids below the case's bound (a box
// sorted so x0 <= x1 and y0 <= y1), masks of 1 with the second sample's last quarter padding.
std::vector<Tensor> inputs_of(const OpCase& c, const ModelSpec& spec, Rng& rng) {
  std::vector<Tensor> out;
  for (const InputSpec& in : spec.inputs) {
    int64_t dims[kMaxRank + 1] = {c.batch};
    for (int i = 0; i < in.shape.rank(); ++i) dims[i + 1] = in.shape[i];
    Tensor t = Tensor::empty(Shape::of(dims, in.shape.rank() + 1));
    const int64_t per = in.shape.numel();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (in.mask) {
        t[i] = (i / per == 1 && i % per >= per - per / 4) ? 0.0f : 1.0f;
      } else if (in.integer) {
        t[i] = static_cast<float>(rng.below(static_cast<uint64_t>(c.ids_below)));
      } else if (c.draw == Draw::AwayFromZero) {
        const float m = rng.uniform(0.1f, 1.0f);
        t[i] = rng.below(2) ? m : -m;
      } else {
        t[i] = rng.uniform(-1.0f, 1.0f);
      }
    }
    if (in.integer && in.shape.rank() == 2 && in.shape[1] == 4)  // boxes
      for (int64_t b = 0; b < t.numel(); b += 4) {
        if (t[b] > t[b + 2]) std::swap(t[b], t[b + 2]);
        if (t[b + 1] > t[b + 3]) std::swap(t[b + 1], t[b + 3]);
      }
    if (c.draw == Draw::Spaced && !in.integer && !in.mask) {
      std::vector<int64_t> order(static_cast<std::size_t>(t.numel()));
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
      for (std::size_t i = order.size(); i-- > 1;) std::swap(order[i], order[rng.below(i + 1)]);
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = -1.0f + 0.03f * static_cast<float>(order[static_cast<std::size_t>(i)]);
    }
    out.push_back(std::move(t));
  }
  return out;
}

ModelSpec spec_of(const OpCase& c) {
  return parse_model_json(cat("{ name: \"case.", c.name, "\", inputs: [", c.inputs, "], nodes: [", c.nodes, "], output: \"y\" }"),
                          cat("op case ", c.name));
}

// Guard zones around every tensor a case makes (its activations, gradients, parameters and
// the layers' scratch), as tests/op_tests.cpp puts around a kernel's output: each tensor's
// storage is exactly its values between two runs of a canary, checked when the storage is
// released (inside the case), and its values start as NaN, so a layer that stores past its
// tensor's end or before its start, or reads what it never wrote, fails its case. Where the
// backend keeps tensors itself (cuda, the deferring test backend) it installs its own storage
// and the case runs without guards.
constexpr std::size_t kGuardFloats = 32;  // 128 bytes a side: the values stay 64-byte aligned
constexpr uint32_t kCanaryBits = 0xdeadbeefu;

struct GuardedMemory {
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::map<void*, std::size_t>& used() {  // base -> the values' floats
    static std::map<void*, std::size_t> u;
    return u;
  }
  static void* allocate(std::size_t, std::size_t used_bytes) {
    const std::size_t n = used_bytes / sizeof(float), total = n + 2 * kGuardFloats;
    auto* base = static_cast<float*>(::operator new[](total * sizeof(float), std::align_val_t{kTensorAlignment}));
    for (std::size_t i = 0; i < total; ++i) std::memcpy(base + i, &kCanaryBits, sizeof kCanaryBits);
    std::fill_n(base + kGuardFloats, n, std::numeric_limits<float>::quiet_NaN());
    {
      std::lock_guard lock(mu());
      used()[base + kGuardFloats] = n;
    }
    return base + kGuardFloats;
  }
  static void release(void* p) {
    std::size_t n = 0;
    {
      std::lock_guard lock(mu());
      n = used().at(p);
      used().erase(p);
    }
    float* base = static_cast<float*>(p) - kGuardFloats;
    for (std::size_t i = 0; i < kGuardFloats; ++i) {
      uint32_t before = 0, after = 0;
      std::memcpy(&before, base + i, sizeof before);
      std::memcpy(&after, base + kGuardFloats + n + i, sizeof after);
      if (before != kCanaryBits) ADD_FAILURE() << "a layer wrote " << (kGuardFloats - i) << " floats before a tensor of " << n;
      if (after != kCanaryBits) ADD_FAILURE() << "a layer wrote " << (i + 1) << " floats past the end of a tensor of " << n;
      if (before != kCanaryBits || after != kCanaryBits) break;
    }
    ::operator delete[](base, std::align_val_t{kTensorAlignment});
  }
};
constexpr TensorMemory kGuardedMemory{0, GuardedMemory::allocate, GuardedMemory::release};

// Installed for the case's scope where the backend under test keeps tensors on the host.
struct GuardsInstalled {
  const bool on = backend_under_test() != "cuda" && backend_under_test() != "deferred";
  GuardsInstalled() {
    if (on) set_tensor_memory(&kGuardedMemory);
  }
  ~GuardsInstalled() {
    if (on) set_tensor_memory(nullptr);
  }
};

TEST(OpCaseGuards, CatchAStoreOutsideATensorAndStartAsNan) {
  if (!GuardsInstalled().on) GTEST_SKIP() << backend_under_test() << " keeps its tensors itself: no guards";
  EXPECT_NONFATAL_FAILURE(
      {
        GuardsInstalled guards;
        Tensor t = Tensor::empty({5});
        t.data()[5] = 0.0f;
      },
      "a layer wrote 1 floats past the end of a tensor of 5");
  EXPECT_NONFATAL_FAILURE(
      {
        GuardsInstalled guards;
        Tensor t = Tensor::empty({3, 2});
        t.data()[-2] = 0.0f;
      },
      "a layer wrote 2 floats before a tensor of 6");
  GuardsInstalled guards;
  const Tensor t = Tensor::empty({4});
  EXPECT_TRUE(std::isnan(t[0]) && std::isnan(t[3]));
}

class OpCases : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpCases, MatchesTheReferenceAndFiniteDifferences) {
  const OpCase& c = GetParam();
  GuardsInstalled guards;  // before every tensor of the case, released before it goes
  const ModelSpec spec = spec_of(c);
  const Graph graph = Graph::build(spec);
  for (const NodeSpec& n : spec.nodes)
    if (const Support s = make_test_backend(backend_under_test())->supports(n.op, {}); !s)
      GTEST_SKIP() << backend_under_test() << " has no " << n.op << ": " << s.why;
  Rng rng(c.seed);
  const std::vector<Tensor> inputs = inputs_of(c, spec, rng);
  auto backend = make_test_backend(backend_under_test());
  auto reference = make_backend("reference");
  Network net(graph, *backend, c.seed), ref(graph, *reference, c.seed);
  struct Alone final : Reducer {  // a shard group of one member
    void all_sum(std::span<float>) override {}
  } alone;
  net.set_reducer(&alone);
  ref.set_reducer(&alone);
  for (Param* p : net.all_params()) {  // the same weights on both
    Tensor& v = p->value();
    const Tensor& w = ref.param(p->name()).value();
    for (int64_t i = 0; i < v.numel(); ++i) v[i] = w[i];
    p->bump_version();
  }
  const bool input_grad = !c.ids_first;
  const Tensor y = net.forward(inputs, 0).clone();
  const Tensor want = ref.forward(inputs, 0).clone();
  ASSERT_EQ(y.shape(), want.shape());
  expect_close(y.data(), want.data(), y.numel(), c.name + ": forward", 2e-4f);
  const Tensor r = random_tensor(y.shape(), rng);
  net.zero_grad();
  ref.zero_grad();
  const Tensor dx = input_grad ? net.backward(r, 0, true).clone() : (net.backward(r, 0, false), Tensor());
  const Tensor dx_want = input_grad ? ref.backward(r, 0, true).clone() : (ref.backward(r, 0, false), Tensor());
  if (input_grad) expect_close(dx.data(), dx_want.data(), dx.numel(), c.name + ": input gradient", 2e-4f);
  for (Param* p : net.params())
    expect_close(p->grad().data(), ref.param(p->name()).grad().data(), p->grad().numel(), c.name + ": gradient of " + p->name(), 2e-4f);
  if (c.finite_differences) check_network_gradients(net, inputs, r, dx, input_grad, c.name, c.name + ".", rng);
}

INSTANTIATE_TEST_SUITE_P(Registry, OpCases, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

TEST(OpCasesCoverage, EveryRegisteredOpHasACase) {
  std::set<std::string> covered, names;
  for (const OpCase& c : cases()) {
    covered.insert(c.op);
    EXPECT_TRUE(names.insert(c.name).second) << "two cases named " << c.name;
    const ModelSpec spec = spec_of(c);
    bool has_op = false;
    for (const NodeSpec& n : spec.nodes) has_op = has_op || n.op == c.op;
    EXPECT_TRUE(has_op) << "case " << c.name << " has no " << c.op << " node";
  }
  for (const std::string& op : known_ops()) EXPECT_TRUE(covered.count(op)) << "op '" << op << "' has no case in cases()";
}

}  // namespace
}  // namespace tandem::test
