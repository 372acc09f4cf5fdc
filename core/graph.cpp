#include "core/graph.h"

#include <map>
#include <set>

#include "core/activation.h"
#include "core/error.h"

namespace tandem {
namespace {

constexpr std::string_view kWhere = "graph";

void expect_inputs(const NodeSpec& n, const std::vector<Shape>& in, std::size_t count, int rank) {
  if (in.size() != count)
    fail(kWhere, cat("node '", n.name, "' (", n.op, "): field 'inputs' needs ", count, count == 1 ? " input" : " inputs",
                     ", got ", in.size()));
  if (rank > 0 && in[0].rank() != rank)
    fail(kWhere, cat("node '", n.name, "' (", n.op, "): expects a rank-", rank, " input per sample, got ",
                     in[0].str(), rank == 1 ? " (add a flatten node before it)" : ""));
}

}  // namespace

Shape infer_shape(const NodeSpec& n, const std::vector<Shape>& in) {
  if (n.op == "conv2d") {
    expect_inputs(n, in, 1, 3);
    const Conv2dAttrs& a = n.conv2d;
    if (in[0][2] % a.groups != 0)
      fail(kWhere, cat("node '", n.name, "' (conv2d): ", a.groups, " groups do not divide its ", in[0][2],
                       " input channels"));
    int64_t out[2];
    for (int i = 0; i < 2; ++i) {
      auto k = static_cast<std::size_t>(i);
      out[i] = (in[0][i] + 2 * a.padding[k] - a.dilation[k] * (a.kernel[k] - 1) - 1) / a.stride[k] + 1;
      if (in[0][i] + 2 * a.padding[k] < a.dilation[k] * (a.kernel[k] - 1) + 1)
        fail(kWhere, cat("node '", n.name, "' (conv2d): kernel larger than the padded input ", in[0].str()));
    }
    return Shape{out[0], out[1], a.out_channels};
  }
  if (n.op == "max_pool2d" || n.op == "avg_pool2d") {
    expect_inputs(n, in, 1, 3);
    const Pool2dAttrs& a = n.pool;
    int64_t out[2];
    for (int i = 0; i < 2; ++i) {
      auto k = static_cast<std::size_t>(i);
      if (in[0][i] + 2 * a.padding[k] < a.kernel[k])
        fail(kWhere, cat("node '", n.name, "' (", n.op, "): window larger than the padded input ", in[0].str()));
      out[i] = (in[0][i] + 2 * a.padding[k] - a.kernel[k]) / a.stride[k] + 1;
    }
    return Shape{out[0], out[1], in[0][2]};
  }
  if (n.op == "linear") {
    expect_inputs(n, in, 1, 1);
    return Shape{n.linear.out_features};
  }
  if (n.op == "concat") {  // along the last dimension (channels, in NHWC)
    if (in.size() < 2)
      fail(kWhere, cat("node '", n.name, "' (concat): field 'inputs' needs 2 or more inputs, got ", in.size()));
    const int rank = in[0].rank();
    int64_t dims[kMaxRank];
    for (int d = 0; d < rank; ++d) dims[d] = in[0][d];
    dims[rank - 1] = 0;
    for (const Shape& s : in) {
      bool same = s.rank() == rank;
      for (int d = 0; same && d + 1 < rank; ++d) same = s[d] == in[0][d];
      if (!same)
        fail(kWhere, cat("node '", n.name, "' (concat): input ", s.str(), " differs from ", in[0].str(),
                         " in more than the last dimension"));
      dims[rank - 1] += s[rank - 1];
    }
    return Shape::of(dims, rank);
  }
  if (n.op == "add") {
    expect_inputs(n, in, 2, 0);
    if (in[0] != in[1])
      fail(kWhere, cat("node '", n.name, "' (add): inputs of shapes ", in[0].str(), " and ", in[1].str(),
                       " (add needs equal shapes)"));
    return in[0];
  }
  if (n.op == "softmax" || n.op == "batch_norm" || n.op == "dropout") {  // over / per the last dimension
    expect_inputs(n, in, 1, 0);
    return in[0];
  }
  if (n.op == "global_avg_pool") {
    expect_inputs(n, in, 1, 3);
    return Shape{in[0][2]};
  }
  if (n.op == "heads") {
    expect_inputs(n, in, 1, 1);
    return Shape{n.heads.count * n.heads.out_features};
  }
  if (n.op == "relu" || parse_activation(n.op)) {
    expect_inputs(n, in, 1, 0);
    return in[0];
  }
  if (n.op == "flatten") {
    expect_inputs(n, in, 1, 0);
    return Shape{in[0].numel()};
  }
  fail(kWhere, cat("node '", n.name, "': unknown op '", n.op, "'"));
}

Graph Graph::build(const ModelSpec& spec) {
  std::vector<GraphInput> inputs;
  for (const auto& in : spec.inputs) inputs.push_back({in.name, in.shape});
  Graph g = from_parts(spec.name, std::move(inputs), spec.nodes, spec.output);
  g.default_cut_ = spec.cut;
  g.loss_ = spec.loss;
  if (!g.default_cut_.empty() && g.find(g.default_cut_) < 0)
    fail(kWhere, cat("field 'cut' names unknown node '", g.default_cut_, "'"));
  return g;
}

Graph Graph::from_parts(std::string name, std::vector<GraphInput> inputs, std::vector<NodeSpec> nodes,
                        const std::string& output) {
  Graph g;
  g.name_ = std::move(name);
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
  return out.spec.op == "heads" ? out.spec.heads.count : 1;
}

std::vector<std::string> Graph::param_names() const {
  std::vector<std::string> names;
  for (const auto& n : nodes_) {
    if (n.spec.op == "batch_norm") {
      names.push_back(n.spec.name + ".weight");
      names.push_back(n.spec.name + ".bias");
      continue;
    }
    if (n.spec.op == "heads") {
      for (const char* p : {".w1", ".b1", ".w2", ".b2"}) names.push_back(n.spec.name + p);
      continue;
    }
    const bool weighted = n.spec.op == "conv2d" || n.spec.op == "linear";
    if (!weighted) continue;
    names.push_back(n.spec.name + ".weight");
    const bool bias = n.spec.op == "conv2d" ? n.spec.conv2d.bias : n.spec.linear.bias;
    if (bias) names.push_back(n.spec.name + ".bias");
  }
  return names;
}

std::pair<Graph, Graph> Graph::split(const std::string& cut) const {
  const int c = find(cut);
  if (c < 0) fail("split", cat("cut node '", cut, "' is not in the graph"));
  if (c == output_) fail("split", cat("cut node '", cut, "' is the output: nothing would be left for the back shard"));

  // Front = the cut node and its ancestors.
  std::vector<bool> front(nodes_.size(), false);
  front[static_cast<std::size_t>(c)] = true;
  for (int i = c; i >= 0; --i) {
    if (!front[static_cast<std::size_t>(i)]) continue;
    for (int s : nodes_[static_cast<std::size_t>(i)].sources)
      if (s < 0) front[static_cast<std::size_t>(-s - 1)] = true;
  }
  if (front[static_cast<std::size_t>(output_)])
    fail("split", cat("cut node '", cut, "' comes after the output '", nodes_[static_cast<std::size_t>(output_)].spec.name, "'"));

  std::vector<NodeSpec> front_nodes, back_nodes;
  std::map<std::string, std::string> crossing;  // tensor -> the back nodes reading it
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
  Graph f = from_parts(name_ + ".front", inputs_, std::move(front_nodes), cut);
  Graph b = from_parts(name_ + ".back", {{cut, nodes_[static_cast<std::size_t>(c)].shape}}, std::move(back_nodes),
                       nodes_[static_cast<std::size_t>(output_)].spec.name);
  f.loss_ = b.loss_ = loss_;
  return {std::move(f), std::move(b)};
}

}  // namespace tandem
