#include "pipeline/layer_shards.h"

#include <algorithm>
#include <array>
#include <cstring>
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

std::vector<LinearPair> linear_pairs(const ModelSpec& spec, int shards, const std::set<std::string>* within) {
  std::map<std::string, std::vector<std::string>> readers;
  for (const NodeSpec& n : spec.nodes)
    for (const std::string& in : n.inputs) readers[in].push_back(n.name);
  const auto inside = [&](const std::string& name) { return within == nullptr || within->count(name) > 0; };
  const auto only_reader = [&](const std::string& name) -> const NodeSpec* {
    const auto it = readers.find(name);
    if (it == readers.end() || it->second.size() != 1 || name == spec.output || !inside(name) ||
        !inside(it->second.front()))
      return nullptr;
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
    if (n.op != "attention" || n.attention.heads % shards != 0 || n.inputs.size() < 3 || !inside(n.name)) continue;
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
    if (!plain_linear(a) || a.linear.out_features % shards != 0 || taken(a.name) || !inside(a.name)) continue;
    const NodeSpec* next = linear_after(a.name);
    if (next && !taken(next->name)) pairs.push_back({a.name, next->name, {}, ""});
  }
  return pairs;
}

ModelSpec layer_shard_spec(const ModelSpec& spec, int rank, int shards, const std::set<std::string>* within) {
  if (shards < 1 || rank < 0 || rank >= shards) fail("layer shards", cat("member ", rank, " of ", shards, " shards"));
  const std::vector<LinearPair> pairs = linear_pairs(spec, shards, within);
  if (pairs.empty())
    fail("layer shards", cat("model '", spec.name, "' has no linear pair to split over ", shards,
                             " shards (a linear whose output features divide by ", shards,
                             ", read through activations alone by another linear)"));
  for (const NodeSpec& n : spec.nodes)
    if (n.op == "dropout" && (within == nullptr || within->count(n.name) > 0))
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

LayerShardStage layer_shard_stage(const ModelSpec& spec, const std::vector<std::string>& cuts, std::size_t index,
                                  int rank, int shards) {
  const Graph whole = Graph::build(spec);
  const std::vector<Graph> stages = whole.partition(cuts);
  if (index >= stages.size()) fail("layer shards", cat("stage ", index, " of a pipeline of ", stages.size()));
  std::set<std::string> within;
  for (const GraphNode& n : stages[index].nodes())
    if (std::find(cuts.begin(), cuts.end(), n.spec.name) == cuts.end()) within.insert(n.spec.name);
  LayerShardStage out{Graph(), linear_pairs(spec, shards, &within)};
  if (out.pairs.empty())
    fail("layer shards", cat("stage ", index, " of model '", spec.name, "' has no linear pair to split over ", shards,
                             " shards (a linear whose output features divide by ", shards,
                             ", read through activations alone by another linear, both inside the stage, neither a "
                             "cut): move a cut, or give the stage one member"));
  out.graph = Graph::build(layer_shard_spec(spec, rank, shards, &within)).partition(cuts)[index];
  return out;
}

void gather_layer_shard(Group& group, Network& shard, Network* whole, const std::vector<LinearPair>& pairs, int rank,
                        int shards) {
  if ((rank == 0) != (whole != nullptr)) fail("layer shards", "member 0, and member 0 alone, gathers into a whole network");
  std::map<std::string, bool> split;  // a split parameter's name -> whether by rows (else by columns)
  for (const LinearPair& p : pairs) {
    for (const std::string* a : columns_of(p)) split[*a + ".weight"] = split[*a + ".bias"] = true;
    split[p.rows + ".weight"] = false;
  }
  Tensor piece;
  for (Param* s : shard.all_params()) {
    Tensor* to = whole ? &whole->param(s->name()).value() : nullptr;
    const auto it = split.find(s->name());
    if (it == split.end()) {  // whole on every member: member 0's
      if (to) to->copy_from(s->value());
    } else {
      // Each member's slice in turn, every slice the same shape: member 0 places them.
      const Tensor& mine = s->value();
      for (int r = 0; r < shards; ++r) {
        sized(piece, mine.shape());
        if (r == rank) piece.copy_from(mine);
        group.broadcast(std::span<float>(piece.data(), piece.numel()), r);
        if (!to) continue;
        it->second ? copy_rows(piece, *to, r * mine.shape()[0], true) : copy_cols(piece, *to, r * mine.shape()[1], true);
      }
    }
    if (to) whole->param(s->name()).bump_version();
  }
  if (!whole) return;
  const auto whole_buffers = whole->buffers();
  for (auto& [name, t] : shard.buffers())
    for (const auto& [whole_name, wt] : whole_buffers)
      if (whole_name == name) wt->copy_from(*t);
}

namespace {

// A call member 0 tells: 32 words, then its tensors, each broadcast from member 0.
enum Call : uint32_t {
  kForward = 1,
  kBackward,
  kBackwardWeights,
  kStep,
  kZeroGrad,
  kStash,
  kUseStash,
  kReset,
  kSteps,
  kSave,
  kRestore,
  kGather,
  kEnd,
  kHello,
};
constexpr uint32_t kMagic = 0x5453484cu;  // "TSHL"
constexpr std::size_t kWords = 32, kMaxTensors = 3;
constexpr uint32_t kMaxSlots = 1024;  // micro-batch slots a call may name (K is far fewer)
struct Header {
  std::array<uint32_t, kWords> w{};
  // w[0] magic, w[1] the call's number, w[2] kind, w[3] slot, w[4] flags, w[6..7] a 64-bit
  // value, w[8] a float's bits, w[9] tensors, then per tensor its rank and 6 dims.
  std::span<float> words() { return {reinterpret_cast<float*>(w.data()), kWords}; }
};
static_assert(sizeof(float) == sizeof(uint32_t));
static_assert(10 + kMaxTensors * (1 + kMaxRank) <= kWords);

const char* call_name(uint32_t kind) {
  static const char* names[] = {"?",    "forward", "backward", "backward_weights", "step", "zero_grad", "stash_weights",
                                "use_stash", "reset", "steps", "save", "restore", "gather", "end", "hello"};
  return kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}

}  // namespace

void LayerShardLeader::tell(uint32_t kind, std::span<const Tensor> tensors, uint32_t slot, uint32_t a, uint64_t value,
                            float number) {
  if (tensors.size() > kMaxTensors)
    fail("layer shards", cat("a ", call_name(kind), " of ", tensors.size(), " tensors (", kMaxTensors, " at most)"));
  Header h;
  h.w[0] = kMagic;
  h.w[1] = calls_++;
  h.w[2] = kind;
  h.w[3] = slot;
  h.w[4] = a;
  h.w[6] = static_cast<uint32_t>(value);
  h.w[7] = static_cast<uint32_t>(value >> 32);
  std::memcpy(&h.w[8], &number, sizeof number);
  h.w[9] = static_cast<uint32_t>(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const Shape& shape = tensors[t].shape();
    h.w[10 + t * 7] = static_cast<uint32_t>(shape.rank());
    for (int d = 0; d < shape.rank(); ++d) h.w[10 + t * 7 + 1 + static_cast<std::size_t>(d)] = static_cast<uint32_t>(shape[d]);
  }
  group_.broadcast(h.words(), 0);
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    scratch_.assign(t.data(), t.data() + t.numel());  // a broadcast's buffer is written on every member
    group_.broadcast(scratch_, 0);
  }
}

void LayerShardLeader::forward(std::span<const Tensor> inputs, int slot, bool training) {
  tell(kForward, inputs, static_cast<uint32_t>(slot), training);
}
void LayerShardLeader::backward(const Tensor& grad_output, int slot, bool want_input_grad, bool defer_weights) {
  tell(kBackward, std::span<const Tensor>(&grad_output, 1), static_cast<uint32_t>(slot),
       (want_input_grad ? 1u : 0u) | (defer_weights ? 2u : 0u));
}
void LayerShardLeader::backward_weights(int slot) { tell(kBackwardWeights, {}, static_cast<uint32_t>(slot)); }
void LayerShardLeader::step(uint64_t samples, float lr_scale) { tell(kStep, {}, 0, 0, samples, lr_scale); }
void LayerShardLeader::zero_grad() { tell(kZeroGrad, {}); }
void LayerShardLeader::stash_weights() { tell(kStash, {}); }
void LayerShardLeader::use_stash(bool stashed) { tell(kUseStash, {}, 0, stashed); }
void LayerShardLeader::reset() { tell(kReset, {}); }
void LayerShardLeader::save(uint64_t step) { tell(kSave, {}, 0, 0, step); }
void LayerShardLeader::restore(uint64_t step) { tell(kRestore, {}, 0, 0, step); }
void LayerShardLeader::gather() { tell(kGather, {}); }
void LayerShardLeader::end(bool failed) { tell(kEnd, {}, 0, failed); }
void LayerShardLeader::hello(const std::array<uint8_t, 32>& terms) {
  Tensor t = Tensor::empty({8});
  std::memcpy(t.data(), terms.data(), terms.size());
  tell(kHello, std::span<const Tensor>(&t, 1));
}

std::vector<uint64_t> LayerShardLeader::common_steps(const std::vector<uint64_t>& mine) {
  tell(kSteps, {}, 0, 0, mine.size());
  // The steps (two words each), then a count per step of the members holding it.
  std::vector<float> steps(mine.size() * 2);
  std::memcpy(steps.data(), mine.data(), mine.size() * sizeof(uint64_t));
  group_.broadcast(steps, 0);
  std::vector<float> held(mine.size(), 1.0f);
  group_.all_sum(held);
  std::vector<uint64_t> out;
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (held[i] == static_cast<float>(group_.size())) out.push_back(mine[i]);
  return out;
}

uint64_t follow_layer_shard(Stage& stage, Group& group, const LayerShardFollower& follower) {
  std::array<Tensor, kMaxTensors> tensors;
  uint64_t calls = 0;
  for (;;) {
    Header h;
    group.broadcast(h.words(), 0);
    const uint32_t kind = h.w[2];
    if (h.w[0] != kMagic || h.w[1] != static_cast<uint32_t>(calls) || kind < kForward || kind > kHello ||
        h.w[9] > kMaxTensors || h.w[3] >= kMaxSlots)
      fail("layer shards", cat("member ", group.rank(), " was told call ", h.w[1], " (", call_name(kind), ") where it ",
                               "awaited call ", calls, ": run the same tandem build on every member"));
    ++calls;
    const auto n = static_cast<std::size_t>(h.w[9]);
    for (std::size_t t = 0; t < n; ++t) {
      const int rank = static_cast<int>(h.w[10 + t * 7]);
      if (rank < 0 || rank > kMaxRank) fail("layer shards", cat("a tensor of rank ", rank, " told"));
      std::array<int64_t, kMaxRank> dims{};
      for (int d = 0; d < rank; ++d) dims[static_cast<std::size_t>(d)] = h.w[10 + t * 7 + 1 + static_cast<std::size_t>(d)];
      const Shape shape = Shape::of(dims.data(), rank);
      if (!shape.numel_at_most(int64_t{1} << 28)) fail("layer shards", cat("a tensor of ", shape.str(), " told"));
      sized(tensors[t], shape);
      if (tensors[t].numel() > 0) group.broadcast(std::span<float>(tensors[t].data(), tensors[t].numel()), 0);
    }
    const int slot = static_cast<int>(h.w[3]);
    const uint64_t value = static_cast<uint64_t>(h.w[6]) | (static_cast<uint64_t>(h.w[7]) << 32);
    switch (kind) {
      case kForward:
        h.w[4] ? (void)stage.forward(std::span<const Tensor>(tensors.data(), n), slot)
               : (void)stage.evaluate(std::span<const Tensor>(tensors.data(), n), slot);
        break;
      case kBackward:
        if (n != 1) fail("layer shards", "a backward told without its gradient");
        stage.backward(tensors[0], slot, (h.w[4] & 1u) != 0, (h.w[4] & 2u) != 0);
        break;
      case kBackwardWeights:
        stage.backward_weights(slot);
        break;
      case kStep: {
        float scale = 0;
        std::memcpy(&scale, &h.w[8], sizeof scale);
        if (stage.optimizer()) stage.optimizer()->set_lr_scale(scale);
        stage.step(value);
        break;
      }
      case kZeroGrad:
        stage.zero_grad();
        break;
      case kStash:
        stage.stash_weights();
        break;
      case kUseStash:
        stage.use_stash(h.w[4] != 0);
        break;
      case kReset:
        stage.reset();
        break;
      case kSteps: {
        if (value > 4096) fail("layer shards", cat("told ", value, " checkpoints to look for (4096 at most)"));
        std::vector<float> steps(value * 2);
        group.broadcast(steps, 0);
        std::vector<float> held(value);
        for (std::size_t i = 0; i < value; ++i) {
          uint64_t step = 0;
          std::memcpy(&step, &steps[i * 2], sizeof step);
          held[i] = follower.has(step) ? 1.0f : 0.0f;
        }
        group.all_sum(held);
        break;
      }
      case kSave:
        follower.save(value);
        break;
      case kRestore:
        follower.restore(value);
        break;
      case kGather:
        follower.gather();
        break;
      case kHello: {
        std::array<uint8_t, 32> terms{};
        if (n != 1 || tensors[0].numel() != 8) fail("layer shards", "a hello told without its terms");
        std::memcpy(terms.data(), tensors[0].data(), terms.size());
        if (terms != follower.terms)
          fail("layer shards", cat("member ", group.rank(), " runs other terms than member 0 (the model, cut, stage, "
                                   "shard count, seed or optimizer differ): give every member the same deployment"));
        break;
      }
      case kEnd:
        if (h.w[4] != 0) fail("layer shards", "member 0 ended the run on an error: its log says which");
        return calls;
      default:
        break;
    }
  }
}

}  // namespace tandem
