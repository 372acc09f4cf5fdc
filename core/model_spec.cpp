#include "core/model_spec.h"

#include <flatbuffers/flatbuffers.h>

#include <set>

#include "core/error.h"
#include "core/flatbuffer_read.h"
#include "core/ops/op.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

constexpr std::string_view kWhere = "model spec";

std::string node_label(const spec::Node* node, std::size_t index) {
  if (node && node->name() && node->name()->size() > 0) return cat("node '", node->name()->str(), "'");
  return cat("node #", index);
}

NodeSpec read_node(const spec::Node* node, std::size_t index) {
  const std::string label = node_label(node, index);
  if (!node) fail(kWhere, cat(label, ": empty entry"));
  NodeSpec out;
  if (!node->name() || node->name()->size() == 0) fail(kWhere, cat(label, ": missing field 'name'"));
  out.name = node->name()->str();
  if (!node->op() || node->op()->size() == 0) fail(kWhere, cat(label, ": missing field 'op'"));
  out.op = node->op()->str();
  const OpDef* def = find_op(out.op);
  if (!def) {
    std::string known;
    for (const auto& o : op_names()) known += (known.empty() ? "" : ", ") + o;
    fail(kWhere, cat(label, ": field 'op' has unknown op '", out.op, "' (known: ", known, ")"));
  }
  if (node->inputs())
    for (const auto* in : *node->inputs()) out.inputs.push_back(in ? in->str() : std::string());
  if (def->parse) def->parse(*node, out, label);
  out.freeze = node->freeze();
  if (out.freeze && !def->freezable)
    fail(kWhere, cat(label, ": field 'freeze': freezing a ", out.op, " node is not supported yet (linear, conv2d, "
                     "layer_norm and the embeddings can be frozen)"));
  if (const auto* l = node->lora()) {
    if (out.op != "linear") fail(kWhere, cat(label, ": field 'lora' applies to linear nodes only"));
    if (l->rank() <= 0) fail(kWhere, cat(label, " (linear): field 'lora.rank' must be > 0, got ", l->rank()));
    if (l->alpha() < 0.0f) fail(kWhere, cat(label, " (linear): field 'lora.alpha' must be >= 0, got ", l->alpha()));
    if (!(l->dropout() >= 0.0f && l->dropout() < 1.0f))
      fail(kWhere, cat(label, " (linear): field 'lora.dropout' must be in [0, 1), got ", l->dropout()));
    out.lora = {l->rank(), l->alpha(), l->dropout()};
  }
  if (const auto* names = node->torch_names()) {
    std::set<std::string> fields;
    for (flatbuffers::uoffset_t k = 0; k < names->size(); ++k) {
      const spec::TorchName* t = names->Get(k);
      // An empty name says PyTorch's model has no such tensor: only a position table's
      // token-type table (an imported BERT without one), which export then does not add.
      const bool none = t && t->field() && t->field()->str() == "token_type_embeddings" && t->name() && t->name()->size() == 0 &&
                        out.op == "position_embedding";
      if (none && out.embedding.types > 0)
        fail(kWhere, cat(label, ": field 'torch_names' says PyTorch's model has no token-type table, and field "
                                "'embedding.types' gives it one"));
      if (!t || !t->field() || t->field()->size() == 0 || !t->name() || (t->name()->size() == 0 && !none))
        fail(kWhere, cat(label, ": field 'torch_names' entry ", k, " needs a 'field' and a 'name'"));
      if (!fields.insert(t->field()->str()).second)
        fail(kWhere, cat(label, ": field 'torch_names' names field '", t->field()->str(), "' twice"));
      out.torch_names.emplace_back(t->field()->str(), t->name()->str());
    }
  }
  return out;
}

}  // namespace

const std::vector<std::string>& known_ops() { return op_names(); }

const char* reduce_mode_name(ReduceAttrs::Mode m) {
  static const char* const names[] = {"sum", "mean", "max", "min"};
  return names[static_cast<int>(m)];
}

const char* binary_mode_name(BinaryAttrs::Mode m) {
  static const char* const names[BinaryAttrs::kModes] = {"add",  "sub",     "mul",        "div",          "equal",
                                                         "not_equal", "less", "greater", "less_equal", "greater_equal"};
  return names[static_cast<int>(m)];
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
    for (flatbuffers::uoffset_t k = 0; k < in->shape()->size(); ++k) {
      const int64_t d = int64_at(*in->shape(), k);
      if (d <= 0) fail(kWhere, cat("input '", s.name, "': field 'shape' has a non-positive dimension"));
      dims.push_back(d);
    }
    s.shape = Shape::of(dims.data(), static_cast<int>(dims.size()));
    const std::string dtype = in->dtype() ? in->dtype()->str() : "float32";
    if (dtype != "float32" && dtype != "int32")
      fail(kWhere, cat("input '", s.name, "': field 'dtype' is 'float32' or 'int32', got '", dtype, "'"));
    s.integer = dtype == "int32";
    s.mask = in->mask();
    s.marks_padding = in->marks_padding();
    if (s.marks_padding && !s.mask)
      fail(kWhere, cat("input '", s.name, "': field 'marks_padding' belongs on the mask input (mask: true)"));
    if (s.mask && s.shape.rank() != 1)
      fail(kWhere, cat("input '", s.name, "': a mask is [tokens] per sample, got ", s.shape.str()));
    if (in->length_buckets() && in->length_buckets()->size() > 0) {
      if (!s.mask) fail(kWhere, cat("input '", s.name, "': field 'length_buckets' belongs on the mask input"));
      if (in->length_buckets()->size() > kMaxLengthBuckets)
        fail(kWhere, cat("input '", s.name, "': field 'length_buckets' has more than ", kMaxLengthBuckets, " lengths"));
      for (flatbuffers::uoffset_t k = 0; k < in->length_buckets()->size(); ++k) {
        const int64_t b = int64_at(*in->length_buckets(), k);
        if (b < 1 || b > s.shape[0] || (!s.length_buckets.empty() && b <= s.length_buckets.back()))
          fail(kWhere, cat("input '", s.name, "': field 'length_buckets' needs increasing lengths in [1, ", s.shape[0],
                           "], got ", b, " at position ", k));
        s.length_buckets.push_back(b);
      }
      if (s.length_buckets.back() != s.shape[0]) s.length_buckets.push_back(s.shape[0]);
    }
    if (!s.shape.numel_at_most(kMaxSampleElements))
      fail(kWhere, cat("input '", s.name, "': field 'shape' has more than ", kMaxSampleElements,
                       " elements per sample"));
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
