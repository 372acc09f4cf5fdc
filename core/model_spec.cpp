#include "core/model_spec.h"

#include <flatbuffers/flatbuffers.h>

#include <set>

#include "core/error.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

constexpr std::string_view kWhere = "model spec";

std::string node_label(const spec::Node* node, std::size_t index) {
  if (node && node->name() && node->name()->size() > 0) return cat("node '", node->name()->str(), "'");
  return cat("node #", index);
}

// Reads an int-or-pair field: absent -> fallback, one value -> square, two -> (h, w).
Pair read_pair(const flatbuffers::Vector<int32_t>* v, Pair fallback, const std::string& label,
               std::string_view field, int64_t min_value) {
  if (!v || v->size() == 0) return fallback;
  if (v->size() > 2) fail(kWhere, cat(label, ": field '", field, "' takes 1 or 2 values, got ", v->size()));
  Pair p{v->Get(0), v->Get(v->size() - 1)};
  for (int64_t x : p)
    if (x < min_value)
      fail(kWhere, cat(label, ": field '", field, "' must be >= ", min_value, ", got ", x));
  return p;
}

NodeSpec read_node(const spec::Node* node, std::size_t index) {
  const std::string label = node_label(node, index);
  if (!node) fail(kWhere, cat(label, ": empty entry"));
  NodeSpec out;
  if (!node->name() || node->name()->size() == 0) fail(kWhere, cat(label, ": missing field 'name'"));
  out.name = node->name()->str();
  if (!node->op() || node->op()->size() == 0) fail(kWhere, cat(label, ": missing field 'op'"));
  out.op = node->op()->str();
  const auto& ops = known_ops();
  if (std::find(ops.begin(), ops.end(), out.op) == ops.end()) {
    std::string known;
    for (const auto& o : ops) known += (known.empty() ? "" : ", ") + o;
    fail(kWhere, cat(label, ": field 'op' has unknown op '", out.op, "' (known: ", known, ")"));
  }
  if (node->inputs())
    for (const auto* in : *node->inputs()) out.inputs.push_back(in ? in->str() : std::string());

  if (out.op == "conv2d") {
    const auto* a = node->conv2d();
    if (!a) fail(kWhere, cat(label, " (conv2d): missing field 'conv2d'"));
    if (a->out_channels() <= 0)
      fail(kWhere, cat(label, " (conv2d): field 'conv2d.out_channels' must be > 0, got ", a->out_channels()));
    out.conv2d.out_channels = a->out_channels();
    if (!a->kernel() || a->kernel()->size() == 0)
      fail(kWhere, cat(label, " (conv2d): missing field 'conv2d.kernel'"));
    out.conv2d.kernel = read_pair(a->kernel(), {0, 0}, label, "conv2d.kernel", 1);
    out.conv2d.stride = read_pair(a->stride(), {1, 1}, label, "conv2d.stride", 1);
    out.conv2d.padding = read_pair(a->padding(), {0, 0}, label, "conv2d.padding", 0);
    out.conv2d.dilation = read_pair(a->dilation(), {1, 1}, label, "conv2d.dilation", 1);
    if (a->groups() < 1 || a->out_channels() % a->groups() != 0)
      fail(kWhere, cat(label, " (conv2d): field 'conv2d.groups' must be >= 1 and divide out_channels ",
                       a->out_channels(), ", got ", a->groups()));
    out.conv2d.groups = a->groups();
    out.conv2d.bias = a->bias();
  } else if (out.op == "linear") {
    const auto* a = node->linear();
    if (!a) fail(kWhere, cat(label, " (linear): missing field 'linear'"));
    if (a->out_features() <= 0)
      fail(kWhere, cat(label, " (linear): field 'linear.out_features' must be > 0, got ", a->out_features()));
    out.linear.out_features = a->out_features();
    out.linear.bias = a->bias();
  } else if (out.op == "dropout") {
    if (const auto* a = node->dropout()) {
      if (!(a->p() >= 0.0f && a->p() < 1.0f))
        fail(kWhere, cat(label, " (dropout): field 'dropout.p' must be in [0, 1), got ", a->p()));
      out.dropout.p = a->p();
    }
  } else if (out.op == "batch_norm") {
    if (const auto* a = node->batch_norm()) {
      if (!(a->eps() > 0.0f)) fail(kWhere, cat(label, " (batch_norm): field 'batch_norm.eps' must be > 0, got ", a->eps()));
      if (!(a->momentum() >= 0.0f && a->momentum() <= 1.0f))
        fail(kWhere, cat(label, " (batch_norm): field 'batch_norm.momentum' must be in [0, 1], got ", a->momentum()));
      out.batch_norm = {a->eps(), a->momentum()};
    }
  } else if (out.op == "heads") {
    const auto* a = node->heads();
    if (!a) fail(kWhere, cat(label, " (heads): missing field 'heads'"));
    for (const auto& [field, v] : {std::pair{"heads.count", a->count()}, std::pair{"heads.hidden", a->hidden()},
                                   std::pair{"heads.out_features", a->out_features()}})
      if (v <= 0) fail(kWhere, cat(label, " (heads): field '", field, "' must be > 0, got ", v));
    out.heads = {a->count(), a->hidden(), a->out_features()};
  } else if (out.op == "max_pool2d" || out.op == "avg_pool2d") {
    const auto* a = node->pool();
    if (!a) fail(kWhere, cat(label, " (", out.op, "): missing field 'pool'"));
    if (!a->kernel() || a->kernel()->size() == 0)
      fail(kWhere, cat(label, " (", out.op, "): missing field 'pool.kernel'"));
    out.pool.kernel = read_pair(a->kernel(), {0, 0}, label, "pool.kernel", 1);
    out.pool.stride = read_pair(a->stride(), out.pool.kernel, label, "pool.stride", 1);
    out.pool.padding = read_pair(a->padding(), {0, 0}, label, "pool.padding", 0);
    for (int i = 0; i < 2; ++i)
      if (out.pool.padding[static_cast<std::size_t>(i)] * 2 > out.pool.kernel[static_cast<std::size_t>(i)])
        fail(kWhere, cat(label, " (", out.op, "): field 'pool.padding' must be at most half the kernel"));
  }
  return out;
}

}  // namespace

const std::vector<std::string>& known_ops() {
  static const std::vector<std::string> ops{"conv2d",    "linear", "relu",    "max_pool2d", "flatten", "heads",
                                            "relu6",     "hardswish", "gelu", "sigmoid", "tanh", "global_avg_pool", "softmax", "add", "concat", "batch_norm", "dropout",
                                            "avg_pool2d"};
  return ops;
}

ModelSpec parse_model_binary(const uint8_t* data, std::size_t size) {
  if (!data || size < 8 || !flatbuffers::BufferHasIdentifier(data, spec::ModelIdentifier()))
    fail(kWhere, "not a tandem model spec (missing file identifier 'TDMS')");
  flatbuffers::Verifier verifier(data, size);
  if (!spec::VerifyModelBuffer(verifier)) fail(kWhere, "binary model spec failed FlatBuffers verification");
  const spec::Model* m = spec::GetModel(data);

  ModelSpec out;
  out.binary.assign(data, data + size);
  if (m->name()) out.name = m->name()->str();
  if (!m->inputs() || m->inputs()->size() == 0) fail(kWhere, "missing field 'inputs' (at least one input)");
  for (flatbuffers::uoffset_t i = 0; i < m->inputs()->size(); ++i) {
    const spec::Input* in = m->inputs()->Get(i);
    const std::string label = cat("input #", i);
    if (!in->name() || in->name()->size() == 0) fail(kWhere, cat(label, ": missing field 'name'"));
    if (!in->shape() || in->shape()->size() == 0 || in->shape()->size() > kMaxRank - 1)
      fail(kWhere, cat("input '", in->name()->str(), "': field 'shape' needs 1 to ", kMaxRank - 1,
                       " dimensions (per sample, no batch)"));
    InputSpec s;
    s.name = in->name()->str();
    std::vector<int64_t> dims;
    for (int64_t d : *in->shape()) {
      if (d <= 0) fail(kWhere, cat("input '", s.name, "': field 'shape' has a non-positive dimension"));
      dims.push_back(d);
    }
    s.shape = Shape::of(dims.data(), static_cast<int>(dims.size()));
    out.inputs.push_back(std::move(s));
  }
  if (!m->nodes() || m->nodes()->size() == 0) fail(kWhere, "missing field 'nodes' (at least one node)");
  std::set<std::string> names;
  for (const auto& in : out.inputs)
    if (!names.insert(in.name).second) fail(kWhere, cat("input '", in.name, "': name used twice"));
  for (flatbuffers::uoffset_t i = 0; i < m->nodes()->size(); ++i) {
    NodeSpec node = read_node(m->nodes()->Get(i), i);
    if (!names.insert(node.name).second)
      fail(kWhere, cat("node '", node.name, "': field 'name' repeats a name already used"));
    out.nodes.push_back(std::move(node));
  }
  out.output = m->output() && m->output()->size() ? m->output()->str() : out.nodes.back().name;
  if (!names.count(out.output)) fail(kWhere, cat("field 'output' names unknown node '", out.output, "'"));
  if (m->loss() && m->loss()->size()) out.loss = m->loss()->str();
  if (out.loss != "softmax_cross_entropy" && out.loss != "mse")
    fail(kWhere, cat("field 'loss' has unknown loss '", out.loss, "' (known: softmax_cross_entropy, mse)"));
  if (m->cut()) out.cut = m->cut()->str();
  return out;
}

}  // namespace tandem
