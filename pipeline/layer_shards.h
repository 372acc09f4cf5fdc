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

#include <array>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "collective/group.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/parallel.h"
#include "pipeline/stage.h"

namespace tandem {

struct LinearPair {
  std::string columns, rows;  // A (split by output features) and B (split by input features)
  // An attention block: `columns` is its query's linear, `also` its key's and value's (split
  // like A), `attention` the node between them and B (its heads split).
  std::vector<std::string> also;
  std::string attention;
};

// The spec's linear pairs that split over `shards` members (A's output features divisible by
// it; no LoRA on either), attention blocks (heads divisible by it) first. With `within`, only
// pairs whose nodes (the activations between them included) are all in it.
std::vector<LinearPair> linear_pairs(const ModelSpec& spec, int shards, const std::set<std::string>* within = nullptr);

// Member `rank` of `shards`' spec: each pair's linears at their slice's size, a tp_copy before
// A and a tp_reduce after B (named "<A>.tp_copy" and "<B>.tp_reduce"), the rest as it was.
// An Error naming the model when it has no pair to split. `within`: as linear_pairs's.
ModelSpec layer_shard_spec(const ModelSpec& spec, int rank, int shards, const std::set<std::string>* within = nullptr);

// Stage `index` of the model cut at `cuts` (Graph::partition), as member `rank` of `shards`
// holds it: the pairs inside the stage split (a pair is inside when none of its nodes is a
// cut, so the stage's inputs and output are the unsplit stage's), the rest whole. An Error
// naming the stage when it has no pair to split.
struct LayerShardStage {
  Graph graph;
  std::vector<LinearPair> pairs;
};
LayerShardStage layer_shard_stage(const ModelSpec& spec, const std::vector<std::string>& cuts, std::size_t index,
                                  int rank, int shards);

// A member's shard network takes its slices of the unsplit network's weights, and the rest
// whole (they start from the unsplit stage's initialisation).
void load_layer_shard(Network& whole, Network& shard, const std::vector<LinearPair>& pairs, int rank, int shards);
// The other way: a member's slices written into the unsplit network's weights (the rest
// copied too: every member holds the same).
void store_layer_shard(Network& shard, Network& whole, const std::vector<LinearPair>& pairs, int rank, int shards);

// The unsplit network's weights and buffers, put together from every member's slices into
// member 0's `whole` (null on the others): a collective each member calls with its own shard,
// each slice broadcast in turn (no member but 0 holds more than one slice at a time).
void gather_layer_shard(Group& group, Network& shard, Network* whole, const std::vector<LinearPair>& pairs, int rank,
                        int shards);

// Member 0 of a stage's layer shards: the stage's calls, told to the other members over their
// group before it runs them (Stage::set_mirror), so they run the same on their slices. The
// leader alone has links; what the others need of them (inputs, the output's gradient) comes
// in the calls. Besides the stage's calls it tells the party's own: the checkpoints every
// member holds, saving and restoring one, gathering the weights, the run's end. A GroupLost
// from any of them means a member is gone: form the group again (FixedGroup::form), then
// restart() and go back to a checkpoint, as after a lost link.
class LayerShardLeader final : public StageMirror {
 public:
  explicit LayerShardLeader(Group& group) : group_(group) {}
  void forward(std::span<const Tensor> inputs, int slot, bool training) override;
  void backward(const Tensor& grad_output, int slot, bool want_input_grad, bool defer_weights) override;
  void backward_weights(int slot) override;
  void step(uint64_t samples, float lr_scale) override;
  void zero_grad() override;
  void stash_weights() override;
  void use_stash(bool stashed) override;
  void reset() override;

  // Of `mine` (this member's checkpoints' steps), those every member holds.
  std::vector<uint64_t> common_steps(const std::vector<uint64_t>& mine);
  void save(uint64_t step);     // every other member saves its checkpoint of `step`
  void restore(uint64_t step);  // and restores it (0: the initial state)
  void gather();                // the others take part in gather_layer_shard (call it next)
  void end(bool failed);        // the run is over: the others return (failed: with an Error)
  // The terms every member must share (a digest of the model, cut, stage, shard count, seed
  // and optimizer): a member whose own differ stops with an Error. First on each session.
  void hello(const std::array<uint8_t, 32>& terms);
  // A new session of the group: the calls are counted from 0 again.
  void restart() { calls_ = 0; }

 private:
  void tell(uint32_t kind, std::span<const Tensor> tensors, uint32_t slot = 0, uint32_t a = 0, uint64_t value = 0,
            float number = 0);
  Group& group_;
  uint32_t calls_ = 0;
  std::vector<float> scratch_;
};

// The other members' side: what a member r > 0 does with what member 0 tells.
struct LayerShardFollower {
  std::function<bool(uint64_t step)> has;        // whether it holds a checkpoint of `step`
  std::function<void(uint64_t step)> save;       // saves its checkpoint of `step`
  std::function<void(uint64_t step)> restore;    // restores it (0: the initial state)
  std::function<void()> gather;                  // calls gather_layer_shard
  std::array<uint8_t, 32> terms{};               // its own terms, checked against member 0's
};
// Runs the calls member 0 tells on `stage` until it ends the run (returns the calls run). A
// GroupLost when the group is lost (member 0 or another gone): form it again and call again.
// An Error when a call is not what member 0 would tell (the members run different builds).
uint64_t follow_layer_shard(Stage& stage, Group& group, const LayerShardFollower& follower);

// A shard group's sums over a collective Group.
class GroupReducer final : public Reducer {
 public:
  explicit GroupReducer(Group& group) : group_(group) {}
  void all_sum(std::span<float> values) override { group_.all_sum(values); }

 private:
  Group& group_;
};

}  // namespace tandem
