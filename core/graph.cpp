#include "core/graph.h"

#include <cmath>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "core/ops/op.h"

namespace tandem {
namespace {

constexpr std::string_view kWhere = "graph";

}  // namespace

// A node's torch_names rename its own tensors (parameters; batch norm's statistics). Every
// tensor's name in PyTorch's state dict (its torch_names entry, else "<node>.<field>"; a batch
// norm's num_batches_tracked beside its running_var) is one no other tensor of the model has.
void check_torch_names(const NodeSpec& n, const std::vector<Shape>& in, std::set<std::string>& taken) {
  std::vector<std::string> fields;
  for (const ParamSpec& p : op_params(n, in)) fields.push_back(p.field);
  if (n.op == "batch_norm") fields.insert(fields.end(), {"running_mean", "running_var"});
  for (const auto& [field, name] : n.torch_names) {
    if (name.empty()) continue;  // a tensor PyTorch's model lacks (parse_model allows only a token-type table's)
    if (std::find(fields.begin(), fields.end(), field) == fields.end()) {
      std::string known;
      for (const std::string& f : fields) known += cat(known.empty() ? "" : ", ", f);
      fail(kWhere, cat("node '", n.name, "' (", n.op, "): field 'torch_names' renames '", field, "', which is none of its tensors (",
                       known.empty() ? "it has none" : known, ")"));
    }
    const std::string suffix = "." + field;  // torch's BatchNorm: <module>.weight, ... (num_batches_tracked follows running_var)
    if (n.op == "batch_norm" && (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0))
      fail(kWhere, cat("node '", n.name, "' (batch_norm): field 'torch_names' names '", field, "' '", name, "'; a batch norm's tensors "
                       "are '<module>", suffix, "' in PyTorch's state dict"));
  }
  for (const std::string& field : fields) {
    std::string name = cat(n.name, ".", field);
    for (const auto& [f, renamed] : n.torch_names)
      if (f == field) name = renamed;
    std::vector<std::string> names{name};
    if (n.op == "batch_norm" && field == "running_var")
      names.push_back(name.substr(0, name.size() - std::string("running_var").size()) + "num_batches_tracked");
    for (const std::string& taken_name : names)
      if (!taken.insert(taken_name).second)
        fail(kWhere, cat("node '", n.name, "' (", n.op, "): its tensor '", field, "' is '", taken_name,
                         "' in PyTorch's state dict, which another tensor of the model is called too (field 'torch_names' renames one)"));
  }
}

Shape infer_shape(const NodeSpec& n, const std::vector<Shape>& in) {
  const OpDef* d = find_op(n.op);
  if (!d) fail(kWhere, cat("node '", n.name, "': unknown op '", n.op, "'"));
  return d->infer_shape(n, in);
}

Graph Graph::build(const ModelSpec& spec) {
  std::vector<GraphInput> inputs;
  std::vector<int64_t> buckets;
  int64_t tokens = 0;
  for (const auto& in : spec.inputs)
    if (in.mask && !in.length_buckets.empty()) buckets = in.length_buckets, tokens = in.shape[0];
  // With buckets the mask, and the ids and boxes of its length, may run shorter.
  for (const auto& in : spec.inputs)
    inputs.push_back({in.name, in.shape, in.integer, in.mask,
                      tokens > 0 && (in.integer || in.mask) && in.shape[0] == tokens, in.marks_padding});
  Graph g = from_parts(spec.name, std::move(inputs), spec.nodes, spec.output, std::move(buckets));
  if (!g.length_buckets_.empty() && g.nodes_[static_cast<std::size_t>(g.output_)].tokens)
    fail(kWhere, cat("output node '", spec.output, "' is per token, so its size would follow the length buckets; pool "
                     "the tokens (token_pool) before the output, or drop field 'length_buckets'"));
  g.default_cut_ = spec.cut;
  g.loss_ = spec.loss;
  if (!g.default_cut_.empty()) {
    // A U-shaped cut names two nodes; u_shaped_cuts says what is wrong with its form.
    std::vector<std::string> named = {g.default_cut_};
    if (u_shaped_cut(g.default_cut_)) {
      const auto [a, b] = u_shaped_cuts(g.default_cut_);
      named = {a, b};
    }
    for (const std::string& node : named)
      if (g.find(node) < 0) fail(kWhere, cat("field 'cut' names unknown node '", node, "'"));
  }
  return g;
}

Graph Graph::from_parts(std::string name, std::vector<GraphInput> inputs, std::vector<NodeSpec> nodes,
                        const std::string& output, std::vector<int64_t> buckets) {
  Graph g;
  g.name_ = std::move(name);
  g.length_buckets_ = std::move(buckets);
  g.inputs_ = std::move(inputs);
  std::map<std::string, int> input_index, spec_index;
  for (std::size_t i = 0; i < g.inputs_.size(); ++i) input_index[g.inputs_[i].name] = static_cast<int>(i);
  for (std::size_t i = 0; i < nodes.size(); ++i) spec_index[nodes[i].name] = static_cast<int>(i);

  // Kahn's algorithm, keeping the spec's order among ready nodes so the order is stable.
  std::vector<int> pending(nodes.size(), 0);
  std::vector<std::vector<int>> consumers(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].inputs.empty())
      fail(kWhere, cat("node '", nodes[i].name, "' (", nodes[i].op, "): missing field 'inputs'"));
    for (const auto& in : nodes[i].inputs) {
      if (input_index.count(in)) continue;
      auto it = spec_index.find(in);
      if (it == spec_index.end())
        fail(kWhere, cat("node '", nodes[i].name, "': field 'inputs' names unknown tensor '", in, "'"));
      if (it->second == static_cast<int>(i)) fail(kWhere, cat("node '", nodes[i].name, "': reads its own output"));
      ++pending[i];
      consumers[static_cast<std::size_t>(it->second)].push_back(static_cast<int>(i));
    }
  }
  std::set<int> ready;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (pending[i] == 0) ready.insert(static_cast<int>(i));
  std::map<std::string, int> node_index;
  std::set<std::string> torch_names;
  while (!ready.empty()) {
    const int i = *ready.begin();
    ready.erase(ready.begin());
    GraphNode gn;
    gn.spec = nodes[static_cast<std::size_t>(i)];
    std::vector<Shape> shapes;
    for (const auto& in : gn.spec.inputs) {
      if (auto it = input_index.find(in); it != input_index.end()) {
        gn.sources.push_back(it->second);
        shapes.push_back(g.inputs_[static_cast<std::size_t>(it->second)].shape);
      } else {
        const int src = node_index.at(in);
        gn.sources.push_back(-(src + 1));
        shapes.push_back(g.nodes_[static_cast<std::size_t>(src)].shape);
      }
    }
    gn.shape = infer_shape(gn.spec, shapes);
    check_torch_names(gn.spec, shapes, torch_names);
    if (!g.length_buckets_.empty()) g.mark_tokens(gn);
    if (!gn.shape.numel_at_most(kMaxSampleElements))
      fail(kWhere, cat("node '", gn.spec.name, "' (", gn.spec.op, "): its output per sample ", gn.shape.str(),
                       " has more than ", kMaxSampleElements, " elements"));
    node_index[gn.spec.name] = static_cast<int>(g.nodes_.size());
    g.nodes_.push_back(std::move(gn));
    for (int c : consumers[static_cast<std::size_t>(i)])
      if (--pending[static_cast<std::size_t>(c)] == 0) ready.insert(c);
  }
  if (g.nodes_.size() != nodes.size()) {
    std::string stuck;
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (pending[i] > 0) stuck += (stuck.empty() ? "'" : ", '") + nodes[i].name + "'";
    fail(kWhere, cat("the graph has a cycle through nodes ", stuck));
  }
  g.output_ = g.find(output);
  if (g.output_ < 0) fail(kWhere, cat("output node '", output, "' is not in the graph"));
  return g;
}

int Graph::find(const std::string& name) const {
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].spec.name == name) return static_cast<int>(i);
  return -1;
}

const GraphNode& Graph::node(const std::string& name) const {
  const int i = find(name);
  if (i < 0) fail(kWhere, cat("no node named '", name, "'"));
  return nodes_[static_cast<std::size_t>(i)];
}

int64_t Graph::output_groups() const {
  const GraphNode& out = nodes_.at(static_cast<std::size_t>(output_));
  const OpDef& d = op_def(out.spec.op);
  return d.output_groups ? d.output_groups(out.spec) : 1;
}

int64_t Graph::classes() const {
  return nodes_.at(static_cast<std::size_t>(output_)).shape.numel() / output_groups();
}

std::vector<Shape> Graph::input_shapes(const GraphNode& node) const {
  std::vector<Shape> shapes;
  for (int s : node.sources)
    shapes.push_back(s >= 0 ? inputs_[static_cast<std::size_t>(s)].shape : nodes_[static_cast<std::size_t>(-s - 1)].shape);
  return shapes;
}

std::vector<std::string> Graph::param_names() const {
  std::vector<std::string> names;
  for (const auto& n : nodes_)
    for (const ParamSpec& p : op_params(n.spec, input_shapes(n))) names.push_back(n.spec.name + "." + p.field);
  return names;
}

bool u_shaped_cut(const std::string& cut) { return cut.find(',') != std::string::npos; }

std::pair<std::string, std::string> u_shaped_cuts(const std::string& cut) {
  const std::size_t comma = cut.find(',');
  if (comma == std::string::npos) fail("split", cat("cut '", cut, "' is not U-shaped (\"FRONT_CUT,TAIL_CUT\")"));
  std::pair<std::string, std::string> cuts{cut.substr(0, comma), cut.substr(comma + 1)};
  if (cuts.first.empty() || cuts.second.empty() || u_shaped_cut(cuts.second))
    fail("split", cat("a U-shaped cut names two nodes, \"FRONT_CUT,TAIL_CUT\", not '", cut, "'"));
  return cuts;
}

std::vector<bool> Graph::ancestors(int node) const {
  std::vector<bool> in(nodes_.size(), false);
  in[static_cast<std::size_t>(node)] = true;
  for (int i = node; i >= 0; --i) {
    if (!in[static_cast<std::size_t>(i)]) continue;
    for (int s : nodes_[static_cast<std::size_t>(i)].sources)
      if (s < 0) in[static_cast<std::size_t>(-s - 1)] = true;
  }
  return in;
}

std::vector<std::string> cut_list(const std::string& cuts) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = cuts.find(',', at);
    std::string name = cuts.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const std::size_t first = name.find_first_not_of(' '), last = name.find_last_not_of(' ');
    name = first == std::string::npos ? std::string() : name.substr(first, last - first + 1);
    if (name.empty()) fail("split", cat("cut list '", cuts, "' has an empty name: give node names separated by commas"));
    out.push_back(std::move(name));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

std::string Graph::cut_nodes(const std::string& cuts) const {
  if (cuts.empty() || cuts == "auto") return cuts;
  std::string out;
  bool changed = false;
  for (const std::string& name : cut_list(cuts)) {
    std::string node = name;
    if (find(name) < 0)
      for (const GraphNode& n : nodes_)
        if (n.spec.name.compare(0, name.size() + 1, name + ".") == 0) node = n.spec.name;
    changed = changed || node != name;
    out += cat(out.empty() ? "" : ",", node);
  }
  return changed ? out : cuts;  // node names as given (a checkpoint's cut and a plan hash keep their text)
}

std::vector<Graph> Graph::partition(const std::vector<std::string>& cuts) const {
  std::vector<Graph> stages;
  Graph rest = *this;
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    if (rest.find(cuts[i]) < 0 && find(cuts[i]) >= 0)
      fail("split", cat("cut '", cuts[i], "' must come after '", cuts[i - 1],
                        "': cuts are listed in the order the data flows through them"));
    auto [front, back] = rest.split(cuts[i]);
    front.name_ = cat(name_, ".stage", i);
    stages.push_back(std::move(front));
    rest = std::move(back);
  }
  rest.name_ = cat(name_, ".stage", cuts.size());
  stages.push_back(std::move(rest));
  return stages;
}

Graph Graph::tail(const std::string& cut) const {
  const auto [a, b] = u_shaped_cuts(cut);
  Graph t = std::move(partition({a, b})[2]);
  t.name_ = name_ + ".tail";
  return t;
}

std::pair<Graph, Graph> Graph::split(const std::string& cut) const {
  if (u_shaped_cut(cut)) {
    const auto [a, b] = u_shaped_cuts(cut);
    std::vector<Graph> stages = partition({a, b});
    stages[0].name_ = name_ + ".front";
    stages[1].name_ = name_ + ".middle";
    return {std::move(stages[0]), std::move(stages[1])};
  }
  const int c = find(cut);
  if (c < 0) fail("split", cat("cut node '", cut, "' is not in the graph"));
  if (c == output_) fail("split", cat("cut node '", cut, "' is the output: nothing would be left for the back shard"));

  const std::vector<bool> front = ancestors(c);
  if (front[static_cast<std::size_t>(output_)])
    fail("split", cat("cut node '", cut, "' comes after the output '", nodes_[static_cast<std::size_t>(output_)].spec.name, "'"));

  std::vector<NodeSpec> front_nodes, back_nodes;
  std::map<std::string, std::string> crossing;  // tensor -> the back nodes reading it
  std::vector<int> masks;                       // graph inputs (masks) the back shard reads
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (front[i]) {
      front_nodes.push_back(nodes_[i].spec);
      continue;
    }
    back_nodes.push_back(nodes_[i].spec);
    for (std::size_t k = 0; k < nodes_[i].sources.size(); ++k) {
      const int s = nodes_[i].sources[k];
      const bool from_front = s >= 0 || front[static_cast<std::size_t>(-s - 1)];
      if (!from_front) continue;
      if (s >= 0 && inputs_[static_cast<std::size_t>(s)].mask) {  // travels with the activations
        if (std::find(masks.begin(), masks.end(), s) == masks.end()) masks.push_back(s);
        continue;
      }
      std::string& readers = crossing[nodes_[i].spec.inputs[k]];
      readers += (readers.empty() ? "'" : ", '") + nodes_[i].spec.name + "'";
    }
  }
  // Only the cut's output may cross: any other front tensor or graph input read by the back
  // shard would have to travel too.
  if (crossing.size() != 1 || crossing.begin()->first != cut) {
    std::string list;
    for (const auto& [tensor, readers] : crossing)
      list += cat(list.empty() ? "" : ", ", "'", tensor, "' (read by ", readers, ")");
    fail("split", cat("cut at '", cut, "' is crossed by ", crossing.size(), " tensors: ", list,
                      "; pick a node that every path from the inputs to the output passes through"));
  }
  if (masks.size() > 1)
    fail("split", cat("cut at '", cut, "' would send ", masks.size(), " masks; one mask input may cross a cut"));
  std::vector<GraphInput> back_inputs{{cut, nodes_[static_cast<std::size_t>(c)].shape}};
  back_inputs[0].tokens = nodes_[static_cast<std::size_t>(c)].tokens;
  for (int m : masks) back_inputs.push_back(inputs_[static_cast<std::size_t>(m)]);
  Graph f = from_parts(name_ + ".front", inputs_, std::move(front_nodes), cut, length_buckets_);
  Graph b = from_parts(name_ + ".back", std::move(back_inputs), std::move(back_nodes),
                       nodes_[static_cast<std::size_t>(output_)].spec.name, length_buckets_);
  f.loss_ = b.loss_ = loss_;
  return {std::move(f), std::move(b)};
}

// Whether the node is per token, or an Error when it reads a sequence at a length it cannot
// take: a Fixed op, or a per-token op reading one whose only dimension is the tokens (ids)
// except to add one (an embedding: [T] -> [T, F]); a linear or a concatenation there would
// work across the tokens.
void Graph::mark_tokens(GraphNode& node) const {
  const OpDef& d = op_def(node.spec.op);
  auto tokens_at = [&](std::size_t k) {
    const int s = node.sources[k];
    return s >= 0 ? inputs_[static_cast<std::size_t>(s)].tokens : nodes_[static_cast<std::size_t>(-s - 1)].tokens;
  };
  auto refuse = [&](std::size_t k, const char* why) {
    fail(kWhere, cat("node '", node.spec.name, "' (", node.spec.op, ") reads '", node.spec.inputs[k],
                     "', a sequence that runs at the length buckets' lengths, but ", why,
                     "; drop field 'length_buckets' or change the node"));
  };
  bool any = false;
  for (std::size_t k = 0; k < node.sources.size(); ++k) any = any || tokens_at(k);
  if (!any) return;
  if (d.sequence == SequenceLength::Fixed) refuse(0, "it needs its inputs' full length");
  if (d.sequence == SequenceLength::Pools) return;
  const Shape in0 = node.sources[0] >= 0 ? inputs_[static_cast<std::size_t>(node.sources[0])].shape
                                         : nodes_[static_cast<std::size_t>(-node.sources[0] - 1)].shape;
  for (std::size_t k = 0; k < node.sources.size(); ++k)
    if (!tokens_at(k)) refuse(0, cat("its input '", node.spec.inputs[k], "' is not a sequence of that length").c_str());
  if (in0.rank() == 1 && !(node.shape.rank() == 2 && node.shape[0] == in0[0]))
    refuse(0, "it would work across the tokens");
  if (in0.rank() >= 2 && node.shape[0] != in0[0]) refuse(0, "its output has another number of tokens");
  node.tokens = true;
}

int64_t Graph::sequence_length(std::span<const Tensor> inputs) const {
  int64_t length = -1;
  for (std::size_t i = 0; i < inputs_.size() && i < inputs.size(); ++i) {
    if (!inputs_[i].tokens) continue;
    const Shape& s = inputs[i].shape();
    const int64_t l = s.rank() >= 2 ? s[1] : 0;
    if (length >= 0 && l != length)
      fail(kWhere, cat(name_, ": input '", inputs_[i].name, "' runs at ", l, " tokens, the others at ", length));
    length = l;
  }
  if (length < 0) return -1;
  // (Only a graph with buckets marks inputs per token.)
  if (std::find(length_buckets_.begin(), length_buckets_.end(), length) == length_buckets_.end())
    fail(kWhere, cat(name_, ": inputs of ", length, " tokens, not one of the length buckets ", buckets_text()));
  return length;
}

std::string Graph::buckets_text() const {
  std::string out = "[";
  for (int64_t b : length_buckets_) out += cat(out.size() > 1 ? ", " : "", b);
  return out + "]";
}

Shape Graph::at_length(const Shape& shape, bool tokens, int64_t length) {
  if (!tokens || length < 0) return shape;
  Shape s = shape;
  s[0] = length;
  return s;
}

bool GraphInput::accepts(double v) const {
  if (mask) return v == 0.0 || v == 1.0;
  if (integer) return v == std::floor(v) && std::fabs(v) <= 16777216.0;
  return true;
}

const char* GraphInput::rule() const {
  return mask ? "0 or 1 (a mask)" : integer ? "an integer below 2^24 (ids and coordinates)" : "any number";
}

}  // namespace tandem
