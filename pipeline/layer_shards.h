// Layer shards of a stage (tensor parallel, Megatron-LM's split of an MLP block): S members
// each hold a slice of the stage's linear pairs and compute together, summing through their
// shard group. A pair is a linear A whose output, through elementwise activations only (each
// node read by the next alone), is the only input of a linear B: A is split by its output
// features (columns: member r holds rows [r H/S, (r+1) H/S) of A's weight and bias), B by
// its input features (member r holds those columns of B's weight; B's bias on member 0
// alone). A tp_copy node before A sums A's input gradient over the members going back, a
// tp_reduce node after B sums the members' partial outputs going forward: one all-sum a
// block each way. Every other layer is whole on every member, computed alike on the same
// input, and its gradients are the same on every member. So the members together compute
// the unsplit stage's outputs and gradients, and each member's optimizer, updating its own
// slices and its own copy of the rest, keeps them so.
//
// Attention splits by heads the same way (Megatron-LM's attention block): the query, key and
// value linears, which read one input and feed an attention node alone, are split by output
// features (member r holds heads [r H/S, (r+1) H/S), whose features are contiguous), the
// attention node runs H/S heads, and the linear reading its output (through activations
// alone) is split by input features; one tp_copy before the three, one tp_reduce after.
//
// Not split: convolutions, and an attention whose projections are one fused linear (sliced
// after). A stage without a pair is refused, and one with dropout (its masks' seeds
// come from the initialisation's stream, which the members use up differently). Gradient
// clipping by the global norm (OptimizerOptions::clip_norm) would take each member's own
// norm, not the stage's: leave it off on a split stage.
#pragma once

#include <string>
#include <vector>

#include "collective/group.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/parallel.h"

namespace tandem {

struct LinearPair {
  std::string columns, rows;  // A (split by output features) and B (split by input features)
  // An attention block: `columns` is its query's linear, `also` its key's and value's (split
  // like A), `attention` the node between them and B (its heads split).
  std::vector<std::string> also;
  std::string attention;
};

// The spec's linear pairs that split over `shards` members (A's output features divisible by
// it; no LoRA on either), attention blocks (heads divisible by it) first.
std::vector<LinearPair> linear_pairs(const ModelSpec& spec, int shards);

// Member `rank` of `shards`' spec: each pair's linears at their slice's size, a tp_copy before
// A and a tp_reduce after B (named "<A>.tp_copy" and "<B>.tp_reduce"), the rest as it was.
// An Error naming the model when it has no pair to split.
ModelSpec layer_shard_spec(const ModelSpec& spec, int rank, int shards);

// A member's shard network takes its slices of the unsplit network's weights, and the rest
// whole (they start from the unsplit stage's initialisation).
void load_layer_shard(Network& whole, Network& shard, const std::vector<LinearPair>& pairs, int rank, int shards);
// The other way: a member's slices written into the unsplit network's weights (the rest
// copied too: every member holds the same).
void store_layer_shard(Network& shard, Network& whole, const std::vector<LinearPair>& pairs, int rank, int shards);

// A shard group's sums over a collective Group.
class GroupReducer final : public Reducer {
 public:
  explicit GroupReducer(Group& group) : group_(group) {}
  void all_sum(std::span<float> values) override { group_.all_sum(values); }

 private:
  Group& group_;
};

}  // namespace tandem
