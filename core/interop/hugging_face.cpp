// The adaptations are applied on import only: tandem's own files (export, checkpoints) hold
// F32 tensors under the model's names, which pass through unchanged.
#include "core/interop/hugging_face.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/wire/tensor_codec.h"

namespace tandem {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "X.LayerNorm.weight" -> "X.LayerNorm.gamma", ".bias" -> ".beta"; else "".
std::string layer_norm_alias(const std::string& name) {
  if (ends_with(name, "LayerNorm.weight")) return name.substr(0, name.size() - 6) + "gamma";
  if (ends_with(name, "LayerNorm.bias")) return name.substr(0, name.size() - 4) + "beta";
  return "";
}

// For a position table's weight "X.position_embeddings.weight" of a position_embedding node
// whose model has no "X.token_type_embeddings" (neither a node nor the node's own token-type
// table, embedding.types): the token-type table's name, folded in; else "".
std::string token_type_name(const Graph& whole, const std::string& name) {
  const std::string suffix = "position_embeddings.weight";
  if (!ends_with(name, suffix)) return "";
  const int node = whole.find(name.substr(0, name.size() - 7));
  if (node < 0 || whole.nodes()[static_cast<std::size_t>(node)].spec.op != "position_embedding") return "";
  if (whole.nodes()[static_cast<std::size_t>(node)].spec.embedding.types > 0) return "";
  const std::string prefix = name.substr(0, name.size() - suffix.size());
  if (whole.find(prefix + "token_type_embeddings") >= 0) return "";
  return prefix + "token_type_embeddings.weight";
}

const SafeTensor* find(const std::vector<SafeTensor>& tensors, const std::string& name) {
  for (const SafeTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

int64_t numel(const SafeTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

SafeTensor widened(const SafeTensor& t) {
  if (t.dtype == "F32") return t;
  wire::DType d;
  if (t.dtype == "F16")
    d = wire::DType::F16;
  else if (t.dtype == "BF16")
    d = wire::DType::BF16;
  else
    fail("weights", cat("'", t.name, "' is ", t.dtype, ": tandem reads weights as F32, F16 or BF16"));
  std::vector<float> values(static_cast<std::size_t>(numel(t)));
  std::string why;
  if (!decode_tensor(d, t.data.data(), numel(t), 1.0f, values.data(), why))
    fail("weights", cat("'", t.name, "' holds a value that is not finite: ", why));
  return f32_tensor(t.name, t.shape, values.data());
}

}  // namespace

std::vector<std::string> hugging_face_aliases(const Graph& whole, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (std::string a = layer_norm_alias(name); !a.empty()) out.push_back(std::move(a));
    if (std::string a = token_type_name(whole, name); !a.empty()) out.push_back(std::move(a));
  }
  return out;
}

std::optional<SafeTensor> hugging_face_tensor(const Graph& whole, const std::vector<SafeTensor>& tensors,
                                              const std::string& name) {
  const SafeTensor* found = find(tensors, name);
  if (!found) {
    const std::string alias = layer_norm_alias(name);
    if (!alias.empty()) found = find(tensors, alias);
  }
  if (!found) return std::nullopt;
  SafeTensor t = widened(*found);
  t.name = name;
  const std::string type_name = token_type_name(whole, name);
  if (type_name.empty()) return t;
  // A position table: cut to the model's positions, then add segment A's row.
  const GraphNode& node = whole.node(name.substr(0, name.size() - 7));
  const int64_t positions = node.spec.embedding.count, features = node.shape[node.shape.rank() - 1];
  if (t.shape.size() == 2 && t.shape[1] == features && t.shape[0] > positions) {
    t.data.resize(static_cast<std::size_t>(positions * features) * sizeof(float));
    t.shape[0] = positions;
  }
  if (const SafeTensor* types = find(tensors, type_name)) {
    const SafeTensor tt = widened(*types);
    if (tt.shape.size() != 2 || tt.shape[1] != features || tt.shape[0] < 1)
      fail("weights", cat("'", type_name, "' should be [types, ", features, "] to fold into '", name, "'"));
    if (t.shape.size() == 2 && t.shape[1] == features) {
      std::vector<float> row(static_cast<std::size_t>(features)), table(static_cast<std::size_t>(numel(t)));
      std::memcpy(row.data(), tt.data.data(), row.size() * sizeof(float));
      std::memcpy(table.data(), t.data.data(), table.size() * sizeof(float));
      for (std::size_t i = 0; i < table.size(); ++i) table[i] += row[i % row.size()];
      std::memcpy(t.data.data(), table.data(), table.size() * sizeof(float));
    }
  }
  return t;
}

std::vector<SafeTensor> hugging_face_export_extras(const Graph& whole) {
  std::vector<SafeTensor> out;
  for (const GraphNode& n : whole.nodes()) {
    const std::string& name = n.spec.name;
    const std::string suffix = "position_embeddings";
    if (n.spec.op != "position_embedding" || !ends_with(name, suffix) || n.spec.embedding.types > 0) continue;
    const std::string prefix = name.substr(0, name.size() - suffix.size());
    if (whole.find(prefix + "word_embeddings") < 0 || whole.find(prefix + "token_type_embeddings") >= 0) continue;
    const auto& names = n.spec.torch_names;  // ("token_type_embeddings", ""): PyTorch's model has none
    if (std::find(names.begin(), names.end(), std::pair<std::string, std::string>{"token_type_embeddings", ""}) != names.end())
      continue;
    const int64_t features = n.shape[n.shape.rank() - 1];
    const std::vector<float> zeros(static_cast<std::size_t>(2 * features), 0.0f);
    out.push_back(f32_tensor(prefix + "token_type_embeddings.weight", {2, features}, zeros.data()));
  }
  return out;
}

}  // namespace tandem
