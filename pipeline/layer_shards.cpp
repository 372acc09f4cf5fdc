#include "pipeline/layer_shards.h"

#include <algorithm>
#include <map>
#include <set>

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

// A pair's linears split by output features: A, and an attention block's key and value.
std::vector<const std::string*> columns_of(const LinearPair& p) {
  std::vector<const std::string*> out{&p.columns};
  for (const std::string& a : p.also) out.push_back(&a);
  return out;
}

// Every parameter of `a`'s network copied to or from `b`'s, the pairs' by slice.
void move_shard(Network& whole, Network& shard, const std::vector<LinearPair>& pairs, int rank, int shards,
                bool into_whole) {
  std::map<std::string, std::pair<bool, int64_t>> sliced;  // param name -> (by rows, slice size)
  for (const LinearPair& p : pairs) {
    const int64_t h = whole.param(p.columns + ".weight").value().shape()[0] / shards;
    for (const std::string* a : columns_of(p)) {
      sliced[*a + ".weight"] = {true, h};
      sliced[*a + ".bias"] = {true, h};
    }
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
  // The linear read from `name` through activations alone, if that is all that reads it.
  const auto linear_after = [&](const std::string& name) -> const NodeSpec* {
    const NodeSpec* next = only_reader(name);
    while (next && per_value(next->op) && next->inputs.size() == 1) next = only_reader(next->name);
    return next && plain_linear(*next) && next->inputs.size() == 1 ? next : nullptr;
  };
  std::vector<LinearPair> pairs;
  const auto taken = [&](const std::string& name) {
    return std::any_of(pairs.begin(), pairs.end(), [&](const LinearPair& p) {
      return p.rows == name || p.columns == name || std::find(p.also.begin(), p.also.end(), name) != p.also.end();
    });
  };
  // Attention blocks: query, key and value linears of one input, each read by the attention alone.
  for (const NodeSpec& n : spec.nodes) {
    if (n.op != "attention" || n.attention.heads % shards != 0 || n.inputs.size() < 3) continue;
    std::vector<const NodeSpec*> qkv;
    for (int i = 0; i < 3; ++i) {
      const NodeSpec* p = node_named(spec, n.inputs[static_cast<std::size_t>(i)]);
      if (!p || !plain_linear(*p) || p->inputs.size() != 1 || only_reader(p->name) != &n ||
          p->linear.out_features % shards != 0 || (!qkv.empty() && p->inputs != qkv.front()->inputs) || taken(p->name))
        break;
      qkv.push_back(p);
    }
    if (qkv.size() != 3 || qkv[0] == qkv[1] || qkv[1] == qkv[2] || qkv[0] == qkv[2]) continue;
    const NodeSpec* b = linear_after(n.name);
    if (!b || taken(b->name)) continue;
    pairs.push_back({qkv[0]->name, b->name, {qkv[1]->name, qkv[2]->name}, n.name});
  }
  for (const NodeSpec& a : spec.nodes) {
    if (!plain_linear(a) || a.linear.out_features % shards != 0 || taken(a.name)) continue;
    const NodeSpec* next = linear_after(a.name);
    if (next && !taken(next->name)) pairs.push_back({a.name, next->name, {}, ""});
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
  std::set<std::string> copies;                 // tp_copy nodes placed
  for (const NodeSpec& n0 : spec.nodes) {
    NodeSpec n = n0;
    for (std::string& in : n.inputs)
      if (const auto it = renamed.find(in); it != renamed.end()) in = it->second;
    const auto as_a = std::find_if(pairs.begin(), pairs.end(), [&](const LinearPair& p) { return p.columns == n.name; });
    const auto as_b = std::find_if(pairs.begin(), pairs.end(), [&](const LinearPair& p) { return p.rows == n.name; });
    const auto as_kv = std::find_if(pairs.begin(), pairs.end(), [&](const LinearPair& p) {
      return std::find(p.also.begin(), p.also.end(), n.name) != p.also.end();
    });
    // One tp_copy before A (and an attention block's key and value: the same input), placed
    // before the first of them.
    const auto block = as_a != pairs.end() ? as_a : as_kv;
    if (block != pairs.end()) {
      const std::string copy_name = block->columns + ".tp_copy";
      if (copies.insert(copy_name).second) {
        NodeSpec copy;
        copy.name = copy_name;
        copy.op = "tp_copy";
        copy.inputs = n.inputs;
        out.nodes.push_back(copy);
      }
      n.inputs = {copy_name};
      n.linear.out_features /= shards;
    }
    if (std::any_of(pairs.begin(), pairs.end(), [&](const LinearPair& p) { return p.attention == n.name; }))
      n.attention.heads /= shards;
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
