#include "pipeline/layer_shards.h"

#include <algorithm>
#include <map>

#include "core/activation.h"
#include "core/error.h"

namespace tandem {
namespace {

const NodeSpec* node_named(const ModelSpec& spec, const std::string& name) {
  for (const NodeSpec& n : spec.nodes)
    if (n.name == name) return &n;
  return nullptr;
}

bool plain_linear(const NodeSpec& n) { return n.op == "linear" && n.lora.rank == 0; }

// An activation: a function of each value alone, no parameters, no randomness (dropout's masks
// would differ between a slice and the whole), so it runs on a slice as on the whole.
bool per_value(const std::string& op) {
  return find_activation(op) != nullptr || op == "relu" || op == "silu" || op == "gelu_tanh" || op == "hardsigmoid";
}

// Rows [begin, begin + count) of a [rows, cols] tensor's storage, or columns of each row.
void copy_rows(const Tensor& from, Tensor& to, int64_t begin, bool into_whole) {
  const int64_t cols = from.shape().rank() == 2 ? from.shape()[1] : 1;
  const int64_t count = (into_whole ? from : to).shape()[0];
  const float* src = from.data() + (into_whole ? 0 : begin * cols);
  float* dst = to.data() + (into_whole ? begin * cols : 0);
  std::copy_n(src, count * cols, dst);
}
void copy_cols(const Tensor& from, Tensor& to, int64_t begin, bool into_whole) {
  const int64_t rows = from.shape()[0];
  const int64_t width = (into_whole ? from : to).shape()[1];
  const int64_t from_cols = from.shape()[1], to_cols = to.shape()[1];
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(from.data() + r * from_cols + (into_whole ? 0 : begin), width,
                to.data() + r * to_cols + (into_whole ? begin : 0));
}

// Every parameter of `a`'s network copied to or from `b`'s, the pairs' by slice.
void move_shard(Network& whole, Network& shard, const std::vector<LinearPair>& pairs, int rank, int shards,
                bool into_whole) {
  std::map<std::string, std::pair<bool, int64_t>> sliced;  // param name -> (by rows, slice size)
  for (const LinearPair& p : pairs) {
    const int64_t h = whole.param(p.columns + ".weight").value().shape()[0] / shards;
    sliced[p.columns + ".weight"] = {true, h};
    sliced[p.columns + ".bias"] = {true, h};
    sliced[p.rows + ".weight"] = {false, h};
  }
  for (Param* s : shard.all_params()) {
    Param& w = whole.param(s->name());
    const auto it = sliced.find(s->name());
    Tensor& whole_value = w.value();
    Tensor& shard_value = s->value();
    if (it == sliced.end()) {
      if (into_whole) whole_value.copy_from(shard_value);
      else shard_value.copy_from(whole_value);
    } else if (it->second.first) {
      into_whole ? copy_rows(shard_value, whole_value, rank * it->second.second, true)
                 : copy_rows(whole_value, shard_value, rank * it->second.second, false);
    } else {
      into_whole ? copy_cols(shard_value, whole_value, rank * it->second.second, true)
                 : copy_cols(whole_value, shard_value, rank * it->second.second, false);
    }
    (into_whole ? w : *s).bump_version();
  }
  // The layers' buffers (batch norm's running statistics), whole on every member.
  const auto whole_buffers = whole.buffers();
  for (auto& [name, t] : shard.buffers())
    for (const auto& [whole_name, wt] : whole_buffers)
      if (whole_name == name) into_whole ? wt->copy_from(*t) : t->copy_from(*wt);
}

}  // namespace

std::vector<LinearPair> linear_pairs(const ModelSpec& spec, int shards) {
  std::map<std::string, std::vector<std::string>> readers;
  for (const NodeSpec& n : spec.nodes)
    for (const std::string& in : n.inputs) readers[in].push_back(n.name);
  const auto only_reader = [&](const std::string& name) -> const NodeSpec* {
    const auto it = readers.find(name);
    if (it == readers.end() || it->second.size() != 1 || name == spec.output) return nullptr;
    return node_named(spec, it->second.front());
  };
  std::vector<LinearPair> pairs;
  for (const NodeSpec& a : spec.nodes) {
    if (!plain_linear(a) || a.linear.out_features % shards != 0) continue;
    const NodeSpec* next = only_reader(a.name);
    while (next && per_value(next->op) && next->inputs.size() == 1) next = only_reader(next->name);
    if (next && plain_linear(*next) && next->inputs.size() == 1 &&
        std::none_of(pairs.begin(), pairs.end(), [&](const LinearPair& p) { return p.rows == a.name; }))
      pairs.push_back({a.name, next->name});
  }
  return pairs;
}

ModelSpec layer_shard_spec(const ModelSpec& spec, int rank, int shards) {
  if (shards < 1 || rank < 0 || rank >= shards) fail("layer shards", cat("member ", rank, " of ", shards, " shards"));
  const std::vector<LinearPair> pairs = linear_pairs(spec, shards);
  if (pairs.empty())
    fail("layer shards", cat("model '", spec.name, "' has no linear pair to split over ", shards,
                             " shards (a linear whose output features divide by ", shards,
                             ", read through activations alone by another linear)"));
  for (const NodeSpec& n : spec.nodes)
    if (n.op == "dropout")
      fail("layer shards", cat("model '", spec.name, "': node '", n.name, "' (dropout) draws its masks' seed from the "
                               "initialisation's stream, which a member's sliced linears use up differently: its "
                               "members would drop different values; split a model without dropout"));
  ModelSpec out = spec;
  out.nodes.clear();
  std::map<std::string, std::string> renamed;  // B's name -> its tp_reduce's, for B's readers
  for (const NodeSpec& n0 : spec.nodes) {
    NodeSpec n = n0;
    for (std::string& in : n.inputs)
      if (const auto it = renamed.find(in); it != renamed.end()) in = it->second;
    const auto as_a = std::find_if(pairs.begin(), pairs.end(), [&](const LinearPair& p) { return p.columns == n.name; });
    const auto as_b = std::find_if(pairs.begin(), pairs.end(), [&](const LinearPair& p) { return p.rows == n.name; });
    if (as_a != pairs.end()) {
      NodeSpec copy;
      copy.name = n.name + ".tp_copy";
      copy.op = "tp_copy";
      copy.inputs = n.inputs;
      out.nodes.push_back(copy);
      n.inputs = {copy.name};
      n.linear.out_features /= shards;
    }
    if (as_b != pairs.end()) {
      n.linear.bias = n.linear.bias && rank == 0;
      out.nodes.push_back(n);
      NodeSpec reduce;
      reduce.name = n.name + ".tp_reduce";
      reduce.op = "tp_reduce";
      reduce.inputs = {n.name};
      out.nodes.push_back(reduce);
      renamed[n.name] = reduce.name;
      if (out.output == n.name) out.output = reduce.name;
      continue;
    }
    out.nodes.push_back(n);
  }
  if (const auto it = renamed.find(out.cut); it != renamed.end()) out.cut = it->second;
  out.name = cat(spec.name, ".shard-", rank, "-of-", shards);
  return parse_model_json(model_spec_json(out), out.name);  // its binary form (hashes) made again
}

void load_layer_shard(Network& whole, Network& shard, const std::vector<LinearPair>& pairs, int rank, int shards) {
  move_shard(whole, shard, pairs, rank, shards, false);
}

void store_layer_shard(Network& shard, Network& whole, const std::vector<LinearPair>& pairs, int rank, int shards) {
  move_shard(whole, shard, pairs, rank, shards, true);
}

}  // namespace tandem
