#include "core/interop/onnx_import.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "core/error.h"

namespace tandem {
namespace {

// How tandem holds an ONNX value of one sample: an image (ONNX [N, C, H, W], tandem
// [H, W, C]), a globally pooled image (ONNX [N, C, 1, 1], tandem [C]) or a vector (ONNX
// [N, F], tandem [F]). FlatImage: an image flattened, whose values tandem orders (h, w, c)
// and PyTorch (c, h, w): a linear reading it gets its columns permuted on load
// (torch_layout.h), through activations and dropout, but an add, a join or a batch norm of
// it would mix the orders, so those are refused. Unknown: made by a node that was refused
// (its readers are not refused again for it).
enum class Form { Image, Pooled, Vector, FlatImage, Unknown };

struct Value {
  std::string node;  // the tandem node or input holding it
  Form form = Form::Unknown;
};

// A node import refuses: why, in words that say what would work.
struct Refusal {
  std::string why;
};
// A node reading a refused node's output: not reported again.
struct Downstream {};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// torch's scope path "/layer1/layer1.0/conv1/Conv" -> module "layer1.0.conv1",
// "/features/features.1/block/block.1/fc1/Conv" -> "features.1.block.1.fc1"; "/Flatten" -> "".
std::string module_of(const std::string& onnx_name) {
  std::vector<std::string> parts;
  std::string part;
  for (char c : onnx_name) {
    if (c == '/') {
      if (!part.empty()) parts.push_back(part);
      part.clear();
    } else part += c;
  }
  // The last component (`part`) is the op's own name. A container's child is named by its
  // container's component and its index ("layer1" then "layer1.0"; "block" then "block.1").
  std::string m, previous;
  for (const std::string& p : parts) {
    if (m.empty()) m = p;
    else if (starts_with(p, previous + ".")) m += p.substr(previous.size());
    else m = cat(m, ".", p);
    previous = p;
  }
  return m;
}

// The last component of the scope path ("Add_1"), lower case: the name of a functional op.
std::string own_name(const std::string& onnx_name, const std::string& op_type) {
  const auto slash = onnx_name.rfind('/');
  const std::string last = slash == std::string::npos ? onnx_name : onnx_name.substr(slash + 1);
  return lower(last.empty() ? op_type : last);
}

class Importer {
 public:
  Importer(const OnnxGraph& g, const OnnxImportOptions& o) : g_(g), o_(o) {}

  OnnxImport run() {
    if (g_.nodes.empty()) fail("import", cat(o_.origin, ": the graph has no nodes"));
    if (g_.opset <= 0) fail("import", cat(o_.origin, ": the file names no opset of ONNX's default domain"));
    for (const OnnxTensor& t : g_.initializers) consts_[t.name] = stored_[t.name] = &t;
    // Constants read before their node in graph order too: patterns look ahead.
    for (const OnnxNode& n : g_.nodes) {
      const OnnxAttribute* v = n.op_type == "Constant" ? n.attribute("value") : nullptr;
      if (v && v->kind == OnnxAttribute::Kind::Tensor && !n.outputs.empty()) consts_[n.outputs[0]] = &v->t;
    }
    for (const OnnxNode& n : g_.nodes)
      for (const std::string& in : n.inputs)
        if (!in.empty()) ++uses_[in];
    for (const OnnxValue& v : g_.outputs) ++uses_[v.name];
    for (std::size_t i = 0; i < g_.nodes.size(); ++i)
      for (const std::string& in : g_.nodes[i].inputs) readers_[in].push_back(i);
    out_.spec.name = o_.name;
    read_inputs();
    for (std::size_t i = 0; i < g_.nodes.size(); ++i) {
      if (absorbed_.count(i)) continue;
      const OnnxNode& n = g_.nodes[i];
      try {
        const auto op = table().find(n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + "." + n.op_type);
        if (op == table().end()) throw Refusal{"tandem has no such op"};
        if (n.outputs.empty() || n.outputs[0].empty()) throw Refusal{"it has no output"};
        op->second(*this, n);
      } catch (const Refusal& r) {
        problems_.push_back(cat("node '", n.name, "' (", n.op_type, module_of(n.name).empty() ? "" : ", module " + module_of(n.name),
                                "): ", r.why));
        refused_types_.insert(n.op_type);
        for (const std::string& o : n.outputs) values_[o] = {};
      } catch (const Downstream&) {
        for (const std::string& o : n.outputs) values_[o] = {};
      } catch (const std::out_of_range&) {  // a node or a pattern's node without an input or output it needs
        problems_.push_back(cat("node '", n.name, "' (", n.op_type, "): it lacks an input or output its op needs"));
        refused_types_.insert(n.op_type);
        for (const std::string& o : n.outputs) values_[o] = {};
      }
    }
    if (g_.outputs.size() != 1)
      problems_.push_back(cat("the graph has ", g_.outputs.size(), " outputs; tandem trains a model with one (its logits)"));
    if (!problems_.empty()) {
      std::string types;
      for (const std::string& t : refused_types_) types += cat(types.empty() ? "" : ", ", t);
      std::string text = cat(o_.origin, ": ", problems_.size(), problems_.size() == 1 ? " problem" : " problems",
                             types.empty() ? "" : cat(" (ops: ", types, ")"), "; tandem imports none of the model:");
      for (const std::string& p : problems_) text += cat("\n  ", p);
      fail("import", text);
    }
    const auto made = values_.find(g_.outputs[0].name);
    if (made == values_.end())
      fail("import", cat(o_.origin, ": the output '", g_.outputs[0].name, "' is made by no node"));
    const Value& logits = made->second;
    if (logits.form == Form::Image)
      fail("import", cat(o_.origin, ": the output '", g_.outputs[0].name, "' is an image; tandem trains a model whose "
                         "output is [batch, classes] logits"));
    out_.spec.output = logits.node;
    resolve_cut();
    return std::move(out_);
  }

  using Handler = std::function<void(Importer&, const OnnxNode&)>;
  // One entry an ONNX op type tandem reads.
  static const std::map<std::string, Handler>& table();

 private:
  const OnnxGraph& g_;
  const OnnxImportOptions& o_;
  OnnxImport out_;
  std::map<std::string, const OnnxTensor*> consts_;  // initializers and Constant nodes' values
  std::map<std::string, const OnnxTensor*> stored_;  // initializers: the model's weights
  std::map<std::string, const OnnxTensor*> transposed_;  // Transpose outputs of stored matrices
  std::map<std::string, Value> values_;
  std::map<std::string, int> uses_;
  std::map<std::string, std::vector<std::size_t>> readers_;
  std::set<std::string> names_, params_used_, refused_types_;
  std::set<std::size_t> absorbed_;
  std::map<std::string, int> suffixes_;  // the last "_k" unique() gave a name
  std::vector<std::string> problems_;
  std::vector<std::string> modules_;  // each spec node's module, for cuts

  void read_inputs() {
    for (const OnnxValue& v : g_.inputs) {
      InputSpec in;
      in.name = v.name;
      names_.insert(v.name);
      for (std::size_t d = 1; d < v.dims.size(); ++d)
        if (v.dims[d] <= 0)
          fail("import", cat(o_.origin, ": input '", v.name, "' has dimension ", d,
                             v.dim_names[d].empty() ? cat(" (", v.dims[d], ")") : cat(" ('", v.dim_names[d], "')"),
                             " of no fixed size; tandem's inputs have fixed shapes but the batch: export with a fixed "
                             "size there (only dynamic_axes={'", v.name, "': {0: 'batch'}})"));
      const bool integer = v.elem_type == 6 || v.elem_type == 7;
      if (v.elem_type != 1 && !integer)
        fail("import", cat(o_.origin, ": input '", v.name, "' has element type ", v.elem_type,
                           "; tandem reads float32 inputs and int32/int64 ids"));
      Form form = Form::Vector;
      if (v.dims.size() == 4 && !integer) {
        in.shape = Shape{v.dims[2], v.dims[3], v.dims[1]};
        form = Form::Image;
      } else if (v.dims.size() == 2) {
        in.shape = Shape{v.dims[1]};
      } else {
        fail("import", cat(o_.origin, ": input '", v.name, "' has ", v.dims.size(), " dimensions; tandem imports images "
                           "[batch, channels, height, width] and vectors or ids [batch, n]"));
      }
      in.integer = integer;
      out_.spec.inputs.push_back(in);
      values_[v.name] = {v.name, form};
    }
  }

  const Value& value(const std::string& name) {
    const auto it = values_.find(name);
    if (it == values_.end()) {
      if (consts_.count(name)) throw Refusal{cat("input '", name, "' is a constant; tandem reads it only as a weight")};
      throw Refusal{cat("input '", name, "' is made by no node before it")};
    }
    if (it->second.form == Form::Unknown) throw Downstream{};
    return it->second;
  }
  const Value& input(const OnnxNode& n, std::size_t i) {
    if (i >= n.inputs.size() || n.inputs[i].empty()) throw Refusal{cat("input ", i, " is missing")};
    return value(n.inputs[i]);
  }
  const OnnxTensor* constant(const OnnxNode& n, std::size_t i) const {
    if (i >= n.inputs.size() || n.inputs[i].empty()) return nullptr;
    const auto it = consts_.find(n.inputs[i]);
    return it == consts_.end() ? nullptr : it->second;
  }
  // A weight the model stores (an initializer; a Constant node's value is no trained weight).
  const OnnxTensor* stored(const OnnxNode& n, std::size_t i) const {
    if (i >= n.inputs.size() || n.inputs[i].empty()) return nullptr;
    const auto it = stored_.find(n.inputs[i]);
    return it == stored_.end() ? nullptr : it->second;
  }
  const OnnxTensor& weight(const OnnxNode& n, std::size_t i, const char* what) {
    const OnnxTensor* t = stored(n, i);
    if (!t && constant(n, i)) throw Refusal{cat("its ", what, " (input ", i, ") is a constant of the graph, not a weight the model stores")};
    if (!t) throw Refusal{cat("its ", what, " (input ", i, ") is computed, not a stored weight; tandem trains weights it holds")};
    if (t->integer) throw Refusal{cat("its ", what, " '", t->name, "' holds integers")};
    return *t;
  }
  float scalar(const OnnxNode& n, std::size_t i, float fallback) const {
    const OnnxTensor* t = constant(n, i);
    if (i < n.inputs.size() && !n.inputs[i].empty() && !t) throw Refusal{cat("input ", i, " is computed; tandem needs a constant")};
    if (!t) return fallback;
    if (t->count() != 1) throw Refusal{cat("input ", i, " holds ", t->count(), " values where one is expected")};
    return t->integer ? static_cast<float>(t->ints[0]) : t->floats[0];
  }
  // An attribute of the kind its op defines, or the default when absent; one of another kind
  // is refused (never read as its default).
  static const OnnxAttribute* attr(const OnnxNode& n, const char* key, OnnxAttribute::Kind kind) {
    const OnnxAttribute* a = n.attribute(key);
    if (a && a->kind != kind) throw Refusal{cat("its attribute '", key, "' is not of the type ONNX defines for it")};
    return a;
  }
  int64_t int_attr(const OnnxNode& n, const char* key, int64_t fallback) const {
    const OnnxAttribute* a = attr(n, key, OnnxAttribute::Kind::Int);
    return a ? a->i : fallback;
  }
  float float_attr(const OnnxNode& n, const char* key, float fallback) const {
    const OnnxAttribute* a = attr(n, key, OnnxAttribute::Kind::Float);
    return a ? a->f : fallback;
  }
  std::vector<int64_t> ints_attr(const OnnxNode& n, const char* key, std::vector<int64_t> fallback) const {
    const OnnxAttribute* a = attr(n, key, OnnxAttribute::Kind::Ints);
    return a ? a->ints : fallback;
  }
  // Outputs after the first (batch norm's running statistics, max pool's indices, dropout's
  // mask) must be read by nobody: tandem's ops give the first only.
  void only_first_output_read(const OnnxNode& n) const {
    for (std::size_t i = 1; i < n.outputs.size(); ++i)
      if (!n.outputs[i].empty() && uses_.count(n.outputs[i]))
        throw Refusal{cat("its output ", i, " '", n.outputs[i], "' is read; tandem's op gives its first output only")};
  }
  // ONNX pads [top, left, bottom, right] -> tandem's symmetric (height, width).
  Pair symmetric_pads(const OnnxNode& n) const {
    const OnnxAttribute* auto_pad = attr(n, "auto_pad", OnnxAttribute::Kind::String);
    const std::string pad_mode = auto_pad ? auto_pad->s : "NOTSET";
    if (pad_mode != "NOTSET" && pad_mode != "VALID")
      throw Refusal{cat("auto_pad '", pad_mode, "' is not supported; export with explicit padding")};
    const std::vector<int64_t> p = ints_attr(n, "pads", {0, 0, 0, 0});
    if (p.size() != 4) throw Refusal{cat("has ", p.size() / 2, " spatial dimensions; tandem's are two (height, width)")};
    if (p[0] != p[2] || p[1] != p[3])
      throw Refusal{cat("pads [", p[0], ", ", p[1], ", ", p[2], ", ", p[3], "] differ before and after; tandem pads both sides alike")};
    return {p[0], p[1]};
  }
  static Pair pair2(const std::vector<int64_t>& v, const char* what) {
    if (v.size() != 2) throw Refusal{cat(what, " has ", v.size(), " values; tandem's windows are two-dimensional")};
    return {v[0], v[1]};
  }

  std::string unique(std::string base) {
    if (base.empty()) base = "node";
    std::string name = base;
    for (int& k = suffixes_[base]; names_.count(name);) name = cat(base, "_", ++k);
    names_.insert(name);
    return name;
  }
  // A node with weights: named after the module that holds them ("layer1.0.conv1.weight" ->
  // "layer1.0.conv1"); a renamed initializer ("onnx::MatMul_7"): after its node's module.
  std::string param_node_name(const OnnxNode& n, const OnnxTensor& w) {
    const std::string suffix = ".weight";
    if (w.name.size() > suffix.size() && w.name.compare(w.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string m = w.name.substr(0, w.name.size() - suffix.size());
      if (!names_.count(m)) return unique(m);
    }
    const std::string m = module_of(n.name);
    return unique(m.empty() ? lower(n.op_type) : m);
  }
  // A module's own op (nn.ReLU, nn.MaxPool2d, nn.Dropout): the module's name.
  std::string module_node_name(const OnnxNode& n) {
    const std::string m = module_of(n.name);
    return unique(m.empty() ? own_name(n.name, n.op_type) : m);
  }
  // An op inside a module's forward (x + identity, torch.flatten): "<module>.<op>".
  std::string functional_node_name(const OnnxNode& n) {
    const std::string m = module_of(n.name);
    const std::string own = own_name(n.name, n.op_type);
    return unique(m.empty() ? own : cat(m, ".", own));
  }

  void emit(const OnnxNode& n, NodeSpec node, Form form, const std::string& output) {
    values_[output] = {node.name, form};
    modules_.push_back(module_of(n.name));
    out_.spec.nodes.push_back(std::move(node));
  }
  void alias(const OnnxNode& n, const Value& v, Form form) { values_[n.outputs.at(0)] = {v.node, form}; }
  void add_weight(const std::string& node, const std::string& field, const OnnxTensor& t,
                  bool transpose = false) {
    if (!params_used_.insert(t.name).second)
      throw Refusal{cat("its weight '", t.name, "' is shared with another node (tied weights); tandem trains each node's own")};
    const std::string name = cat(node, ".", field);
    std::vector<int64_t> dims = t.dims;
    std::vector<float> values = t.floats;
    int64_t count = 1;
    for (int64_t d : dims) count *= d;
    if (static_cast<int64_t>(values.size()) != count || (transpose && dims.size() != 2))
      throw Refusal{cat("its weight '", t.name, "' holds ", values.size(), " values for its dimensions")};
    if (transpose) {
      const int64_t rows = dims[0], cols = dims[1];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) values[static_cast<std::size_t>(c * rows + r)] = t.floats[static_cast<std::size_t>(r * cols + c)];
      dims = {cols, rows};
    }
    if (t.name != name) out_.renamed.push_back(cat(t.name, " -> ", name, transpose ? " (transposed)" : ""));
    out_.weights.push_back(f32_tensor(name, dims, values.data()));
  }
  NodeSpec node_of(std::string name, const char* op, std::vector<std::string> inputs) {
    NodeSpec s;
    s.name = std::move(name);
    s.op = op;
    s.inputs = std::move(inputs);
    return s;
  }
  const Value& image(const OnnxNode& n) {
    const Value& x = input(n, 0);
    if (x.form == Form::Pooled)
      throw Refusal{"it reads a globally pooled [N, C, 1, 1] tensor (a squeeze-excitation block); tandem's windows read images"};
    if (x.form != Form::Image) throw Refusal{"it reads a vector; tandem's convolutions and pools read images [N, C, H, W]"};
    return x;
  }

  // ---- one function an ONNX op ----

  void conv(const OnnxNode& n) {
    const Value& x = image(n);
    const OnnxTensor& w = weight(n, 1, "weight");
    if (w.dims.size() != 4) throw Refusal{cat("its weight has ", w.dims.size(), " dimensions; tandem's convolutions are 2-D")};
    NodeSpec s = node_of(param_node_name(n, w), "conv2d", {x.node});
    Conv2dAttrs& c = s.conv2d;
    c.out_channels = w.dims[0];
    c.kernel = pair2(ints_attr(n, "kernel_shape", {w.dims[2], w.dims[3]}), "kernel_shape");
    if (c.kernel != Pair{w.dims[2], w.dims[3]}) throw Refusal{"kernel_shape differs from the weight's"};
    c.stride = pair2(ints_attr(n, "strides", {1, 1}), "strides");
    c.dilation = pair2(ints_attr(n, "dilations", {1, 1}), "dilations");
    c.padding = symmetric_pads(n);
    c.groups = int_attr(n, "group", 1);
    const OnnxTensor* b = stored(n, 2);
    if (n.inputs.size() > 2 && !n.inputs[2].empty() && !b) throw Refusal{"its bias is not a stored weight"};
    c.bias = b != nullptr;
    add_weight(s.name, "weight", w);
    if (b) add_weight(s.name, "bias", *b);
    emit(n, std::move(s), Form::Image, n.outputs.at(0));
  }

  void batch_norm(const OnnxNode& n) {
    only_first_output_read(n);
    const Value& x = input(n, 0);
    if (x.form == Form::FlatImage)
      throw Refusal{"it normalizes a flattened image, whose values tandem orders (h, w, c) and PyTorch (c, h, w)"};
    const OnnxTensor& scale = weight(n, 1, "scale");
    NodeSpec s = node_of(param_node_name(n, scale), "batch_norm", {x.node});
    s.batch_norm.eps = float_attr(n, "epsilon", 1e-5f);
    // ONNX keeps (1 - torch's momentum): 0.9 for nn.BatchNorm2d's 0.1, rounded as written.
    s.batch_norm.momentum = static_cast<float>(std::round((1.0 - float_attr(n, "momentum", 0.9f)) * 1e6) / 1e6);
    add_weight(s.name, "weight", scale);
    add_weight(s.name, "bias", weight(n, 2, "bias"));
    add_weight(s.name, "running_mean", weight(n, 3, "running mean"));
    add_weight(s.name, "running_var", weight(n, 4, "running variance"));
    emit(n, std::move(s), x.form, n.outputs.at(0));
  }

  void activation(const OnnxNode& n, const char* op) {
    const Value& x = input(n, 0);
    emit(n, node_of(module_node_name(n), op, {x.node}), x.form, n.outputs.at(0));
  }

  void clip(const OnnxNode& n) {
    // Opset 11 on: min and max are inputs; before, attributes.
    const float lo = g_.opset >= 11 ? scalar(n, 1, -INFINITY) : float_attr(n, "min", -INFINITY);
    const float hi = g_.opset >= 11 ? scalar(n, 2, INFINITY) : float_attr(n, "max", INFINITY);
    if (lo == 0.0f && hi == 6.0f) return activation(n, "relu6");
    if (lo == 0.0f && std::isinf(hi) && hi > 0) return activation(n, "relu");
    throw Refusal{cat("clips to [", lo, ", ", hi, "]; tandem has relu6 (clip to [0, 6]) and relu (to [0, inf))")};
  }

  void pool(const OnnxNode& n, const char* op) {
    only_first_output_read(n);
    const Value& x = image(n);
    if (int_attr(n, "ceil_mode", 0) != 0) throw Refusal{"ceil_mode=1 is not supported; tandem's windows floor the output size"};
    for (int64_t d : ints_attr(n, "dilations", {1, 1}))
      if (d != 1) throw Refusal{"dilated pooling windows are not supported"};
    if (int_attr(n, "storage_order", 0) != 0) throw Refusal{"storage_order=1 is not supported"};
    NodeSpec s = node_of(module_node_name(n), op, {x.node});
    s.pool.kernel = pair2(ints_attr(n, "kernel_shape", {}), "kernel_shape");
    s.pool.stride = pair2(ints_attr(n, "strides", {1, 1}), "strides");
    s.pool.padding = symmetric_pads(n);
    if (std::string(op) == "avg_pool2d" && s.pool.padding != Pair{0, 0} && int_attr(n, "count_include_pad", 0) == 0)
      throw Refusal{"count_include_pad=0 with padding: tandem's average counts the padding (PyTorch's default)"};
    emit(n, std::move(s), Form::Image, n.outputs.at(0));
  }

  void global_avg_pool(const OnnxNode& n) {
    const Value& x = image(n);
    emit(n, node_of(module_node_name(n), "global_avg_pool", {x.node}), Form::Pooled, n.outputs.at(0));
  }

  // ReduceMean over height and width: what torch's x.mean((2, 3)) exports.
  void reduce_mean(const OnnxNode& n) {
    const auto in = n.inputs.empty() ? values_.end() : values_.find(n.inputs[0]);
    if (in == values_.end() || in->second.form != Form::Image) return layer_norm_pattern(n);
    const Value& x = image(n);
    std::vector<int64_t> axes = ints_attr(n, "axes", {});
    if (axes.empty() && constant(n, 1)) axes = constant(n, 1)->ints;
    for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
    std::sort(axes.begin(), axes.end());
    if (axes != std::vector<int64_t>{2, 3}) throw Refusal{"it averages over other axes than height and width"};
    emit(n, node_of(functional_node_name(n), "global_avg_pool", {x.node}), int_attr(n, "keepdims", 1) ? Form::Pooled : Form::Vector,
         n.outputs.at(0));
  }

  // ---- patterns: decomposed modules put back together ----

  std::size_t index_of(const OnnxNode& n) const { return static_cast<std::size_t>(&n - g_.nodes.data()); }
  // The one node reading `value` (read once, by no graph output), of type `op`, or null.
  const OnnxNode* sole_reader(const std::string& value, const char* op) const {
    const auto r = readers_.find(value);
    const auto u = uses_.find(value);
    if (r == readers_.end() || r->second.size() != 1 || u == uses_.end() || u->second != 1) return nullptr;
    const OnnxNode& n = g_.nodes[r->second[0]];
    return n.op_type == op && !n.outputs.empty() ? &n : nullptr;
  }
  // Whether input `i` of `n` is a constant scalar within 1e-6 of `want` (relative above 1).
  bool is_scalar(const OnnxNode& n, std::size_t i, double want) const {
    const OnnxTensor* t = constant(n, i);
    if (!t || t->count() != 1) return false;
    const double v = t->integer ? static_cast<double>(t->ints[0]) : static_cast<double>(t->floats[0]);
    return std::abs(v - want) <= 1e-6 * std::max(1.0, std::abs(want));
  }
  // For a two-input op reading `value`: the index of its other input.
  static std::size_t other(const OnnxNode& n, const std::string& value) { return n.inputs.size() == 2 && n.inputs[0] == value ? 1 : 0; }
  void absorb(std::initializer_list<const OnnxNode*> nodes) {
    for (const OnnxNode* p : nodes) absorbed_.insert(index_of(*p));
  }

  // nn.LayerNorm as opset 14 decomposes it: ReduceMean(x) -> Sub(x, mean) -> Pow(2) ->
  // ReduceMean -> Add(eps) -> Sqrt -> Div(x - mean, that) -> Mul(weight) -> Add(bias).
  void layer_norm_pattern(const OnnxNode& mean) {
    const std::vector<int64_t> axes = ints_attr(mean, "axes", {});
    if (axes != std::vector<int64_t>{-1} && axes != std::vector<int64_t>{1})
      throw Refusal{"it averages a vector over another axis than its features"};
    const OnnxNode* centred = sole_reader(mean.outputs[0], "Sub");
    if (!centred || centred->inputs[0] != mean.inputs[0]) throw Refusal{"a mean that does not start a LayerNorm"};
    const OnnxNode *square = nullptr, *divide = nullptr;
    const auto r = readers_.find(centred->outputs.at(0));
    if (r != readers_.end() && r->second.size() == 2 && uses_[centred->outputs[0]] == 2)
      for (std::size_t k : r->second) {
        if (g_.nodes[k].op_type == "Pow") square = &g_.nodes[k];
        if (g_.nodes[k].op_type == "Div") divide = &g_.nodes[k];
      }
    if (!square || !divide || !is_scalar(*square, 1, 2.0) || divide->inputs[0] != centred->outputs[0])
      throw Refusal{"a mean that does not start a LayerNorm"};
    const OnnxNode* variance = sole_reader(square->outputs.at(0), "ReduceMean");
    const OnnxNode* plus_eps = variance ? sole_reader(variance->outputs.at(0), "Add") : nullptr;
    const OnnxNode* root = plus_eps ? sole_reader(plus_eps->outputs.at(0), "Sqrt") : nullptr;
    if (!root || ints_attr(*variance, "axes", {}) != axes || sole_reader(root->outputs.at(0), "Div") != divide)
      throw Refusal{"a mean that does not start a LayerNorm"};
    const OnnxTensor* eps = constant(*plus_eps, other(*plus_eps, variance->outputs[0]));
    if (!eps || eps->integer || eps->count() != 1 || !(eps->floats[0] > 0.0f)) throw Refusal{"a LayerNorm without a positive epsilon"};
    const OnnxNode* scale = sole_reader(divide->outputs.at(0), "Mul");
    const OnnxNode* shift = scale ? sole_reader(scale->outputs.at(0), "Add") : nullptr;
    if (!shift) throw Refusal{"a LayerNorm without weight and bias (elementwise_affine=False) is not supported yet"};
    absorb({centred, square, divide, variance, plus_eps, root, scale, shift});
    values_[shift->outputs.at(0)] = {};  // refused with the mean, if it is
    const Value& x = input(mean, 0);
    if (x.form != Form::Vector)
      throw Refusal{"a LayerNorm over an image's last axis or a flattened image; tandem's layer_norm reads features"};
    const OnnxTensor& weight = this->weight(*scale, other(*scale, divide->outputs[0]), "weight");
    const OnnxTensor& bias = this->weight(*shift, other(*shift, scale->outputs[0]), "bias");
    NodeSpec s = node_of(param_node_name(mean, weight), "layer_norm", {x.node});
    s.layer_norm.eps = eps->floats[0];
    add_weight(s.name, "weight", weight);
    add_weight(s.name, "bias", bias);
    out_.fused.push_back(cat(s.name, ": ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add -> layer_norm"));
    emit(mean, std::move(s), Form::Vector, shift->outputs.at(0));
  }

  void layer_normalization(const OnnxNode& n) {  // opset 17's own op
    only_first_output_read(n);
    const Value& x = input(n, 0);
    if (x.form != Form::Vector) throw Refusal{"it normalizes an image or a flattened one; tandem's layer_norm reads features"};
    if (int_attr(n, "axis", -1) != -1 && int_attr(n, "axis", -1) != 1) throw Refusal{"it normalizes over more than the features"};
    if (!stored(n, 1) || !stored(n, 2))
      throw Refusal{"a LayerNorm without weight and bias (elementwise_affine=False) is not supported yet"};
    const OnnxTensor& weight = this->weight(n, 1, "scale");
    NodeSpec s = node_of(param_node_name(n, weight), "layer_norm", {x.node});
    s.layer_norm.eps = float_attr(n, "epsilon", 1e-5f);
    add_weight(s.name, "weight", weight);
    add_weight(s.name, "bias", this->weight(n, 2, "bias"));
    emit(n, std::move(s), Form::Vector, n.outputs.at(0));
  }

  // nn.GELU() (erf): Div(x, sqrt 2) -> Erf -> Add(1) -> Mul(x, that) -> Mul(0.5).
  // (The pattern is matched before its input is read, so a Div or Mul outside one is reported
  // even when what it reads was refused.)
  void div(const OnnxNode& d) {
    const OnnxNode* erf = is_scalar(d, 1, std::sqrt(2.0)) ? sole_reader(d.outputs.at(0), "Erf") : nullptr;
    const OnnxNode* plus = erf ? sole_reader(erf->outputs.at(0), "Add") : nullptr;
    const OnnxNode* times_x = plus && is_scalar(*plus, other(*plus, erf->outputs[0]), 1.0) ? sole_reader(plus->outputs.at(0), "Mul") : nullptr;
    const OnnxNode* half = times_x && times_x->inputs[other(*times_x, plus->outputs[0])] == d.inputs[0]
                               ? sole_reader(times_x->outputs.at(0), "Mul") : nullptr;
    if (!half || !is_scalar(*half, other(*half, times_x->outputs[0]), 0.5))
      throw Refusal{"tandem divides only inside the patterns it fuses (GELU's, LayerNorm's)"};
    absorb({erf, plus, times_x, half});
    values_[half->outputs.at(0)] = {};
    const Value& x = input(d, 0);
    out_.fused.push_back(cat(module_of(d.name).empty() ? d.name : module_of(d.name), ": Div, Erf, Add, Mul, Mul -> gelu"));
    emit(d, node_of(module_node_name(d), "gelu", {x.node}), x.form, half->outputs.at(0));
  }

  // nn.GELU(approximate="tanh"): x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))), as
  // Mul(x, x) -> Mul(x, that) -> Mul(0.044715) -> Add(x) -> Mul(sqrt(2 / pi)) -> Tanh -> Add(1)
  // -> Mul(x) -> Mul(0.5).
  void mul(const OnnxNode& sq) {
    const std::string& xv = sq.inputs.at(0);
    const OnnxNode* cube = sq.inputs.size() == 2 && sq.inputs[1] == xv ? sole_reader(sq.outputs.at(0), "Mul") : nullptr;
    const OnnxNode* scaled = cube && cube->inputs[other(*cube, sq.outputs[0])] == xv ? sole_reader(cube->outputs.at(0), "Mul") : nullptr;
    const OnnxNode* sum = scaled && is_scalar(*scaled, other(*scaled, cube->outputs[0]), 0.044715) ? sole_reader(scaled->outputs.at(0), "Add") : nullptr;
    const OnnxNode* inner = sum && sum->inputs[other(*sum, scaled->outputs[0])] == xv ? sole_reader(sum->outputs.at(0), "Mul") : nullptr;
    const OnnxNode* tanh = inner && is_scalar(*inner, other(*inner, sum->outputs[0]), std::sqrt(2.0 / M_PI)) ? sole_reader(inner->outputs.at(0), "Tanh") : nullptr;
    const OnnxNode* plus = tanh ? sole_reader(tanh->outputs.at(0), "Add") : nullptr;
    const OnnxNode* times_x = plus && is_scalar(*plus, other(*plus, tanh->outputs[0]), 1.0) ? sole_reader(plus->outputs.at(0), "Mul") : nullptr;
    const OnnxNode* half = times_x && times_x->inputs[other(*times_x, plus->outputs[0])] == xv ? sole_reader(times_x->outputs.at(0), "Mul") : nullptr;
    if (!half || !is_scalar(*half, other(*half, times_x->outputs[0]), 0.5))
      throw Refusal{"tandem multiplies only inside the patterns it fuses (GELU's tanh form)"};
    absorb({cube, scaled, sum, inner, tanh, plus, times_x, half});
    values_[half->outputs.at(0)] = {};
    const Value& x = input(sq, 0);
    out_.fused.push_back(cat(module_of(sq.name).empty() ? sq.name : module_of(sq.name), ": Mul, Mul, Mul, Add, Mul, Tanh, Add, Mul, Mul -> gelu_tanh"));
    emit(sq, node_of(module_node_name(sq), "gelu_tanh", {x.node}), x.form, half->outputs.at(0));
  }

  void flatten(const OnnxNode& n) {
    const Value& x = input(n, 0);
    if (int_attr(n, "axis", 1) != 1) throw Refusal{"it flattens from another axis than 1; tandem keeps the batch first"};
    if (x.form != Form::Image) return alias(n, x, x.form == Form::Pooled ? Form::Vector : x.form);
    emit(n, node_of(functional_node_name(n), "flatten", {x.node}), Form::FlatImage, n.outputs.at(0));
  }

  // Reshape to [N, -1] (x.view(x.size(0), -1) with a constant shape): a flatten.
  void reshape(const OnnxNode& n) {
    const Value& x = input(n, 0);
    const OnnxTensor* shape = constant(n, 1);
    if (!shape || !shape->integer) throw Refusal{"its shape is computed at run time; tandem reshapes to a constant [batch, -1]"};
    if (shape->ints.size() != 2 || shape->ints[1] != -1)
      throw Refusal{"it reshapes to another shape than [batch, -1]; tandem has no general reshape yet"};
    if (x.form != Form::Image) return alias(n, x, x.form == Form::Pooled ? Form::Vector : x.form);
    emit(n, node_of(functional_node_name(n), "flatten", {x.node}), Form::FlatImage, n.outputs.at(0));
  }

  void linear(const OnnxNode& n, const Value& x, const OnnxTensor& w, bool transposed, const OnnxTensor* b) {
    if (x.form == Form::Image) throw Refusal{"it multiplies an image; flatten it first"};
    if (w.dims.size() != 2) throw Refusal{cat("its weight has ", w.dims.size(), " dimensions; a linear layer's has two")};
    const int64_t out_features = transposed ? w.dims[1] : w.dims[0];
    if (b && !(b->dims == std::vector<int64_t>{out_features} || b->dims == std::vector<int64_t>{1, out_features}))
      throw Refusal{cat("its bias has dimensions other than [", out_features, "] or [1, ", out_features, "]")};
    NodeSpec s = node_of(param_node_name(n, w), "linear", {x.node});
    s.linear = {out_features, b != nullptr};
    add_weight(s.name, "weight", w, transposed);
    if (b) {
      OnnxTensor flat = *b;
      flat.dims = {out_features};
      add_weight(s.name, "bias", flat);
    }
    emit(n, std::move(s), Form::Vector, n.outputs.at(0));
  }

  void gemm(const OnnxNode& n) {
    const Value& a = input(n, 0);
    if (int_attr(n, "transA", 0) != 0) throw Refusal{"transA=1 is not supported"};
    if (float_attr(n, "alpha", 1.0f) != 1.0f || float_attr(n, "beta", 1.0f) != 1.0f)
      throw Refusal{"alpha or beta differ from 1; tandem's linear is x W^T + b"};
    const OnnxTensor* c = stored(n, 2);
    if (n.inputs.size() > 2 && !n.inputs[2].empty() && !c) throw Refusal{"its bias is not a stored weight"};
    linear(n, a, weight(n, 1, "weight"), int_attr(n, "transB", 0) == 0, c);
  }

  // MatMul by a stored [in, out] matrix, and the Add of a stored bias after it when only that
  // Add reads it: nn.Linear as torch exports it for inputs of more than two dimensions, and
  // for a Linear without bias.
  // Transpose of a stored matrix: how training-mode export gives nn.Linear's weight to MatMul
  // for inputs of more than two dimensions. The MatMul reads the matrix as stored.
  void transpose(const OnnxNode& n) {
    const OnnxTensor* t = stored(n, 0);
    const std::vector<int64_t> perm = ints_attr(n, "perm", {1, 0});
    if (!t || t->integer || t->dims.size() != 2 || perm != std::vector<int64_t>{1, 0})
      throw Refusal{"tandem transposes only a stored matrix (a Linear's weight) yet"};
    transposed_[n.outputs.at(0)] = t;
  }

  void matmul(const OnnxNode& n) {
    const Value& x = input(n, 0);
    const auto pre = n.inputs.size() == 2 ? transposed_.find(n.inputs[1]) : transposed_.end();
    const bool stored_out_in = pre != transposed_.end();  // W as nn.Linear holds it: [out, in]
    const OnnxTensor& w = stored_out_in ? *pre->second : weight(n, 1, "right operand");
    const int64_t outs = stored_out_in ? w.dims[0] : (w.dims.size() == 2 ? w.dims[1] : -1);
    const OnnxTensor* bias = nullptr;
    std::size_t add_index = g_.nodes.size();
    const auto readers = readers_.find(n.outputs.at(0));
    if (readers != readers_.end() && readers->second.size() == 1 && uses_[n.outputs[0]] == 1) {
      const OnnxNode& add = g_.nodes[readers->second[0]];
      if (add.op_type == "Add" && add.inputs.size() == 2 && !add.outputs.empty() && !add.outputs[0].empty()) {
        const std::size_t other = add.inputs[0] == n.outputs[0] ? 1 : 0;
        const OnnxTensor* b = stored(add, other);
        if (b && !b->integer && w.dims.size() == 2 && b->count() == outs) {
          bias = b;
          add_index = readers->second[0];
        }
      }
    }
    if (!bias) return linear(n, x, w, !stored_out_in, nullptr);
    absorbed_.insert(add_index);  // refused or not, the Add is the linear's
    const std::string& sum = g_.nodes[add_index].outputs[0];
    values_[sum] = {};
    linear(n, x, w, !stored_out_in, bias);
    values_[sum] = values_[n.outputs[0]];
    out_.fused.push_back(cat(module_of(n.name).empty() ? n.name : module_of(n.name), ": MatMul + Add -> linear"));
  }

  void add(const OnnxNode& n) {
    if (constant(n, 0) || constant(n, 1))
      throw Refusal{"it adds a stored constant; tandem adds two computed tensors (a bias belongs to a linear or convolution)"};
    const Value& a = input(n, 0);
    const Value& b = input(n, 1);
    if (a.form != b.form) throw Refusal{"it adds tensors of different ranks (broadcasting is not supported yet)"};
    if (a.form == Form::FlatImage)
      throw Refusal{"it adds flattened images, whose values tandem orders (h, w, c) and PyTorch (c, h, w)"};
    emit(n, node_of(functional_node_name(n), "add", {a.node, b.node}), a.form, n.outputs.at(0));
  }

  void concat(const OnnxNode& n) {
    int64_t axis = int_attr(n, "axis", 1);
    std::vector<std::string> inputs;
    Form form = Form::Unknown;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const Value& v = input(n, i);
      if (i && v.form != form) throw Refusal{"it joins tensors of different ranks"};
      form = v.form;
      inputs.push_back(v.node);
    }
    if (form == Form::FlatImage)
      throw Refusal{"it joins flattened images, whose values tandem orders (h, w, c) and PyTorch (c, h, w)"};
    const int64_t rank = form == Form::Image || form == Form::Pooled ? 4 : 2;
    if (axis < 0) axis += rank;
    if (axis != 1) throw Refusal{cat("it joins along axis ", axis, "; tandem joins channels (axis 1)")};
    emit(n, node_of(functional_node_name(n), "concat", inputs), form, n.outputs.at(0));
  }

  void dropout(const OnnxNode& n) {
    only_first_output_read(n);
    const Value& x = input(n, 0);
    const float p = g_.opset >= 12 ? scalar(n, 1, 0.5f) : float_attr(n, "ratio", 0.5f);
    if (!(p >= 0.0f && p < 1.0f)) throw Refusal{cat("its ratio ", p, " is outside [0, 1)")};
    if (p == 0.0f) return alias(n, x, x.form);
    NodeSpec s = node_of(module_node_name(n), "dropout", {x.node});
    s.dropout.p = p;
    emit(n, std::move(s), x.form, n.outputs.at(0));
  }

  void identity(const OnnxNode& n) {
    const Value& x = input(n, 0);
    alias(n, x, x.form);
  }

  void constant_node(const OnnxNode& n) {  // registered by run() before the nodes
    const OnnxAttribute* v = n.attribute("value");
    if (!v || v->kind != OnnxAttribute::Kind::Tensor) throw Refusal{"only a 'value' tensor constant is read"};
  }

  void resolve_cut() {
    if (o_.cut.empty()) return;
    for (const NodeSpec& s : out_.spec.nodes)
      if (s.name == o_.cut) {
        out_.cut_node = out_.spec.cut = s.name;
        return;
      }
    for (std::size_t i = out_.spec.nodes.size(); i-- > 0;)
      if (modules_[i] == o_.cut || starts_with(modules_[i], o_.cut + ".") || starts_with(out_.spec.nodes[i].name, o_.cut + ".")) {
        out_.cut_node = out_.spec.cut = out_.spec.nodes[i].name;
        return;
      }
    std::set<std::string> top;
    for (const std::string& m : modules_)
      if (!m.empty()) top.insert(m.substr(0, m.find('.')));
    std::string known;
    for (const std::string& m : top) known += cat(known.empty() ? "" : ", ", m);
    fail("import", cat(o_.origin, ": --cut '", o_.cut, "' names no module or node (top-level modules: ", known, ")"));
  }
};

const std::map<std::string, Importer::Handler>& Importer::table() {
  using I = Importer;
  static const std::map<std::string, Handler> ops = {
      {"Conv", &I::conv},
      {"BatchNormalization", &I::batch_norm},
      {"Relu", [](I& i, const OnnxNode& n) { i.activation(n, "relu"); }},
      {"Sigmoid", [](I& i, const OnnxNode& n) { i.activation(n, "sigmoid"); }},
      {"Tanh", [](I& i, const OnnxNode& n) { i.activation(n, "tanh"); }},
      {"HardSwish", [](I& i, const OnnxNode& n) { i.activation(n, "hardswish"); }},
      {"Clip", &I::clip},
      {"MaxPool", [](I& i, const OnnxNode& n) { i.pool(n, "max_pool2d"); }},
      {"AveragePool", [](I& i, const OnnxNode& n) { i.pool(n, "avg_pool2d"); }},
      {"GlobalAveragePool", &I::global_avg_pool},
      {"ReduceMean", &I::reduce_mean},
      {"LayerNormalization", &I::layer_normalization},
      {"Div", &I::div},
      {"Mul", &I::mul},
      {"Flatten", &I::flatten},
      {"Reshape", &I::reshape},
      {"Gemm", &I::gemm},
      {"MatMul", &I::matmul},
      {"Transpose", &I::transpose},
      {"Add", &I::add},
      {"Concat", &I::concat},
      {"Dropout", &I::dropout},
      {"Identity", &I::identity},
      {"Constant", &I::constant_node},
  };
  return ops;
}

}  // namespace

std::vector<std::string> onnx_import_ops() {
  std::vector<std::string> names;
  for (const auto& [name, handler] : Importer::table()) names.push_back(name);
  return names;
}

OnnxImport import_onnx(const OnnxGraph& graph, const OnnxImportOptions& options) {
  return Importer(graph, options).run();
}

}  // namespace tandem
