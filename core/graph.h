// Graph: the model spec as a DAG in topological order with per-sample shapes inferred, and
// split(cut) into the front shard (edge) and back shard (cloud) at a named node.
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/model_spec.h"
#include "core/tensor.h"

namespace tandem {

struct GraphInput {
  std::string name;
  Shape shape;  // per sample
  bool integer = false, mask = false;  // InputSpec's
  // Its first per-sample dimension is the sequence's length, which a micro-batch may run
  // shorter at (the graph's length_buckets()): the mask, ids and boxes; a back shard's cut
  // input when the cut's output is per token.
  bool tokens = false;
  bool marks_padding = false;  // InputSpec's: the data's 1s mark padding (data sets read 1 - mask)
  // Whether `v` is a value this input takes: a mask's 0 or 1; ids' and coordinates' integers
  // exact in f32 (|v| <= 2^24); anything else for an input of neither kind. What data sets
  // and the edge check their inputs with; rule() says it in words for their errors.
  bool accepts(double v) const;
  const char* rule() const;
};

struct GraphNode {
  NodeSpec spec;
  // For each input: index into inputs() when >= 0, else node index -(id + 1).
  std::vector<int> sources;
  Shape shape;  // per-sample output shape
  bool tokens = false;  // per token: shape[0] is the sequence's length (GraphInput::tokens)
};

class Graph {
 public:
  // Orders the nodes topologically, resolves inputs and infers shapes; errors name the node.
  static Graph build(const ModelSpec& spec);

  const std::string& name() const { return name_; }
  const std::vector<GraphInput>& inputs() const { return inputs_; }
  const std::vector<GraphNode>& nodes() const { return nodes_; }
  int output() const { return output_; }  // node index of the logits
  const GraphNode& node(const std::string& name) const;
  int find(const std::string& name) const;  // node index or -1
  const std::string& default_cut() const { return default_cut_; }
  // The lengths a micro-batch's sequences may run at (the mask's InputSpec::length_buckets,
  // the longest last); empty when they always run at the spec's. A graph with buckets has a
  // mask input or an input cut from one, and every node reading a sequence takes any length.
  const std::vector<int64_t>& length_buckets() const { return length_buckets_; }
  // The length the inputs run at (their tokens inputs' shape[1], all alike, one of the
  // buckets), or an Error naming the input; -1 when no input is per token.
  int64_t sequence_length(std::span<const Tensor> inputs) const;
  // A node's or input's per-sample shape at sequence length `length`.
  static Shape at_length(const Shape& shape, bool tokens, int64_t length);
  std::string buckets_text() const;  // "[32, 64, 128]", for errors
  // The spec's loss (loss.h), kept by both shards of a split.
  const std::string& loss() const { return loss_; }
  // Heads side by side in the output (a heads node's count), else 1: the loss's groups.
  int64_t output_groups() const;
  // The classes each group of the output scores (the labels' range): output size / groups.
  int64_t classes() const;
  // Parameter names in initialisation order: "<node>.weight", "<node>.bias" (core/ops).
  std::vector<std::string> param_names() const;
  // Per node index: whether it is `node` or a node `node` reads, directly or not (a front's
  // nodes when cut there).
  std::vector<bool> ancestors(int node) const;
  // The per-sample shapes of a node's inputs.
  std::vector<Shape> input_shapes(const GraphNode& node) const;

  // Front shard: the cut node and everything it depends on (and every graph input); back
  // shard: the rest, reading the cut's output as its first input and, when it reads one, the
  // graph's mask input as its second (graph_input.mask: the one input that may cross).
  // Refuses a cut crossed by any other tensor.
  // A U-shaped cut "A,B" (u_shaped_cut): the front up to A, and as the back shard the
  // middle, from A's output to B (its output is B's; it has no loss).
  std::pair<Graph, Graph> split(const std::string& cut) const;
  // A U-shaped cut's tail: from B's output to the model's output and the loss (the edge's).
  Graph tail(const std::string& cut) const;
  // The model cut at every node of `cuts` (in graph order, each after the one before): N =
  // cuts.size() + 1 stage graphs named "<model>.stage<i>". Stage 0 takes the graph's inputs;
  // stage i > 0 reads cut i-1's output as its first input and, when the mask input crosses
  // (split's rule, at every cut), the mask as its second; the last stage ends at the output
  // and keeps the loss. Errors name the cut and say which order the cuts must come in.
  std::vector<Graph> partition(const std::vector<std::string>& cuts) const;
  // A cut or a comma list of them (a U-shaped "A,B" too) with every name that is no node but
  // a module (a prefix of node names before a dot: "layer3" of "layer3.1.relu_1", as
  // `tandem import` names nodes after PyTorch's modules) replaced by that module's last node
  // in graph order; node names, "auto" and unknown names pass through unchanged (a list of
  // node names comes back as given, spaces and all).
  std::string cut_nodes(const std::string& cuts) const;

 private:
  // `buckets`: the length buckets (empty: none); with them every node reading a per-token
  // tensor must take any length (OpDef::sequence), else an Error names it.
  static Graph from_parts(std::string name, std::vector<GraphInput> inputs, std::vector<NodeSpec> nodes,
                          const std::string& output, std::vector<int64_t> buckets);
  void mark_tokens(GraphNode& node) const;
  std::string name_;
  std::vector<GraphInput> inputs_;
  std::vector<GraphNode> nodes_;
  int output_ = -1;
  std::string default_cut_;
  std::vector<int64_t> length_buckets_;
  std::string loss_ = "softmax_cross_entropy";
};

// "A,B,C" -> {"A", "B", "C"} (spaces around names dropped); an Error for an empty name.
std::vector<std::string> cut_list(const std::string& cuts);

// A U-shaped split names two cuts, "A,B": the edge runs the front (the inputs to A) and the
// tail (B to the loss), so the labels never leave it; the cloud runs the middle (A to B).
bool u_shaped_cut(const std::string& cut);
// "A,B" -> {"A", "B"}; throws Error when either is empty or there are more than two.
std::pair<std::string, std::string> u_shaped_cuts(const std::string& cut);

// Per-sample output shape of one node (its op's definition, core/ops), or an Error naming it.
Shape infer_shape(const NodeSpec& node, const std::vector<Shape>& input_shapes);

}  // namespace tandem
