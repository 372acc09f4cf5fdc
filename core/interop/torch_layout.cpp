#include "core/interop/torch_layout.h"

#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/interop/hugging_face.h"
#include "core/ops/op.h"

namespace tandem {
namespace {

// How a tensor's layout differs from torch's.
struct Layout {
  enum Kind { Same, ConvWeight, FlatColumns, FlatVector, ImageOrder } kind = Same;
  int64_t h = 1, w = 1, c = 1;  // the flattened image (FlatColumns, FlatVector)
};

// The image a node's input was flattened from (flatten: tandem's [H, W, C] read as torch's
// [C, H, W]), through elementwise ops; h = w = 1 if none. Another view (reshape) keeps the
// stored order: its columns are torch's as they are.
Layout flattened_input(const Graph& g, const GraphNode& node) {
  Layout l;
  if (g.input_shapes(node)[0].rank() != 1) return l;  // a sequence's linear: features are features
  int source = node.sources.empty() ? 0 : node.sources[0];
  while (source < 0) {
    const GraphNode& n = g.nodes()[static_cast<std::size_t>(-source - 1)];
    const OpDef& d = op_def(n.spec.op);
    if (d.view) {
      if (n.spec.op != "flatten") return l;
      const int in = n.sources[0];
      const Shape s = in >= 0 ? g.inputs()[static_cast<std::size_t>(in)].shape
                              : g.nodes()[static_cast<std::size_t>(-in - 1)].shape;
      if (s.rank() == 3) l = {Layout::Same, s[0], s[1], s[2]};
      return l;
    }
    if (!d.keeps_layout) return l;
    source = n.sources[0];
  }
  return l;
}

// The node of a tensor "<node>.<field>" and its field: the longest dotted prefix that names a
// node (a field may hold dots itself: layout_embedding's "x_position_embeddings.weight").
std::pair<const GraphNode*, std::string> node_of(const Graph& g, const std::string& name) {
  auto dot = name.rfind('.');
  if (dot == std::string::npos) fail("torch layout", cat("'", name, "' names no node's tensor"));
  const auto last = dot;
  int index = g.find(name.substr(0, dot));
  while (index < 0 && dot > 0 && (dot = name.rfind('.', dot - 1)) != std::string::npos) index = g.find(name.substr(0, dot));
  if (index < 0) fail("torch layout", cat("'", name, "': the model has no node '", name.substr(0, last), "'"));
  return {&g.nodes()[static_cast<std::size_t>(index)], name.substr(dot + 1)};
}

Layout layout_of(const Graph& g, const std::string& name) {
  const auto [found, field] = node_of(g, name);
  const GraphNode& node = *found;
  const OpDef& d = op_def(node.spec.op);
  const TorchLayout torch = d.torch_layout ? d.torch_layout(node.spec, field) : TorchLayout::Same;
  if (torch == TorchLayout::ConvWeight) return {Layout::ConvWeight};
  if (torch == TorchLayout::ImageOrder) return {Layout::ImageOrder};
  if (torch == TorchLayout::Same) return {};
  Layout l = flattened_input(g, node);  // the columns or channels index this image, if any
  if (l.h * l.w == 1) return {};
  l.kind = torch == TorchLayout::InputColumns ? Layout::FlatColumns : Layout::FlatVector;
  return l;
}

// Index of tandem's flattened (h, w, c) element in torch's (c, h, w) order.
int64_t torch_index(const Layout& l, int64_t i) {
  const int64_t c = i % l.c, hw = i / l.c;
  return c * l.h * l.w + hw;
}

}  // namespace

std::string torch_name(const Graph& whole, const std::string& name) {
  const auto [node, field] = node_of(whole, name);
  for (const auto& [f, renamed] : node->spec.torch_names)
    if (f == field) return renamed;
  return name;
}

SafeTensor to_torch(const Graph& whole, const std::string& name, const Tensor& value) {
  const Layout l = layout_of(whole, name);
  const Shape& s = value.shape();
  std::vector<int64_t> dims;
  for (int i = 0; i < s.rank(); ++i) dims.push_back(s[i]);
  std::vector<float> out(static_cast<std::size_t>(value.numel()));
  const float* v = value.data();
  switch (l.kind) {
    case Layout::Same:
      std::memcpy(out.data(), v, value.bytes());
      break;
    case Layout::ConvWeight: {  // [O, kh, kw, I] -> [O, I, kh, kw]
      const int64_t o = s[0], kh = s[1], kw = s[2], ci = s[3];
      for (int64_t a = 0; a < o; ++a)
        for (int64_t y = 0; y < kh; ++y)
          for (int64_t x = 0; x < kw; ++x)
            for (int64_t k = 0; k < ci; ++k)
              out[static_cast<std::size_t>(((a * ci + k) * kh + y) * kw + x)] = v[((a * kh + y) * kw + x) * ci + k];
      dims = {o, ci, kh, kw};
      break;
    }
    case Layout::FlatColumns: {
      const int64_t rows = s[0], cols = s[1];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < cols; ++i) out[static_cast<std::size_t>(r * cols + torch_index(l, i))] = v[r * cols + i];
      break;
    }
    case Layout::FlatVector:
      for (int64_t i = 0; i < value.numel(); ++i) out[static_cast<std::size_t>(torch_index(l, i))] = v[i];
      break;
    case Layout::ImageOrder:  // [H, W, C] -> [C, H, W] (a layer scale over an image: [C, 1, 1])
      if (s.rank() != 3) {
        std::memcpy(out.data(), v, value.bytes());
        break;
      }
      for (int64_t i = 0; i < value.numel(); ++i) {
        const int64_t c = i % s[2], hw = i / s[2];
        out[static_cast<std::size_t>(c * s[0] * s[1] + hw)] = v[i];
      }
      dims = {s[2], s[0], s[1]};
      break;
  }
  return f32_tensor(torch_name(whole, name), dims, out.data());
}

void from_torch(const Graph& whole, const std::string& name, const SafeTensor& t, Tensor& out) {
  if (t.dtype != "F32") fail("torch layout", cat("'", t.name, "' is ", t.dtype, "; tandem's weights are F32"));
  // The expected torch shape is what to_torch makes of a tensor of out's shape.
  const SafeTensor probe = to_torch(whole, name, Tensor::zeros(out.shape()));
  if (probe.shape != t.shape) {
    std::string want, got;
    for (int64_t d : probe.shape) want += cat(want.empty() ? "" : ", ", d);
    for (int64_t d : t.shape) got += cat(got.empty() ? "" : ", ", d);
    fail("torch layout", cat("'", t.name, "' is [", got, "] in the file, the model needs [", want, "]"));
  }
  const Layout l = layout_of(whole, name);
  const auto* v = reinterpret_cast<const float*>(t.data.data());
  std::vector<float> aligned(v, v + out.numel());  // the file's bytes need not be float-aligned
  v = aligned.data();
  const Shape& s = out.shape();
  float* o = out.data();
  switch (l.kind) {
    case Layout::Same:
      std::memcpy(o, v, out.bytes());
      break;
    case Layout::ConvWeight: {
      const int64_t co = s[0], kh = s[1], kw = s[2], ci = s[3];
      for (int64_t a = 0; a < co; ++a)
        for (int64_t y = 0; y < kh; ++y)
          for (int64_t x = 0; x < kw; ++x)
            for (int64_t k = 0; k < ci; ++k) o[((a * kh + y) * kw + x) * ci + k] = v[((a * ci + k) * kh + y) * kw + x];
      break;
    }
    case Layout::FlatColumns: {
      const int64_t rows = s[0], cols = s[1];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < cols; ++i) o[r * cols + i] = v[r * cols + torch_index(l, i)];
      break;
    }
    case Layout::FlatVector:
      for (int64_t i = 0; i < out.numel(); ++i) o[i] = v[torch_index(l, i)];
      break;
    case Layout::ImageOrder:
      if (s.rank() != 3) {
        std::memcpy(o, v, out.bytes());
        break;
      }
      for (int64_t i = 0; i < out.numel(); ++i) o[i] = v[(i % s[2]) * s[0] * s[1] + i / s[2]];
      break;
  }
}

std::vector<SafeTensor> shard_to_torch(const Graph& whole, Network& shard, int64_t batches_tracked) {
  std::vector<SafeTensor> out;
  for (Param* p : shard.all_params()) out.push_back(to_torch(whole, p->name(), p->value()));
  for (auto& [name, t] : shard.buffers()) {
    out.push_back(to_torch(whole, name, *t));
    const std::string& torch = out.back().name;
    const std::string suffix = ".running_var";
    if (torch.size() > suffix.size() && torch.compare(torch.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(i64_tensor(torch.substr(0, torch.size() - suffix.size()) + ".num_batches_tracked", {},
                               &batches_tracked));
  }
  return out;
}

std::vector<std::string> tensor_names(Network& shard) {
  std::vector<std::string> out;
  for (Param* p : shard.all_params()) out.push_back(p->name());
  for (auto& [name, t] : shard.buffers()) out.push_back(name);
  return out;
}

std::vector<std::string> torch_tensor_names(const Graph& whole, Network& shard) {
  std::vector<std::string> names = tensor_names(shard);
  for (std::string& name : names) name = torch_name(whole, name);
  return names;
}

std::vector<std::string> import_names(const Graph& whole, Network& shard) {
  std::vector<std::string> names = torch_tensor_names(whole, shard);
  for (std::string& alias : hugging_face_aliases(whole, names)) names.push_back(std::move(alias));
  return names;
}

void shard_from_torch(const Graph& whole, const std::vector<SafeTensor>& tensors, Network& shard) {
  auto adapter = [](const std::string& name) {
    return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
  };
  for (Param* p : shard.all_params()) {
    const std::string name = torch_name(whole, p->name());
    const std::optional<SafeTensor> t = hugging_face_tensor(whole, tensors, name);
    // A base model's file has no LoRA adapters: they start as PEFT starts them (B zero).
    if (!t && adapter(p->name())) continue;
    if (!t) fail("torch layout", cat("the weights have no tensor '", name, "'"));
    from_torch(whole, p->name(), *t, p->value());
    p->bump_version();
  }
  for (auto& [name, t] : shard.buffers()) {
    const std::optional<SafeTensor> saved = hugging_face_tensor(whole, tensors, torch_name(whole, name));
    if (!saved) fail("torch layout", cat("the weights have no tensor '", torch_name(whole, name), "'"));
    from_torch(whole, name, *saved, *t);
  }
}

}  // namespace tandem
