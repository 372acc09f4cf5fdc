#include "core/interop/onnx_import.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"

namespace tandem {
namespace {

// How tandem holds an ONNX value of one sample: an image (ONNX [N, C, H, W], tandem
// [H, W, C]), a globally pooled image (ONNX [N, C, 1, 1], tandem [C]), a vector (ONNX
// [N, F], tandem [F]) or a sequence (ONNX [N, T, F], tandem [T, F]). FlatImage: an image
// flattened, whose values tandem orders (h, w, c) and PyTorch (c, h, w): a linear reading it
// gets its columns permuted on load (torch_layout.h), through activations and dropout, but an
// add, a join or a batch norm of it would mix the orders, so those are refused. Unknown: made
// by a node that was refused (its readers are not refused again for it).
// The other forms are steps of a pattern that has not made a tandem node yet: multi-head
// attention as torch writes it out (a sequence viewed as heads [N, T, H, D], permuted to
// [N, H, T, D], the keys to [N, H, D, T], their scores, scaled, masked and softmaxed, the
// context [N, H, T, D] permuted back to [N, T, H, D]), a position table's rows 0..T-1 (to be
// added to a sequence) and a key padding mask on its way to the scores. Only the handlers of
// the next step read them (input() refuses them anywhere else).
// nn.MultiheadAttention's steps (torchvision's ViT): the sequence time-major [T, N, F]
// (SequenceTM; tandem's tensor stays [N, T, F], only ONNX's axes differ), its tokens flattened
// time-major [T N, F] (TokensTM), heads merged with the batch [T, N H, D] (HeadsTM; then
// HeadsFirst, KeysT, scores, probabilities and context `merged`, [N H, T, D]) and the context
// back time-major (ContextTM). A patch embedding's image as [N, C, H W] (Patches), a class
// token expanded over the batch (ClassToken) and joined before the patches (WithClass).
// Hugging Face's one segment: a token-type table's row 0 at every token (TypeRow; its
// token_type_ids buffer of zeros, expanded over the batch) added to the words (WithTypes),
// waiting for the positions: one position_embedding with embedding.types (or, added after
// them, given to the position_embedding before). LayoutLM's 2-D positions: a column k of the
// boxes [N, T, 4] (BoxColumn, `part` k), y1 - y0 or x1 - x0 (BoxSpan, `part` 4 or 5), a
// table's rows by either (LayoutRows) and the sequence with some of the six added
// (WithLayout, `layout`): all six are one layout_embedding.
// A general tensor (Tensor: a general reshape's or transpose's, ONNX's dims in `dims`, stored
// in the axes' order `order`) is not a pattern's step: reshape, transpose and slice read it,
// and any other op reads it as an image, a sequence or a vector, a transpose made where needed.
enum class Form {
  Image, Pooled, Vector, FlatImage, Sequence, Tensor, Unknown,
  Heads, HeadsFirst, KeysT, Scores, Probs, Context, ContextTokens, Positions, Mask,
  Patches, ClassToken, WithClass, SequenceTM, HeadsTM, ContextTM, TokensTM, TypeRow, WithTypes,
  BoxColumn, BoxSpan, LayoutRows, WithLayout
};

struct Value {
  std::string node;  // the tandem node or input holding it
  Form form = Form::Unknown;
  std::vector<int64_t> dims;  // ONNX's dimensions of one sample (no batch); empty: not known
  // Attention's steps: the heads, the query's and key's nodes, what the scores were divided
  // by, the mask input. A mask: whether it is (1 - mask) yet and what it was multiplied by.
  int64_t heads = 0;
  std::string query, key, mask;
  double divisor = 1.0;
  bool inverted = false;
  double mask_scale = 1.0;
  // Scores: their mask's data marks padding with 1 (x * c added; torch's key_padding_mask)
  // rather than kept tokens ((1 - x) * c; Hugging Face's attention_mask).
  bool mask_marks_padding = false;
  // LayoutLM: a box column's or span's part (x0, y0, x1, y1, h, w: 0..5); the tables added
  // so far by part, and the boxes input (WithLayout).
  int part = -1;
  std::array<const OnnxTensor*, 6> layout{};
  std::string boxes;
  const OnnxTensor* table = nullptr;  // Positions: the position table; ClassToken, WithClass: the token
  bool merged = false;  // attention's heads merged with the batch (nn.MultiheadAttention's [N H, T, D])
  // Scores: a causal mask was added (-inf above the diagonal). Mask: a causal mask is filled
  // where this mask keeps (nn.MultiheadAttention's attn_mask.masked_fill(key_padding_mask, -inf)).
  bool causal = false;
  // Tensor: tandem's node holds ONNX's axis order[k] of `dims` as its axis k (an image [C, H, W]
  // is stored {1, 2, 0}: [H, W, C]).
  std::vector<int> order;
};

// A number import computes from shapes (what torch writes as Shape, Gather, Unsqueeze,
// Concat, Slice for x.view(x.size(0), ...)): c * batch^p, the batch being symbolic.
// `unknown`: a dimension of a tensor whose shape import does not track (an image's after a
// convolution); it may be copied along (x.size(0) of an image is the batch) but not used.
struct Sym {
  int64_t c = 0;
  int p = 0;
  bool unknown = false;
  bool operator==(const Sym& o) const { return !unknown && !o.unknown && c == o.c && (p == o.p || c == 0); }
};
struct Folded {
  std::vector<int64_t> dims;
  std::vector<Sym> v;  // row-major
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
      // (an attribute of type TENSOR without its tensor holds no values: not a constant)
      const bool filled = v && static_cast<int64_t>(v->t.integer ? v->t.ints.size() : v->t.floats.size()) == v->t.count();
      if (v && v->kind == OnnxAttribute::Kind::Tensor && filled && !n.outputs.empty()) consts_[n.outputs[0]] = &v->t;
    }
    for (const auto& [name, t] : consts_)
      if (t->integer && static_cast<int64_t>(t->ints.size()) == t->count()) {
        Folded f{t->dims, {}};
        for (int64_t x : t->ints) f.v.push_back({x, 0});
        folded_[name] = std::move(f);
      }
    for (const OnnxNode& n : g_.nodes) {
      for (const std::string& in : n.inputs)
        if (!in.empty()) ++uses_[in];
      const std::string m = module_of(n.name);
      for (std::size_t dot = m.find('.'); dot != std::string::npos; dot = m.find('.', dot + 1)) containers_.insert(m.substr(0, dot));
    }
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
        if (fold(n) || fold_floats(n)) continue;
        op->second(*this, n);
        static const std::set<std::string> views = {"Unsqueeze", "Squeeze", "Expand", "Reshape", "Transpose", "Slice", "Flatten",
                                                    "Identity"};
        if (views.count(n.op_type) && !n.inputs.empty() && bools_.count(n.inputs[0])) bools_.insert(n.outputs[0]);
      } catch (const Refusal& r) {
        problems_.push_back(cat("node '", n.name, "' (", n.op_type, module_of(n.name).empty() ? "" : ", module " + module_of(n.name),
                                "): ", r.why));
        refused_types_.insert(n.op_type);
        for (const std::string& o : n.outputs) values_[o] = {};
      } catch (const Downstream&) {
        for (const std::string& o : n.outputs) values_[o] = {};
      } catch (const std::out_of_range&) {  // a node or a pattern's node without an input or output it needs
        problems_.push_back(cat("node '", n.name, "' (", n.op_type, module_of(n.name).empty() ? "" : ", module " + module_of(n.name),
                                "): it lacks an input or output its op needs"));
        refused_types_.insert(n.op_type);
        for (const std::string& o : n.outputs) values_[o] = {};
      }
    }
    // A mask whose 1s mark padding is read as 1 - mask (data sets flip it for attention): any
    // other reader would see it flipped.
    for (const InputSpec& in : out_.spec.inputs)
      if (in.marks_padding)
        for (const NodeSpec& s : out_.spec.nodes)
          for (std::size_t k = 0; k < s.inputs.size(); ++k)
            if (s.inputs[k] == in.name && !(s.op == "attention" && k == 3))
              problems_.push_back(cat("node '", s.name, "' (tandem's ", s.op, ") reads the mask '", in.name, "' whose 1s mark "
                                      "padding; tandem reads that mask as 1 - mask, for attention only"));
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
    if (is_step(logits.form))
      fail("import", cat(o_.origin, ": the output '", g_.outputs[0].name, "' is ", step_name(logits.form),
                         "; tandem trains a model whose output is [batch, classes] logits"));
    if (logits.form == Form::Tensor)
      fail("import", cat(o_.origin, ": the output '", g_.outputs[0].name, "' is a reshaped or transposed tensor of ",
                         logits.dims.size(), " dimensions a sample; tandem trains a model whose output is [batch, classes] logits"));
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
  std::map<std::string, Folded> folded_;  // integer constants and what import computed from shapes
  std::map<std::string, int> uses_;
  std::map<std::string, std::vector<std::size_t>> readers_;
  std::set<std::string> names_, params_used_, refused_types_, id_inputs_;
  // Boolean graph inputs (nn.MultiheadAttention's key_padding_mask): read as a mask only.
  std::set<std::string> bool_inputs_;
  std::set<std::string> bools_;  // ONNX values that are computed booleans (a comparison's 0/1)
  // Integer graph inputs [batch, tokens, 4] (LayoutLM's bbox): read by column only.
  std::set<std::string> box_inputs_;
  // ConstantOfShape's float fillings (the zeros masked_fill writes into) and their shapes.
  struct Fill {
    double value = 0.0;
    std::vector<Sym> shape;
  };
  std::map<std::string, Fill> fills_;
  // Causal masks: ONNX values [1, ..., T, T] (no batch axis) of 0 on and below the diagonal and
  // -inf (or c <= -1e4) above it (nn.Transformer.generate_square_subsequent_mask, a Trilu of
  // -inf), by their dimensions; added to attention's scores they are its `causal`.
  std::map<std::string, std::vector<int64_t>> causal_;
  std::deque<OnnxTensor> made_;  // constants import computes (Cast of a constant to float)
  // Values computed at import from a stored tensor (a buffer sliced, compared with 0): kept
  // apart from constants, since a trained tensor read as a constant would silently stop
  // training; only a causal mask's reader takes them.
  std::map<std::string, const OnnxTensor*> derived_;
  // Integer constants [1, ...] expanded over the batch (Hugging Face's token_type_ids buffer):
  // the same for every sample; read only as a table's row indices.
  std::map<std::string, Folded> per_sample_;
  // Pad's zeros around an image's height and width, left to the one AveragePool or Conv that
  // reads it (torch writes nn.AvgPool2d as Pad, AveragePool).
  std::map<std::string, Pair> pending_pads_;
  // A globally pooled image's channels, where its image's shape was known (a Transpose of it
  // views it as the image [C, 1, 1] it is: ConvNeXt's LayerNorm2d before its classifier).
  std::map<std::string, int64_t> pooled_channels_;
  std::set<std::size_t> absorbed_;
  std::map<std::string, int> suffixes_;  // the last "_k" unique() gave a name
  std::vector<std::string> problems_;
  std::vector<std::string> modules_;  // each spec node's module, for cuts
  std::set<std::string> containers_;  // modules with modules inside (a node's module below them)

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
      const bool integer = v.elem_type == 6 || v.elem_type == 7, boolean = v.elem_type == 9;
      if (v.elem_type != 1 && !integer && !boolean)
        fail("import", cat(o_.origin, ": input '", v.name, "' has element type ", v.elem_type,
                           "; tandem reads float32 inputs, int32/int64 ids and a bool key padding mask"));
      if (boolean && v.dims.size() != 2)
        fail("import", cat(o_.origin, ": input '", v.name, "' is boolean with ", v.dims.size(),
                           " dimensions; tandem reads a boolean input as a key padding mask [batch, tokens] only"));
      if (boolean) bool_inputs_.insert(v.name);
      Form form = Form::Vector;
      const std::vector<int64_t> dims(v.dims.begin() + (v.dims.empty() ? 0 : 1), v.dims.end());
      if (v.dims.size() == 4 && !integer) {
        in.shape = Shape{v.dims[2], v.dims[3], v.dims[1]};
        form = Form::Image;
      } else if (v.dims.size() == 2) {
        in.shape = Shape{v.dims[1]};
      } else if (v.dims.size() == 3 && integer && v.dims[2] == 4) {  // LayoutLM's boxes [x0, y0, x1, y1] a token
        in.shape = Shape{v.dims[1], 4};
        form = Form::Sequence;
        box_inputs_.insert(v.name);
      } else {
        fail("import", cat(o_.origin, ": input '", v.name, "' has ", v.dims.size(), " dimensions; tandem imports images "
                           "[batch, channels, height, width], vectors or ids [batch, n] and boxes [batch, tokens, 4]"));
      }
      in.integer = integer;
      out_.spec.inputs.push_back(in);
      Value value;
      value.node = v.name;
      value.form = form;
      value.dims = dims;
      values_[v.name] = std::move(value);
    }
  }

  const Value& value(const std::string& name) {
    const auto it = values_.find(name);
    if (it == values_.end()) {
      if (folded_.count(name) && !consts_.count(name))
        throw Refusal{cat("input '", name, "' is computed from shapes; tandem reads such a value only as a shape or as indices")};
      if (consts_.count(name)) throw Refusal{cat("input '", name, "' is a constant; tandem reads it only as a weight")};
      if (derived_.count(name))
        throw Refusal{cat("input '", name, "' is computed from a stored tensor; tandem reads such a value only as a causal "
                          "mask (a buffer sliced to the tokens), never as a constant that would not train")};
      if (causal_.count(name))
        throw Refusal{cat("input '", name, "' is a causal mask; tandem reads one only as attention's (added to its scores)")};
      if (fills_.count(name))
        throw Refusal{cat("input '", name, "' is a constant of a computed shape (ConstantOfShape); tandem reads one "
                          "only as the value masked_fill keeps (Where(mask, c, zeros))")};
      throw Refusal{cat("input '", name, "' is made by no node before it")};
    }
    if (it->second.form == Form::Unknown) throw Downstream{};
    return it->second;
  }
  static bool is_step(Form f) { return f > Form::Unknown; }
  static const char* step_name(Form f) {
    switch (f) {
      case Form::Heads: return "a sequence viewed as attention heads [N, T, H, D]";
      case Form::HeadsFirst: return "attention heads [N, H, T, D]";
      case Form::KeysT: return "attention keys [N, H, D, T]";
      case Form::Scores: return "attention scores";
      case Form::Probs: return "attention probabilities";
      case Form::Context: return "attention's context [N, H, T, D]";
      case Form::ContextTokens: return "attention's context [N, T, H, D]";
      case Form::Positions: return "a position table's rows";
      case Form::Mask: return "an attention mask";
      case Form::Patches: return "an image as [N, C, H W]";
      case Form::ClassToken: return "a class token expanded over the batch";
      case Form::WithClass: return "a class token joined before a sequence";
      case Form::SequenceTM: return "a sequence time-major [T, N, F]";
      case Form::HeadsTM: return "attention heads [T, N H, D]";
      case Form::ContextTM: return "attention's context [T, N H, D]";
      case Form::TokensTM: return "a sequence's tokens [T N, F]";
      case Form::TypeRow: return "a token-type table's row 0 at every token";
      case Form::WithTypes: return "a sequence plus its token-type row (waiting for its positions)";
      case Form::BoxColumn: return "a column of LayoutLM's boxes";
      case Form::BoxSpan: return "a box's height or width";
      case Form::LayoutRows: return "a box table's rows";
      case Form::WithLayout: return "a sequence with some of LayoutLM's six box embeddings added";
      default: return "a tensor";
    }
  }
  // A plain tensor (not a pattern's step): what every op but the patterns' reads.
  const Value& input(const OnnxNode& n, std::size_t i) {
    const Value& v = any_input(n, i);
    if (box_inputs_.count(v.node) && v.form == Form::Sequence)
      throw Refusal{cat("it reads the boxes '", v.node, "' as numbers; tandem reads integers [batch, tokens, 4] only as "
                        "LayoutLM's boxes (bbox[:, :, k] and their differences through the x, y, h and w tables)")};
    if (bool_inputs_.count(v.node) && v.form != Form::Mask)
      throw Refusal{cat("it reads the boolean input '", v.node, "' as numbers; tandem reads a boolean input only as "
                        "attention's key padding mask (nn.MultiheadAttention's key_padding_mask)")};
    if (v.form == Form::Tensor) return settle(n, n.inputs[i]);
    if (is_step(v.form))
      throw Refusal{cat("it reads ", step_name(v.form), ", which tandem takes only within multi-head attention, "
                        "position embeddings, the key padding mask and a ViT's patch and class token embedding as "
                        "BERT, nn.MultiheadAttention and torchvision's ViT write them")};
    return v;
  }
  const Value& any_input(const OnnxNode& n, std::size_t i) {
    if (i >= n.inputs.size() || n.inputs[i].empty()) throw Refusal{cat("input ", i, " is missing")};
    return value(n.inputs[i]);
  }
  // A general tensor of three or more axes whose last is stored last (ConvNeXt's image
  // permuted to [N, H, W, C]): what ops of the last axis and elementwise ones read as it is.
  static bool last_stored_last(const Value& v) {
    return v.form == Form::Tensor && v.dims.size() >= 3 && v.order.back() == static_cast<int>(v.order.size()) - 1;
  }
  // Input i for an op of each value or of the last axis: such a tensor as it is, else a plain one.
  const Value& last_axis_input(const OnnxNode& n, std::size_t i) {
    const Value& v = any_input(n, i);
    return last_stored_last(v) ? v : input(n, i);
  }
  // `node` made for `n` from `x`, giving a value of x's form, dims and storage order.
  void emit_like(const OnnxNode& n, NodeSpec node, const Value& x, const std::string& output) {
    Value v = x;
    v.node = add_node(n, std::move(node));
    values_[output] = std::move(v);
  }
  // A node reading what a refused node made is not reported again (where a pattern's step
  // would otherwise be taken for an op of its own).
  void skip_refused(const OnnxNode& n) const {
    for (const std::string& in : n.inputs) {
      const auto it = values_.find(in);
      if (it != values_.end() && it->second.form == Form::Unknown) throw Downstream{};
    }
  }
  // The form of input i, or Unknown where it is no value (a constant, missing, refused).
  Form form_of(const OnnxNode& n, std::size_t i) const {
    if (i >= n.inputs.size()) return Form::Unknown;
    const auto it = values_.find(n.inputs[i]);
    return it == values_.end() ? Form::Unknown : it->second.form;
  }

  // ---- shapes computed at import (the batch symbolic) ----

  const Folded* folded(const OnnxNode& n, std::size_t i) const {
    if (i >= n.inputs.size() || n.inputs[i].empty()) return nullptr;
    const auto it = folded_.find(n.inputs[i]);
    return it == folded_.end() ? nullptr : &it->second;
  }
  // The numbers of input i, none of them the batch's: Slice's bounds, Unsqueeze's axes.
  std::vector<int64_t> plain_ints(const OnnxNode& n, std::size_t i) const {
    const Folded* f = folded(n, i);
    if (!f) throw Refusal{cat("input ", i, " is not a constant")};
    std::vector<int64_t> out;
    for (const Sym& x : f->v) {
      if (x.unknown) throw Refusal{cat("input ", i, " uses a dimension of a tensor whose shape import does not track")};
      if (x.p != 0 && x.c != 0) throw Refusal{cat("input ", i, " depends on the batch size")};
      out.push_back(x.c);
    }
    return out;
  }
  // Products of dimensions, refused past 2^62 (a file's dimensions are anybody's numbers).
  static int64_t count_of(const std::vector<int64_t>& dims) {
    int64_t k = 1;
    for (int64_t d : dims)
      if (d < 0 || __builtin_mul_overflow(k, d, &k) || k > (int64_t{1} << 62))
        throw Refusal{"its dimensions multiply past what tandem computes with"};
    return k;
  }
  static int64_t axis_in(int64_t axis, std::size_t rank) {
    const int64_t r = static_cast<int64_t>(rank);
    if (axis < -r || axis >= r) throw Refusal{cat("axis ", axis, " is outside a tensor of rank ", r)};
    return axis < 0 ? axis + r : axis;
  }
  // Unsqueeze's and Squeeze's axes as given: input 1 from opset 13 on, the attribute before;
  // none where they are omitted.
  std::vector<int64_t> axes_given(const OnnxNode& n) const {
    if (g_.opset < 13) return ints_attr(n, "axes", {});
    return n.inputs.size() > 1 && !n.inputs[1].empty() ? plain_ints(n, 1) : std::vector<int64_t>{};
  }
  // Axes for a tensor of `rank` dimensions, each once, in increasing order.
  static std::vector<int64_t> distinct_axes(std::vector<int64_t> axes, std::size_t rank) {
    for (int64_t& a : axes) a = axis_in(a, rank);
    std::sort(axes.begin(), axes.end());
    if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) throw Refusal{"it names an axis twice"};
    return axes;
  }
  static Sym arith(const std::string& op, Sym a, Sym b) {
    if (a.unknown || b.unknown) throw Refusal{"it computes with a dimension of a tensor whose shape import does not track"};
    Sym r;
    bool overflow = false;
    if (op == "Mul") {
      overflow = __builtin_mul_overflow(a.c, b.c, &r.c);
      r.p = a.p + b.p;
      if (r.p > 2) throw Refusal{"it multiplies the batch size by itself more than once"};
    } else if (op == "Add" || op == "Sub") {
      if (a.c != 0 && b.c != 0 && a.p != b.p) throw Refusal{"it adds the batch size to a number; tandem keeps the batch apart"};
      r.p = a.c != 0 ? a.p : b.p;
      overflow = op == "Add" ? __builtin_add_overflow(a.c, b.c, &r.c) : __builtin_sub_overflow(a.c, b.c, &r.c);
    } else {  // Div: integer division as ONNX's; where the batch is in it, exact (its power cancelling or staying)
      if (b.c == 0) throw Refusal{"it divides by zero"};
      if (b.p > a.p || ((a.p > 0 || b.p > 0) && a.c % b.c != 0)) throw Refusal{"it divides the batch size unevenly"};
      if (a.c == INT64_MIN && b.c == -1) throw Refusal{"it divides past what tandem computes with"};
      r = {a.c / b.c, a.p - b.p};
    }
    if (overflow) throw Refusal{"it computes past what tandem computes with"};
    return r;
  }
  // Input i as a folded value, or a refusal naming it.
  const Folded& folded_input(const OnnxNode& n, std::size_t i) const {
    const Folded* f = folded(n, i);
    if (!f) throw Refusal{cat("input ", i, " is missing")};
    return *f;
  }
  static void check_size(const Folded& f) {
    if (f.v.size() > kMaxFolded) throw Refusal{cat("it computes a shape of more than ", kMaxFolded, " values")};
  }
  static constexpr std::size_t kMaxFolded = 1 << 16;

  // ONNX's shape of a value, the batch symbolic; nullopt where import does not track it.
  std::optional<std::vector<Sym>> onnx_shape(const std::string& name) const {
    if (const auto f = folded_.find(name); f != folded_.end()) {
      std::vector<Sym> all;
      for (int64_t d : f->second.dims) all.push_back({d, 0});
      return all;
    }
    const auto it = values_.find(name);
    // Scores' and probabilities' dims are the query's, a position table's lack its leading 1;
    // heads merged with the batch, a class token on its way: not followed
    static const std::set<Form> untracked = {Form::Unknown,    Form::Scores,     Form::Probs,   Form::Positions,
                                             Form::ClassToken, Form::WithClass,  Form::HeadsTM, Form::ContextTM,
                                             Form::TypeRow,    Form::WithTypes,  Form::BoxColumn, Form::BoxSpan,
                                             Form::LayoutRows, Form::WithLayout};
    if (it == values_.end() || untracked.count(it->second.form)) return std::nullopt;
    const Value& x = it->second;
    // heads merged with the batch, [N H, ...]: nn.MultiheadAttention's q, k, v and its mask
    if (x.merged && (x.form == Form::HeadsFirst || x.form == Form::KeysT || x.form == Form::Mask) && x.dims.size() == 3)
      return std::vector<Sym>{{x.dims[0], 1}, {x.dims[1], 0}, {x.dims[2], 0}};
    if (x.merged) return std::nullopt;
    if (x.form == Form::SequenceTM && x.dims.size() == 2) return std::vector<Sym>{{x.dims[0], 0}, {1, 1}, {x.dims[1], 0}};
    if (x.form == Form::TokensTM && x.dims.size() == 2) return std::vector<Sym>{{x.dims[0], 1}, {x.dims[1], 0}};
    std::vector<Sym> all{{1, 1}};
    if (x.dims.empty() && (x.form == Form::Image || x.form == Form::Pooled))
      all.resize(4, Sym{0, 0, true});
    else if (x.dims.empty())
      return std::nullopt;
    for (int64_t d : x.dims) all.push_back({d, 0});
    return all;
  }
  // `f` of the inputs' values, position by position: inputs of one shape, or one value repeated.
  template <typename F>
  Folded elementwise(const OnnxNode& n, std::size_t count, F f) const {
    std::vector<const Folded*> in;
    const Folded* shaped = nullptr;  // the first of more than one value
    for (std::size_t i = 0; i < count; ++i) {
      in.push_back(&folded_input(n, i));
      if (in.back()->v.size() == 1) continue;
      if (shaped && (shaped->dims != in.back()->dims || shaped->v.size() != in.back()->v.size()))
        throw Refusal{"it computes on shapes of different sizes"};
      if (!shaped) shaped = in.back();
    }
    Folded out;
    out.dims = shaped ? shaped->dims : in[0]->dims;
    for (const Folded* f : in)  // one value each: a scalar against [1] is [1], as numpy broadcasts
      if (!shaped && f->dims.size() > out.dims.size()) out.dims = f->dims;
    std::vector<Sym> args(count);
    for (std::size_t k = 0, size = shaped ? shaped->v.size() : 1; k < size; ++k) {
      for (std::size_t i = 0; i < count; ++i) args[i] = in[i]->v[in[i]->v.size() == 1 ? 0 : k];
      out.v.push_back(f(args.data()));
    }
    return out;
  }

  // Computes a node on shapes and integer constants where it can: true when it did (its
  // output is folded_), false when it is a tensor op for the handlers. A malformed node (too
  // few inputs, axes twice, numbers out of range) is refused, never read past its end.
  bool fold(const OnnxNode& n) {
    static const std::map<std::string, std::pair<std::size_t, std::size_t>> arity = {
        {"Shape", {1, 1}}, {"Gather", {2, 2}}, {"Unsqueeze", {1, 2}}, {"Squeeze", {1, 2}}, {"Concat", {1, 1 << 20}},
        {"Slice", {3, 5}}, {"Cast", {1, 1}},   {"Add", {2, 2}},       {"Sub", {2, 2}},     {"Mul", {2, 2}},
        {"Div", {2, 2}},   {"Reshape", {2, 2}},   {"ConstantOfShape", {1, 1}}, {"Equal", {2, 2}},   {"Where", {3, 3}},
        {"Transpose", {1, 1}}, {"Range", {3, 3}}};
    const auto known = arity.find(n.op_type);
    if (known == arity.end()) return false;
    if (n.op_type == "Shape") {
      const std::optional<std::vector<Sym>> shape = n.inputs.empty() ? std::nullopt : onnx_shape(n.inputs[0]);
      if (!shape) return false;
      const std::vector<Sym>& all = *shape;
      const int64_t rank = static_cast<int64_t>(all.size());
      int64_t start = int_attr(n, "start", 0), end = int_attr(n, "end", rank);
      start = std::clamp(start < 0 ? start + rank : start, int64_t{0}, rank);
      end = std::clamp(end < 0 ? end + rank : end, int64_t{0}, rank);
      Folded out;
      for (int64_t k = start; k < end; ++k) out.v.push_back(all[static_cast<std::size_t>(k)]);
      out.dims = {static_cast<int64_t>(out.v.size())};
      folded_[n.outputs[0]] = std::move(out);
      return true;
    }
    // Folded when every input given is; a tensor op otherwise (an omitted optional input is "").
    bool any = false;
    for (const std::string& in : n.inputs) {
      if (!in.empty() && !folded_.count(in)) return false;
      any = any || !in.empty();
    }
    if (!any) return false;
    if (n.op_type == "Cast") {  // to an integer type only: a float's arithmetic is no shape's
      const int64_t to = int_attr(n, "to", 0);
      if (to != 6 && to != 7 && to != 2 && to != 3 && to != 4 && to != 5 && to != 12 && to != 13) return false;
    }
    if (n.inputs.size() < known->second.first || n.inputs.size() > known->second.second)
      throw Refusal{cat("it has ", n.inputs.size(), " inputs")};
    const Folded& x = folded_input(n, 0);
    Folded out;
    if (n.op_type == "Cast") {
      out = x;
    } else if (n.op_type == "Add" || n.op_type == "Sub" || n.op_type == "Mul" || n.op_type == "Div") {
      out = elementwise(n, 2, [&](const Sym* a) { return arith(n.op_type, a[0], a[1]); });
    } else if (n.op_type == "Equal") {
      out = elementwise(n, 2, [](const Sym* a) {
        if (a[0].unknown || a[1].unknown) throw Refusal{"it compares a dimension of a tensor whose shape import does not track"};
        // c * batch^p against c' * batch^p' (batch >= 1): alike when the powers are, never equal when
        // no batch makes them so (x.size(0) == -1), and refused when one batch would (batch == 2)
        if (a[0].p == a[1].p || a[0].c == 0 || a[1].c == 0) return Sym{a[0].c == a[1].c ? 1 : 0, 0};
        const Sym& hi = a[0].p > a[1].p ? a[0] : a[1];
        const Sym& lo = a[0].p > a[1].p ? a[1] : a[0];
        bool some_batch = lo.c % hi.c == 0 && lo.c / hi.c > 0;  // batch^(hi.p - lo.p) = lo.c / hi.c
        if (some_batch && hi.p - lo.p == 2) {
          const int64_t q = lo.c / hi.c, r = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(q))));
          int64_t square = 0;
          some_batch = !__builtin_mul_overflow(r, r, &square) && square == q;
        }
        if (some_batch) throw Refusal{"it compares the batch size with a number; the graph would compute otherwise for some batches"};
        return Sym{0, 0};
      });
    } else if (n.op_type == "Range") {  // torch.arange(0, x.size(1)): positions
      const std::vector<int64_t> start = plain_ints(n, 0), limit = plain_ints(n, 1), delta = plain_ints(n, 2);
      if (start.size() != 1 || limit.size() != 1 || delta.size() != 1 || delta[0] == 0)
        throw Refusal{"its start, limit and delta are not three numbers (delta not 0)"};
      const int64_t span = limit[0] - start[0];
      const int64_t count = span / delta[0] + (span % delta[0] != 0 ? 1 : 0);
      if (std::abs(start[0]) > (int64_t{1} << 40) || std::abs(limit[0]) > (int64_t{1} << 40))
        throw Refusal{"its bounds are out of range"};
      if (count > static_cast<int64_t>(kMaxFolded)) throw Refusal{cat("it computes a shape of more than ", kMaxFolded, " values")};
      for (int64_t k = 0; k < std::max<int64_t>(count, 0); ++k) out.v.push_back({start[0] + k * delta[0], 0});
      out.dims = {static_cast<int64_t>(out.v.size())};
    } else if (n.op_type == "Where") {
      out = elementwise(n, 3, [](const Sym* a) {
        if (a[0].unknown || a[0].p != 0) throw Refusal{"its condition is not computed from constants"};
        return a[0].c != 0 ? a[1] : a[2];
      });
    } else if (n.op_type == "ConstantOfShape") {
      const OnnxAttribute* value = n.attribute("value");
      if (value && (value->kind != OnnxAttribute::Kind::Tensor || !value->t.integer || value->t.ints.size() != 1))
        return false;  // a float filling: no shape's arithmetic
      if (x.dims.size() != 1) throw Refusal{"its shape is not a list"};
      if (!x.v.empty() && x.v[0] == Sym{1, 1}) return false;  // [batch, ...]: the handler's (torch.zeros_like(ids))
      out.dims = plain_ints(n, 0);
      for (int64_t d : out.dims)
        if (d < 0) throw Refusal{cat("its shape has the dimension ", d)};
      const int64_t count = count_of(out.dims);
      if (count > static_cast<int64_t>(kMaxFolded)) throw Refusal{cat("it computes a shape of more than ", kMaxFolded, " values")};
      out.v.assign(static_cast<std::size_t>(count), Sym{value ? value->t.ints[0] : 0, 0});
    } else if (n.op_type == "Reshape") {  // of numbers: x.view(-1), a list made of one
      if (int_attr(n, "allowzero", 0) != 0) throw Refusal{"allowzero=1 is not supported"};
      out.dims = plain_ints(n, 1);
      int64_t known = 1;
      std::size_t rest = out.dims.size();
      for (std::size_t k = 0; k < out.dims.size(); ++k) {
        int64_t& d = out.dims[k];
        if (d == 0 && k < x.dims.size()) d = x.dims[k];
        if (d == -1 && rest == out.dims.size()) {
          rest = k;
          continue;
        }
        if (d <= 0) throw Refusal{cat("its shape has the dimension ", d)};
        if (__builtin_mul_overflow(known, d, &known) || known > static_cast<int64_t>(kMaxFolded))
          throw Refusal{cat("it computes a shape of more than ", kMaxFolded, " values")};
      }
      const int64_t total = static_cast<int64_t>(x.v.size());
      if (rest < out.dims.size()) {
        if (total % known != 0) throw Refusal{"its -1 does not divide the input's size"};
        out.dims[rest] = total / known;
      }
      out.v = x.v;
    } else if (n.op_type == "Transpose") {  // F.pad's pads [[b0, e0], ...] turned to [begins, ends]
      const auto rank = static_cast<int64_t>(x.dims.size());
      std::vector<int64_t> perm = ints_attr(n, "perm", {});
      if (perm.empty())
        for (int64_t a = rank - 1; a >= 0; --a) perm.push_back(a);
      if (static_cast<int64_t>(perm.size()) != rank) throw Refusal{"its perm names another number of axes than its input has"};
      std::vector<int64_t> seen(perm.size(), 0), stride(perm.size(), 1);
      for (int64_t a : perm)
        if (a < 0 || a >= rank || seen[static_cast<std::size_t>(a)]++) throw Refusal{"its perm is not a permutation"};
      for (int64_t a = rank - 2; a >= 0; --a)
        if (__builtin_mul_overflow(stride[static_cast<std::size_t>(a + 1)], x.dims[static_cast<std::size_t>(a + 1)], &stride[static_cast<std::size_t>(a)]))
          throw Refusal{"it computes past what tandem computes with"};
      for (int64_t a : perm) out.dims.push_back(x.dims[static_cast<std::size_t>(a)]);
      std::vector<int64_t> at(perm.size(), 0);
      for (std::size_t k = 0; k < x.v.size(); ++k) {
        int64_t source = 0;
        for (std::size_t a = 0; a < perm.size(); ++a) source += at[a] * stride[static_cast<std::size_t>(perm[a])];
        out.v.push_back(x.v[static_cast<std::size_t>(source)]);
        for (std::size_t a = perm.size(); a-- > 0;) {  // the next output index, row-major
          if (++at[a] < out.dims[a]) break;
          at[a] = 0;
        }
      }
    } else if (n.op_type == "Gather") {
      const Folded& idx = folded_input(n, 1);
      if (x.dims.empty()) throw Refusal{"it gathers from a scalar"};
      const int64_t axis = axis_in(int_attr(n, "axis", 0), x.dims.size());
      const int64_t outer = count_of({x.dims.begin(), x.dims.begin() + axis}), along = x.dims[static_cast<std::size_t>(axis)];
      const int64_t inner = count_of({x.dims.begin() + axis + 1, x.dims.end()});
      out.dims.assign(x.dims.begin(), x.dims.begin() + axis);
      out.dims.insert(out.dims.end(), idx.dims.begin(), idx.dims.end());
      out.dims.insert(out.dims.end(), x.dims.begin() + axis + 1, x.dims.end());
      if (count_of(out.dims) > static_cast<int64_t>(kMaxFolded))
        throw Refusal{cat("it computes a shape of more than ", kMaxFolded, " values")};
      const std::vector<int64_t> indices = plain_ints(n, 1);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i : indices) {
          if (i < -along || i >= along) throw Refusal{cat("index ", i, " is outside ", along, " values")};
          const int64_t row = i < 0 ? i + along : i;
          for (int64_t k = 0; k < inner; ++k) out.v.push_back(x.v[static_cast<std::size_t>((o * along + row) * inner + k)]);
        }
    } else if (n.op_type == "Unsqueeze" || n.op_type == "Squeeze") {
      const std::vector<int64_t> given = axes_given(n);
      out = x;
      if (n.op_type == "Unsqueeze") {
        if (given.empty()) throw Refusal{"it names no axes"};
        for (int64_t a : distinct_axes(given, x.dims.size() + given.size())) out.dims.insert(out.dims.begin() + a, 1);
      } else {
        std::vector<int64_t> axes = given;
        if (axes.empty())
          for (std::size_t a = 0; a < x.dims.size(); ++a)
            if (x.dims[a] == 1) axes.push_back(static_cast<int64_t>(a));
        axes = distinct_axes(axes, x.dims.size());
        for (std::size_t k = axes.size(); k-- > 0;) {
          if (x.dims[static_cast<std::size_t>(axes[k])] != 1) throw Refusal{cat("it squeezes axis ", axes[k], ", which is not 1")};
          out.dims.erase(out.dims.begin() + axes[k]);
        }
      }
    } else if (n.op_type == "Concat") {
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        const Folded& part = folded_input(n, i);
        if (part.dims.size() != 1) throw Refusal{"tandem computes shapes by joining lists (1-D) only"};
        out.v.insert(out.v.end(), part.v.begin(), part.v.end());
        check_size(out);
      }
      out.dims = {static_cast<int64_t>(out.v.size())};
    } else {  // Slice (opset 10 on: starts, ends, axes, steps as inputs)
      if (g_.opset < 10) throw Refusal{"Slice before opset 10 is not read; export at opset 13 or later"};
      const std::vector<int64_t> starts = plain_ints(n, 1), ends = plain_ints(n, 2);
      std::vector<int64_t> axes = n.inputs.size() > 3 && !n.inputs[3].empty() ? plain_ints(n, 3) : std::vector<int64_t>{};
      const std::vector<int64_t> steps = n.inputs.size() > 4 && !n.inputs[4].empty() ? plain_ints(n, 4) : std::vector<int64_t>(starts.size(), 1);
      if (axes.empty())
        for (std::size_t a = 0; a < starts.size(); ++a) axes.push_back(static_cast<int64_t>(a));
      if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
        throw Refusal{"its starts, ends, axes and steps differ in length"};
      const std::size_t rank = x.dims.size();
      for (std::size_t k = 0; k < axes.size(); ++k) axes[k] = axis_in(axes[k], rank);
      if (std::set<int64_t>(axes.begin(), axes.end()).size() != axes.size()) throw Refusal{"it names an axis twice"};
      std::vector<int64_t> lo(rank, 0), step(rank, 1), size = x.dims;
      for (std::size_t k = 0; k < starts.size(); ++k) {
        const std::size_t a = static_cast<std::size_t>(axes[k]);
        const int64_t d = x.dims[a];
        if (steps[k] == 0 || steps[k] == INT64_MIN) throw Refusal{cat("it slices with step ", steps[k])};
        lo[a] = std::clamp(starts[k] < 0 ? std::max(starts[k], -d) + d : starts[k], int64_t{0}, d);
        step[a] = steps[k];
        if (steps[k] > 0) {
          const int64_t e = std::clamp(ends[k] < 0 ? std::max(ends[k], -d) + d : ends[k], int64_t{0}, d);
          size[a] = e > lo[a] ? (e - lo[a] - 1) / steps[k] + 1 : 0;
        } else {  // backwards (F.pad's pads reversed): from start down to past end, ONNX's clamps
          lo[a] = std::min(lo[a], d - 1);
          const int64_t e = std::clamp(ends[k] < 0 ? std::max(ends[k], -d - 1) + d : ends[k], int64_t{-1}, d - 1);
          size[a] = lo[a] > e ? (lo[a] - e - 1) / -steps[k] + 1 : 0;
        }
      }
      out.dims = size;
      std::vector<int64_t> at(rank, 0);
      const int64_t total = count_of(size);
      for (int64_t flat = 0; flat < total; ++flat) {
        int64_t rest = flat, source = 0;
        for (std::size_t a = rank; a-- > 0;) {
          at[a] = rest % size[a];
          rest /= size[a];
        }
        for (std::size_t a = 0; a < rank; ++a) source = source * x.dims[a] + lo[a] + at[a] * step[a];
        out.v.push_back(x.v[static_cast<std::size_t>(source)]);
      }
    }
    if (count_of(out.dims) != static_cast<int64_t>(out.v.size())) throw Refusal{"its values do not fill its dimensions"};
    check_size(out);
    folded_[n.outputs[0]] = std::move(out);
    return true;
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
  // The one value of a constant, or nullopt (more values, none, or of a type not read).
  static std::optional<double> one_value(const OnnxTensor* t) {
    if (!t || t->count() != 1) return std::nullopt;
    if (t->integer) return t->ints.size() == 1 ? std::optional<double>(static_cast<double>(t->ints[0])) : std::nullopt;
    return t->floats.size() == 1 ? std::optional<double>(static_cast<double>(t->floats[0])) : std::nullopt;
  }
  float scalar(const OnnxNode& n, std::size_t i, float fallback) const {
    const OnnxTensor* t = constant(n, i);
    if (i < n.inputs.size() && !n.inputs[i].empty() && !t) throw Refusal{cat("input ", i, " is computed; tandem needs a constant")};
    if (!t) return fallback;
    const std::optional<double> v = one_value(t);
    if (!v) throw Refusal{cat("input ", i, " holds ", t->count(), " values where one is expected")};
    return static_cast<float>(*v);
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
  // `own` padding plus the zeros a Pad left to this window (its input 0's).
  Pair padded(const OnnxNode& n, Pair own) const {
    const auto it = n.inputs.empty() ? pending_pads_.end() : pending_pads_.find(n.inputs[0]);
    if (it != pending_pads_.end()) own = {own[0] + it->second[0], own[1] + it->second[1]};
    return own;
  }
  // Pad with zeros (mode constant, value 0): none at all is the tensor itself (what torch writes
  // before every AveragePool); zeros around an image's height and width, alike on both sides,
  // read by one AveragePool or Conv alone, are that window's padding. Other pads are refused.
  void pad(const OnnxNode& n) {
    skip_refused(n);
    const OnnxAttribute* mode = attr(n, "mode", OnnxAttribute::Kind::String);
    if (mode && mode->s != "constant") throw Refusal{cat("it pads in mode '", mode->s, "'; tandem pads with zeros only")};
    if ((n.inputs.size() > 2 && !n.inputs[2].empty() && !is_scalar(n, 2, 0.0)) || (g_.opset < 11 && float_attr(n, "value", 0.0f) != 0.0f))
      throw Refusal{"it pads with a value other than 0; tandem pads with zeros only"};
    if (n.inputs.size() > 3 && !n.inputs[3].empty()) throw Refusal{"it pads some axes only (input 'axes'); tandem reads pads for every axis"};
    const std::vector<int64_t> p = g_.opset < 11 ? ints_attr(n, "pads", {}) : plain_ints(n, 1);
    const Value& x = input(n, 0);
    if (std::all_of(p.begin(), p.end(), [](int64_t v) { return v == 0; })) return alias(n, x, x.form);
    const OnnxNode* reader = sole_reader(n.outputs.at(0), "AveragePool");
    if (!reader) reader = sole_reader(n.outputs[0], "Conv");
    if (x.form != Form::Image || p.size() != 8 || p[0] || p[1] || p[4] || p[5] || p[2] != p[6] || p[3] != p[7] || p[2] < 0 ||
        p[3] < 0 || !reader)
      throw Refusal{cat("it pads otherwise than with zeros alike around an image's height and width before one average "
                        "pool or convolution (pads ", p.size(), " values)")};
    pending_pads_[n.outputs[0]] = {p[2], p[3]};
    alias(n, x, x.form);
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
    const std::string packed = "_weight";  // nn.MultiheadAttention's "in_proj_weight"
    const std::size_t dot = w.name.rfind('.');
    if (dot != std::string::npos && w.name.size() > dot + 1 + packed.size() &&
        w.name.compare(w.name.size() - packed.size(), packed.size(), packed) == 0)
      return unique(w.name.substr(0, w.name.size() - packed.size()));
    const std::string m = module_of(n.name);
    return unique(m.empty() ? lower(n.op_type) : m);
  }
  // A module's own op (nn.ReLU, nn.MaxPool2d, nn.Dropout): the module's name.
  // In a container's forward (F.gelu in nn.TransformerEncoderLayer's), "<container>.<op>": the
  // container's name is its last node's, where a cut by module lands.
  std::string module_node_name(const OnnxNode& n, const char* op) {
    const std::string m = module_of(n.name);
    if (containers_.count(m)) return unique(cat(m, ".", op));
    return unique(m.empty() ? own_name(n.name, n.op_type) : m);
  }
  // An op inside a module's forward (x + identity, torch.flatten): "<module>.<op>".
  std::string functional_node_name(const OnnxNode& n) {
    const std::string m = module_of(n.name);
    const std::string own = own_name(n.name, n.op_type);
    return unique(m.empty() ? own : cat(m, ".", own));
  }

  void emit(const OnnxNode& n, NodeSpec node, Form form, const std::string& output, std::vector<int64_t> dims = {}) {
    Value v;
    v.node = node.name;
    v.form = form;
    v.dims = std::move(dims);
    values_[output] = std::move(v);
    add_node(n, std::move(node));
  }
  // `node`, made for `n`, into the spec (its module recorded, for cuts by module); its name.
  std::string add_node(const OnnxNode& n, NodeSpec node) {
    modules_.push_back(module_of(n.name));
    out_.spec.nodes.push_back(std::move(node));
    return out_.spec.nodes.back().name;
  }
  // "<module>.<op>" for a node import adds within `n`'s module (a transpose, a view), unique.
  std::string module_child(const OnnxNode& n, const char* op) {
    const std::string m = module_of(n.name);
    return unique(m.empty() ? op : cat(m, ".", op));
  }
  // `v` seen as `form` of `dims` (a view on the way through a pattern; no tandem node).
  void as_step(const OnnxNode& n, Value v, Form form, std::vector<int64_t> dims) {
    v.form = form;
    v.dims = std::move(dims);
    values_[n.outputs.at(0)] = std::move(v);
  }
  void alias(const OnnxNode& n, const Value& v, Form form) {
    Value copy = v;
    copy.form = form;
    values_[n.outputs.at(0)] = std::move(copy);
  }
  // The node's tensor `field` from the stored `t`, in torch's layout. A name torch's state dict
  // holds that is not "<node>.<field>" (torchvision ViT's "class_token", "in_proj_weight") stays
  // the file's name, through the node's torch_names; the exporter's own ("onnx::MatMul_7", a
  // weight it transposed) becomes "<node>.<field>".
  void add_weight(NodeSpec& node, const std::string& field, const OnnxTensor& t, bool transpose = false) {
    if (!params_used_.insert(t.name).second)
      throw Refusal{cat("its weight '", t.name, "' is shared with another node (tied weights); tandem trains each node's own")};
    std::string name = cat(node.name, ".", field);
    if (t.name != name && !transpose && !starts_with(t.name, "onnx::")) {
      node.torch_names.emplace_back(field, t.name);
      name = t.name;
    }
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
    else if (!node.torch_names.empty() && node.torch_names.back().second == name)
      out_.renamed.push_back(cat(node.name, ".", field, " is '", name, "' in PyTorch's state dict"));
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

  // A window's output [C, H, W] from its input's where import knows it (a patch embedding's
  // reshape and shape arithmetic read it); empty otherwise.
  static std::vector<int64_t> window_dims(const std::vector<int64_t>& in, int64_t channels, const Pair& kernel,
                                          const Pair& stride, const Pair& padding, const Pair& dilation) {
    if (in.size() != 3) return {};
    std::vector<int64_t> dims{channels, 0, 0};
    for (int k = 0; k < 2; ++k) {  // in + 2 pad - dilation (kernel - 1) - 1, the file's numbers checked
      int64_t pad2 = 0, kernel_less = 0, reach = 0, span = 0;
      if (__builtin_mul_overflow(padding[k], int64_t{2}, &pad2) || __builtin_sub_overflow(kernel[k], int64_t{1}, &kernel_less) ||
          __builtin_mul_overflow(dilation[k], kernel_less, &reach) || __builtin_add_overflow(reach, int64_t{1}, &reach) ||
          __builtin_add_overflow(in[static_cast<std::size_t>(k + 1)], pad2, &span) || __builtin_sub_overflow(span, reach, &span) ||
          span < 0 || stride[k] <= 0)
        return {};
      dims[static_cast<std::size_t>(k + 1)] = span / stride[k] + 1;
    }
    return dims;
  }

  // A convolution; on a globally pooled [N, C, 1, 1] tensor (a squeeze-excitation's) a 1x1 one,
  // which tandem's conv2d runs on the pooled vector [C].
  void conv(const OnnxNode& n) {
    const bool pooled = form_of(n, 0) == Form::Pooled;
    const Value& x = pooled ? input(n, 0) : image(n);
    const OnnxTensor& w = weight(n, 1, "weight");
    if (w.dims.size() != 4) throw Refusal{cat("its weight has ", w.dims.size(), " dimensions; tandem's convolutions are 2-D")};
    NodeSpec s = node_of(param_node_name(n, w), "conv2d", {x.node});
    Conv2dAttrs& c = s.conv2d;
    c.out_channels = w.dims[0];
    c.kernel = pair2(ints_attr(n, "kernel_shape", {w.dims[2], w.dims[3]}), "kernel_shape");
    if (c.kernel != Pair{w.dims[2], w.dims[3]}) throw Refusal{"kernel_shape differs from the weight's"};
    c.stride = pair2(ints_attr(n, "strides", {1, 1}), "strides");
    c.dilation = pair2(ints_attr(n, "dilations", {1, 1}), "dilations");
    c.padding = padded(n, symmetric_pads(n));
    c.groups = int_attr(n, "group", 1);
    const OnnxTensor* b = stored(n, 2);
    if (n.inputs.size() > 2 && !n.inputs[2].empty() && !b) throw Refusal{"its bias is not a stored weight"};
    c.bias = b != nullptr;
    if (pooled && (c.kernel != Pair{1, 1} || c.padding != Pair{0, 0}))
      throw Refusal{"it convolves a globally pooled [N, C, 1, 1] tensor with a window other than 1x1 unpadded"};
    const std::vector<int64_t> dims = pooled ? std::vector<int64_t>{} : window_dims(x.dims, c.out_channels, c.kernel, c.stride, c.padding, c.dilation);
    add_weight(s, "weight", w);
    if (b) add_weight(s, "bias", *b);
    emit(n, std::move(s), pooled ? Form::Pooled : Form::Image, n.outputs.at(0), dims);
  }

  void batch_norm(const OnnxNode& n) {
    only_first_output_read(n);
    const Value& x = input(n, 0);
    if (x.form == Form::FlatImage)
      throw Refusal{"it normalizes a flattened image, whose values tandem orders (h, w, c) and PyTorch (c, h, w)"};
    if (x.form == Form::Sequence)
      throw Refusal{"it normalizes a sequence [N, T, F] over its tokens (axis 1); tandem's batch_norm normalizes features"};
    const OnnxTensor& scale = weight(n, 1, "scale");
    NodeSpec s = node_of(param_node_name(n, scale), "batch_norm", {x.node});
    s.batch_norm.eps = float_attr(n, "epsilon", 1e-5f);
    // ONNX keeps (1 - torch's momentum): 0.9 for nn.BatchNorm2d's 0.1, rounded as written.
    s.batch_norm.momentum = static_cast<float>(std::round((1.0 - float_attr(n, "momentum", 0.9f)) * 1e6) / 1e6);
    add_weight(s, "weight", scale);
    add_weight(s, "bias", weight(n, 2, "bias"));
    add_weight(s, "running_mean", weight(n, 3, "running mean"));
    add_weight(s, "running_var", weight(n, 4, "running variance"));
    emit(n, std::move(s), x.form, n.outputs.at(0), x.dims);
  }

  void activation(const OnnxNode& n, const char* op) {
    const Value& x = last_axis_input(n, 0);
    emit_like(n, node_of(module_node_name(n, op), op, {x.node}), x, n.outputs.at(0));
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
    const bool ceil_mode = int_attr(n, "ceil_mode", 0) != 0;
    for (int64_t d : ints_attr(n, "dilations", {1, 1}))
      if (d != 1) throw Refusal{"dilated pooling windows are not supported"};
    if (int_attr(n, "storage_order", 0) != 0) throw Refusal{"storage_order=1 is not supported"};
    NodeSpec s = node_of(module_node_name(n, op), op, {x.node});
    s.pool.kernel = pair2(ints_attr(n, "kernel_shape", {}), "kernel_shape");
    s.pool.stride = pair2(ints_attr(n, "strides", {1, 1}), "strides");
    s.pool.padding = symmetric_pads(n);
    if (std::string(op) == "avg_pool2d" && s.pool.padding != Pair{0, 0} && int_attr(n, "count_include_pad", 0) == 0)
      throw Refusal{"count_include_pad=0 with padding: tandem's average counts the padding (PyTorch's default)"};
    s.pool.padding = padded(n, s.pool.padding);  // a Pad's zeros count in the average, as its padding does
    if (ceil_mode) {  // taken where rounding up adds no window (SqueezeNet's pools at 224 and 32 pixels)
      if (x.dims.size() != 3) throw Refusal{"ceil_mode=1 over an image whose size import does not know"};
      const int64_t size[2] = {x.dims[1], x.dims[2]};
      const Pair &k = s.pool.kernel, &st = s.pool.stride, &pad = s.pool.padding;
      for (std::size_t a = 0; a < 2; ++a) {
        const int64_t limit = int64_t{1} << 40;  // a file's numbers are anybody's: no overflow below
        if (pad[a] < 0 || pad[a] > limit || k[a] < 1 || k[a] > limit || st[a] < 1 || st[a] > limit)
          throw Refusal{"ceil_mode=1 with a window, stride or padding out of range"};
        const int64_t span = size[a] + 2 * pad[a] - k[a];
        if (span < 0) throw Refusal{cat("its window of ", k[a], " is larger than the padded image")};
        const int64_t floor = span / st[a] + 1;
        int64_t ceil = (span + st[a] - 1) / st[a] + 1;
        if ((ceil - 1) * st[a] >= size[a] + pad[a]) --ceil;  // torch's rule: the last window starts inside
        if (ceil != floor)
          throw Refusal{cat("ceil_mode=1 adds a window over its ", a == 0 ? "height" : "width", " of ", size[a], " (", ceil,
                            " windows rather than ", floor, "); tandem's windows floor the output size, so it takes ceil_mode "
                            "only where rounding up adds none")};
      }
    }
    const std::vector<int64_t> dims = x.dims.empty() ? std::vector<int64_t>{} : window_dims(x.dims, x.dims[0], s.pool.kernel, s.pool.stride, s.pool.padding, {1, 1});
    emit(n, std::move(s), Form::Image, n.outputs.at(0), dims);
  }

  void global_avg_pool(const OnnxNode& n) {
    const Value& x = image(n);
    if (x.dims.size() == 3) pooled_channels_[n.outputs.at(0)] = x.dims[0];
    emit(n, node_of(module_node_name(n, "global_avg_pool"), "global_avg_pool", {x.node}), Form::Pooled, n.outputs.at(0));
  }

  // ReduceMean over height and width: what torch's x.mean((2, 3)) exports.
  void reduce_mean(const OnnxNode& n) {
    const auto in = n.inputs.empty() ? values_.end() : values_.find(n.inputs[0]);
    if (in != values_.end() && in->second.form == Form::Unknown) {  // of a refused tensor: a LayerNorm's nodes go with it
      try {
        layer_norm_pattern(n);
      } catch (const Refusal&) {
      }
      throw Downstream{};
    }
    if (in != values_.end() && in->second.form == Form::Sequence) {  // x.mean(1): mean pooling over the tokens
      const std::vector<int64_t> axes = ints_attr(n, "axes", {});
      if (axes == std::vector<int64_t>{1} || axes == std::vector<int64_t>{-2}) {
        if (int_attr(n, "keepdims", 1) != 0) return general_reduce(n, ReduceAttrs::Mode::mean);  // [N, 1, F]
        const Value& x = input(n, 0);
        NodeSpec s = node_of(functional_node_name(n), "token_pool", {x.node});
        s.token_pool.mean = true;
        out_.fused.push_back(cat(s.name, ": ReduceMean(axis 1) -> token_pool (mean)"));
        return emit(n, std::move(s), Form::Vector, n.outputs.at(0), {x.dims[1]});
      }
    }
    if (in == values_.end() || in->second.form != Form::Image) {
      const OnnxNode* centred = n.outputs.empty() ? nullptr : sole_reader(n.outputs[0], "Sub");
      if (centred && !centred->inputs.empty() && centred->inputs[0] == n.inputs.at(0)) return layer_norm_pattern(n);
      return general_reduce(n, ReduceAttrs::Mode::mean);  // not a LayerNorm's first mean
    }
    const Value& x = image(n);
    std::vector<int64_t> axes = ints_attr(n, "axes", {});
    if (axes.empty() && constant(n, 1)) axes = constant(n, 1)->ints;
    for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
    std::sort(axes.begin(), axes.end());
    if (axes != std::vector<int64_t>{2, 3}) return general_reduce(n, ReduceAttrs::Mode::mean);
    emit(n, node_of(functional_node_name(n), "global_avg_pool", {x.node}), int_attr(n, "keepdims", 1) ? Form::Pooled : Form::Vector,
         n.outputs.at(0));
  }

  // GlobalMaxPool (F.adaptive_max_pool2d(x, 1)): the maximum over an image's rows and
  // columns, a reduce over the stored [H, W, C]'s first two axes; [N, C, 1, 1] as a global
  // average pool's.
  void global_max_pool(const OnnxNode& n) {
    const Value& x = image(n);
    NodeSpec s = node_of(functional_node_name(n), "reduce", {x.node});
    s.reduce.mode = ReduceAttrs::Mode::max;
    s.reduce.axes = {0, 1};
    emit(n, std::move(s), Form::Pooled, n.outputs.at(0));
  }

  // ReduceSum, ReduceMax, ReduceMin, and ReduceMean, that no pattern takes: tandem's reduce
  // over the stored axes the ONNX axes are (keepdims: the reduced axes stay, of 1, by a view).
  void general_reduce(const OnnxNode& n, ReduceAttrs::Mode mode) {
    skip_refused(n);
    const Value& in = any_input(n, 0);
    if (is_step(in.form)) input(n, 0);  // refused, naming the step
    std::vector<int64_t> axes = ints_attr(n, "axes", {});
    if (axes.empty() && n.inputs.size() > 1 && !n.inputs[1].empty()) {
      if (!folded(n, 1)) throw Refusal{"its axes are computed from tensor values; tandem reduces axes known at import"};
      axes = plain_ints(n, 1);
    }
    if (axes.empty()) {
      if (int_attr(n, "noop_with_empty_axes", 0) != 0) return alias(n, in, in.form);
      throw Refusal{"it reduces every axis, the batch's too; tandem keeps each sample's values apart"};
    }
    if (in.form == Form::Pooled || in.form == Form::FlatImage || in.dims.empty())
      throw Refusal{"it reduces a tensor whose shape import does not know, or a flattened image"};
    const Value x = as_tensor(in);
    const auto rank = static_cast<int64_t>(x.dims.size()) + 1;
    std::vector<bool> reduced(x.dims.size(), false);
    for (int64_t a : axes) {
      const int64_t axis = a < 0 ? a + rank : a;
      if (axis < 0 || axis >= rank) throw Refusal{cat("its axis ", a, " is outside the tensor's ", rank)};
      if (axis == 0) throw Refusal{"it reduces over the batch; tandem keeps each sample's values apart"};
      if (reduced[static_cast<std::size_t>(axis - 1)]) throw Refusal{cat("it names axis ", a, " twice")};
      reduced[static_cast<std::size_t>(axis - 1)] = true;
    }
    const bool keep = int_attr(n, "keepdims", 1) != 0;
    if (!keep && std::all_of(reduced.begin(), reduced.end(), [](bool r) { return r; }))
      throw Refusal{"it reduces a sample to one number without keeping its axes (keepdim=True would)"};
    NodeSpec s = node_of(functional_node_name(n), "reduce", {x.node});
    s.reduce.mode = mode;
    std::vector<int64_t> out_stored, kept_stored;  // the node's output; with the reduced axes of 1
    for (std::size_t k = 0; k < x.order.size(); ++k) {
      const auto a = static_cast<std::size_t>(x.order[k]);
      if (reduced[a]) s.reduce.axes.push_back(static_cast<int>(k));
      else out_stored.push_back(x.dims[a]);
      kept_stored.push_back(reduced[a] ? 1 : x.dims[a]);
    }
    if (out_stored.empty()) out_stored.push_back(1);
    Value v = x;
    v.node = add_node(n, std::move(s));
    if (keep) {
      for (std::size_t a = 0; a < v.dims.size(); ++a)
        if (reduced[a]) v.dims[a] = 1;
      if (kept_stored != out_stored) {
        NodeSpec view = node_of(unique(v.node + ".keepdims"), "reshape", {v.node});
        view.reshape = kept_stored;
        v.node = add_node(n, std::move(view));
      }
    } else {
      std::vector<int> renamed(x.dims.size(), -1);
      std::vector<int64_t> dims;
      for (std::size_t a = 0; a < x.dims.size(); ++a)
        if (!reduced[a]) renamed[a] = static_cast<int>(dims.size()), dims.push_back(x.dims[a]);
      std::vector<int> order;
      for (int a : x.order)
        if (!reduced[static_cast<std::size_t>(a)]) order.push_back(renamed[static_cast<std::size_t>(a)]);
      v.dims = dims;
      v.order = order;
    }
    values_[n.outputs.at(0)] = settled_form(std::move(v));
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
    const std::optional<double> v = one_value(constant(n, i));
    return v && std::abs(*v - want) <= 1e-6 * std::max(1.0, std::abs(want));
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
    Form f = form_of(mean, 0);
    const bool channels_last = f == Form::Tensor && last_stored_last(any_input(mean, 0));
    if (f == Form::Tensor && !channels_last) {  // a general tensor: stored as a sequence or vector first
      f = input(mean, 0).form;
      if (f != Form::Sequence && f != Form::Vector) throw Refusal{"it averages a tensor of more than two dimensions a sample"};
    }
    const int64_t last = channels_last ? static_cast<int64_t>(any_input(mean, 0).dims.size()) : f == Form::Sequence ? 2 : 1;
    if (axes != std::vector<int64_t>{-1} && axes != std::vector<int64_t>{last})
      throw Refusal{"it averages over another axis than the features"};
    const OnnxNode* centred = sole_reader(mean.outputs[0], "Sub");
    if (!centred || centred->inputs[0] != mean.inputs.at(0)) throw Refusal{"a mean that does not start a LayerNorm"};
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
    if (!eps || eps->integer || !one_value(eps) || !(eps->floats[0] > 0.0f)) throw Refusal{"a LayerNorm without a positive epsilon"};
    const OnnxNode* scale = sole_reader(divide->outputs.at(0), "Mul");
    const OnnxNode* shift = scale ? sole_reader(scale->outputs.at(0), "Add") : nullptr;
    if (!shift) throw Refusal{"a LayerNorm without weight and bias (elementwise_affine=False) is not supported yet"};
    absorb({centred, square, divide, variance, plus_eps, root, scale, shift});
    values_[shift->outputs.at(0)] = {};  // refused with the mean, if it is
    const Value& x = last_axis_input(mean, 0);
    if (x.form != Form::Vector && x.form != Form::Sequence && !last_stored_last(x))
      throw Refusal{"a LayerNorm over an image's last axis or a flattened image; tandem's layer_norm reads features"};
    const OnnxTensor& weight = this->weight(*scale, other(*scale, divide->outputs[0]), "weight");
    const OnnxTensor& bias = this->weight(*shift, other(*shift, scale->outputs[0]), "bias");
    NodeSpec s = node_of(param_node_name(mean, weight), "layer_norm", {x.node});
    s.layer_norm.eps = eps->floats[0];
    add_weight(s, "weight", weight);
    add_weight(s, "bias", bias);
    out_.fused.push_back(cat(s.name, ": ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add -> layer_norm"));
    emit_like(mean, std::move(s), x, shift->outputs.at(0));
  }

  void layer_normalization(const OnnxNode& n) {  // opset 17's own op
    only_first_output_read(n);
    const Value& x = last_axis_input(n, 0);
    if (x.form != Form::Vector && x.form != Form::Sequence && !last_stored_last(x))
      throw Refusal{"it normalizes an image or a flattened one; tandem's layer_norm reads features"};
    const int64_t axis = int_attr(n, "axis", -1);
    const int64_t last = last_stored_last(x) ? static_cast<int64_t>(x.dims.size()) : x.form == Form::Sequence ? 2 : 1;
    if (axis != -1 && axis != last) throw Refusal{"it normalizes over more than the features"};
    if (!stored(n, 1) || !stored(n, 2))
      throw Refusal{"a LayerNorm without weight and bias (elementwise_affine=False) is not supported yet"};
    const OnnxTensor& weight = this->weight(n, 1, "scale");
    NodeSpec s = node_of(param_node_name(n, weight), "layer_norm", {x.node});
    s.layer_norm.eps = float_attr(n, "epsilon", 1e-5f);
    add_weight(s, "weight", weight);
    add_weight(s, "bias", this->weight(n, 2, "bias"));
    emit_like(n, std::move(s), x, n.outputs.at(0));
  }

  // nn.GELU() (erf): Div(x, sqrt 2) -> Erf -> Add(1) -> Mul(x, that) -> Mul(0.5).
  // (The pattern is matched before its input is read; a Div or Mul outside one is reported
  // unless what it reads was refused: shape arithmetic on a refused tensor's shape.)
  void div(const OnnxNode& d) {
    if (form_of(d, 0) == Form::Scores || form_of(d, 0) == Form::HeadsFirst || form_of(d, 0) == Form::KeysT)
      return scale_scores(d, 0, true);
    const OnnxNode* erf = is_scalar(d, 1, std::sqrt(2.0)) ? sole_reader(d.outputs.at(0), "Erf") : nullptr;
    const OnnxNode* plus = erf ? sole_reader(erf->outputs.at(0), "Add") : nullptr;
    const OnnxNode* times_x = plus && is_scalar(*plus, other(*plus, erf->outputs[0]), 1.0) ? sole_reader(plus->outputs.at(0), "Mul") : nullptr;
    const OnnxNode* half = times_x && times_x->inputs[other(*times_x, plus->outputs[0])] == d.inputs[0]
                               ? sole_reader(times_x->outputs.at(0), "Mul") : nullptr;
    if (!half || !is_scalar(*half, other(*half, times_x->outputs[0]), 0.5)) return general_binary(d, BinaryAttrs::Mode::div);
    absorb({erf, plus, times_x, half});
    values_[half->outputs.at(0)] = {};
    const Value& x = last_axis_input(d, 0);
    out_.fused.push_back(cat(module_of(d.name).empty() ? d.name : module_of(d.name), ": Div, Erf, Add, Mul, Mul -> gelu"));
    emit_like(d, node_of(module_node_name(d, "gelu"), "gelu", {x.node}), x, half->outputs.at(0));
  }

  // nn.GELU(approximate="tanh"): x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))), as
  // Mul(x, x) -> Mul(x, that) -> Mul(0.044715) -> Add(x) -> Mul(sqrt(2 / pi)) -> Tanh -> Add(1)
  // -> Mul(x) -> Mul(0.5).
  void mul(const OnnxNode& sq) {
    for (std::size_t i = 0; i < 2; ++i)
      if (const std::optional<std::vector<int64_t>> c = causal_of(sq, i)) {  // baddbmm's beta * attn_mask
        const std::optional<double> by = one_value(constant(sq, 1 - i));
        if (!by || !(*by >= 1.0) || !std::isfinite(*by))  // below 1, c <= -1e4 could become a soft penalty
          throw Refusal{"it multiplies a causal mask by other than a constant of at least 1"};
        causal_[sq.outputs.at(0)] = *c;
        return;
      }
    for (std::size_t i = 0; i < 2; ++i) {
      const Form f = form_of(sq, i);
      if (f == Form::Scores || f == Form::HeadsFirst || f == Form::KeysT) return scale_scores(sq, i, false);
      if (form_of(sq, i) == Form::Mask) return mask_step(sq, i);
    }
    const std::string& xv = sq.inputs.at(0);
    const OnnxNode* cube = sq.inputs.size() == 2 && sq.inputs[1] == xv ? sole_reader(sq.outputs.at(0), "Mul") : nullptr;
    const OnnxNode* scaled = cube && cube->inputs[other(*cube, sq.outputs[0])] == xv ? sole_reader(cube->outputs.at(0), "Mul") : nullptr;
    const OnnxNode* sum = scaled && is_scalar(*scaled, other(*scaled, cube->outputs[0]), 0.044715) ? sole_reader(scaled->outputs.at(0), "Add") : nullptr;
    const OnnxNode* inner = sum && sum->inputs[other(*sum, scaled->outputs[0])] == xv ? sole_reader(sum->outputs.at(0), "Mul") : nullptr;
    const OnnxNode* tanh = inner && is_scalar(*inner, other(*inner, sum->outputs[0]), std::sqrt(2.0 / M_PI)) ? sole_reader(inner->outputs.at(0), "Tanh") : nullptr;
    const OnnxNode* plus = tanh ? sole_reader(tanh->outputs.at(0), "Add") : nullptr;
    const OnnxNode* times_x = plus && is_scalar(*plus, other(*plus, tanh->outputs[0]), 1.0) ? sole_reader(plus->outputs.at(0), "Mul") : nullptr;
    const OnnxNode* half = times_x && times_x->inputs[other(*times_x, plus->outputs[0])] == xv ? sole_reader(times_x->outputs.at(0), "Mul") : nullptr;
    if (!half || !is_scalar(*half, other(*half, times_x->outputs[0]), 0.5)) return product(sq);
    absorb({cube, scaled, sum, inner, tanh, plus, times_x, half});
    values_[half->outputs.at(0)] = {};
    const Value& x = input(sq, 0);
    out_.fused.push_back(cat(module_of(sq.name).empty() ? sq.name : module_of(sq.name), ": Mul, Mul, Mul, Add, Mul, Tanh, Add, Mul, Mul -> gelu_tanh"));
    emit(sq, node_of(module_node_name(sq, "gelu_tanh"), "gelu_tanh", {x.node}), x.form, half->outputs.at(0), x.dims);
  }

  // Mul of two computed tensors of one shape, or a channel's gate repeated over an image
  // (MobileNetV3's squeeze-excitation: the image times its pooled gates): tandem's mul; any
  // other product a general binary.
  void product(const OnnxNode& n) {
    skip_refused(n);
    if (constant(n, 0) || constant(n, 1) || !same_shaped(n)) {
      const Form fa = form_of(n, 0), fb = form_of(n, 1);
      if ((fa == Form::Image && fb == Form::Pooled) || (fa == Form::Pooled && fb == Form::Image)) {
        const Value& a = input(n, 0);
        const Value& b = input(n, 1);
        return emit(n, node_of(functional_node_name(n), "mul", {fa == Form::Image ? a.node : b.node, fa == Form::Image ? b.node : a.node}),
                    Form::Image, n.outputs.at(0));
      }
      return general_binary(n, BinaryAttrs::Mode::mul);
    }
    const Value& a = input(n, 0);
    const Value& b = input(n, 1);
    emit(n, node_of(functional_node_name(n), "mul", {a.node, b.node}), a.form, n.outputs.at(0), a.dims);
  }
  // Whether the two inputs are computed tensors of one form and shape (not general tensors:
  // their stored orders may differ), which add and mul take as they are.
  bool same_shaped(const OnnxNode& n) {
    const Value& a = any_input(n, 0);
    const Value& b = any_input(n, 1);
    if (a.form == Form::Patches || b.form == Form::Patches) return false;  // general_binary reads them (operand())
    if (is_step(a.form) || is_step(b.form)) return true;  // input() refuses them by name
    return a.form == b.form && a.form != Form::Tensor && a.form != Form::FlatImage &&
           (a.dims.empty() || b.dims.empty() || a.dims == b.dims);
  }

  // Add, Sub, Mul or Div that no pattern and no op of one shape takes: tandem's binary. Two
  // computed tensors broadcast as ONNX does (numpy's, aligned on the last axis), both stored
  // in one order first (a view, or a transpose); or one and a constant scalar, either side.
  void general_binary(const OnnxNode& n, BinaryAttrs::Mode mode) {
    skip_refused(n);
    static const char* const verbs[] = {"adds", "subtracts", "multiplies", "divides"};
    const bool compares = mode >= BinaryAttrs::Mode::equal;
    const char* verb = compares ? "compares" : verbs[static_cast<int>(mode)];
    const OnnxTensor* c[2] = {constant(n, 0), constant(n, 1)};
    if (c[0] && c[1]) throw Refusal{cat("it ", verb, " two constants; tandem computes on tensors of the batch")};
    if (c[0] || c[1]) {
      const std::size_t at = c[0] ? 1 : 0;
      const OnnxTensor* k = c[1 - at];
      const std::optional<double> v = one_value(k);
      if (k->integer && !compares) throw Refusal{cat("it ", verb, " by an integer constant; tandem computes on floats")};
      if (stored(n, 1 - at) && !starts_with(k->name, "onnx::") && !compares) return trained_operand(n, at, mode, *k, verb);
      if (!v)
        throw Refusal{cat("it ", verb, " by a stored tensor of ", k->count(), " values; tandem takes a constant scalar, or two "
                          "computed tensors (a bias belongs to a linear or convolution)")};
      const Value x = any_input(n, at).form == Form::Patches ? operand(n, at, verb) : any_input(n, at);
      if (!x.dims.empty() && k->dims.size() > x.dims.size() + 1)
        throw Refusal{cat("it ", verb, " by a constant of ", k->dims.size(), " dimensions, more than the tensor's ",
                          x.dims.size() + 1, " (its output would gain axes before the batch)")};
      if (is_step(x.form)) input(n, at);  // refused, naming the step
      if (x.form == Form::FlatImage)
        throw Refusal{cat("it ", verb, " a flattened image, whose values tandem orders (h, w, c) and PyTorch (c, h, w)")};
      NodeSpec s = node_of(functional_node_name(n), "binary", {x.node});
      s.binary.mode = mode;
      s.binary.has_scalar = true;
      s.binary.scalar = static_cast<float>(*v);
      s.binary.scalar_first = at == 1 && (mode == BinaryAttrs::Mode::sub || mode == BinaryAttrs::Mode::div);
      if (at == 1 && compares) s.binary.mode = mirrored(mode);  // c < x is x > c
      if (!std::isfinite(s.binary.scalar))
        throw Refusal{cat("it ", verb, " by ", s.binary.scalar, "; tandem's scalar operands are finite")};
      Value out = x;  // a value at a time: the same form, shape and order
      out.node = add_node(n, std::move(s));
      values_[n.outputs.at(0)] = std::move(out);
      return;
    }
    const Value t[2] = {operand(n, 0, verb), operand(n, 1, verb)};
    const std::vector<int64_t>&da = t[0].dims, &db = t[1].dims;
    if (da.size() != db.size())
      throw Refusal{cat("it ", verb, " tensors of ", da.size() + 1, " and ", db.size() + 1,
                        " dimensions; broadcast, their batch axes would not line up")};
    std::vector<int64_t> dims(da.size());
    for (std::size_t k = 0; k < da.size(); ++k) {
      if (da[k] != db[k] && da[k] != 1 && db[k] != 1)
        throw Refusal{cat("its operands' axis ", k + 1, " is ", da[k], " and ", db[k], "; they do not broadcast")};
      dims[k] = std::max(da[k], db[k]);
    }
    const std::vector<int> order = t[0].dims == dims || t[1].dims != dims ? t[0].order : t[1].order;
    NodeSpec s = node_of(functional_node_name(n), "binary", {stored_as(n, t[0], order).node, stored_as(n, t[1], order).node});
    s.binary.mode = mode;
    emit_general(n, std::move(s), t[0], std::move(dims), order);
  }
  // Input i of a general op as a general tensor; an image's patches ([N, C, H W], what a
  // transpose back to tokens would cancel) a view of the image as [H W, C].
  Value operand(const OnnxNode& n, std::size_t i, const char* verb) {
    const Value& v = any_input(n, i);
    if (v.form == Form::Patches && v.dims.size() == 2) {
      Value t = v;
      NodeSpec view = node_of(module_child(n, "reshape"), "reshape", {v.node});
      view.reshape = {v.dims[1], v.dims[0]};
      t.node = add_node(n, std::move(view));
      t.form = Form::Tensor;
      t.order = {1, 0};
      return t;
    }
    if (is_step(v.form)) input(n, i);  // refused, naming the step
    if (v.form == Form::FlatImage || v.form == Form::Pooled || v.dims.empty())
      throw Refusal{cat("it ", verb, v.form == Form::FlatImage ? " a flattened image, whose values tandem orders (h, w, c) and PyTorch (c, h, w)"
                                                             : " a tensor whose shape import does not know")};
    return as_tensor(v);
  }
  // Add, Sub, Mul or Div of a computed tensor and a parameter of the state dict (a layer scale:
  // x * gamma): binary with a trained `operand` of the parameter's shape, which lines up with
  // the tensor's last axes as stored where the tensor is stored in ONNX's order (a sequence, a
  // vector).
  void trained_operand(const OnnxNode& n, std::size_t at, BinaryAttrs::Mode mode, const OnnxTensor& k, const char* verb) {
    const Value& in = any_input(n, at);
    if (is_step(in.form)) input(n, at);  // refused, naming the step
    if (in.form == Form::Image && in.dims.size() == 3 && k.dims.size() == 3) {  // ConvNeXt's layer scale [C, 1, 1]
      for (std::size_t i = 0; i < 3; ++i)
        if (k.dims[i] != in.dims[i] && k.dims[i] != 1)
          throw Refusal{cat("its trained operand '", k.name, "' of ", k.dims[i], " at axis ", i + 1, " does not broadcast with ",
                            in.dims[i], " (a trained operand over an image is as large as it, or 1, along each axis)")};
      NodeSpec s = node_of(functional_node_name(n), "binary", {in.node});
      s.binary.mode = mode;
      s.binary.operand = {k.dims[1], k.dims[2], k.dims[0]};  // stored as the image is: [H, W, C]
      s.binary.image_operand = true;
      s.binary.scalar_first = at == 1 && (mode == BinaryAttrs::Mode::sub || mode == BinaryAttrs::Mode::div);
      add_weight(s, "operand", k);
      return emit(n, std::move(s), Form::Image, n.outputs.at(0), in.dims);
    }
    if (in.form == Form::Image || in.form == Form::Pooled || in.form == Form::FlatImage || in.dims.empty())
      throw Refusal{cat("it ", verb, " an image by the trained '", k.name, "' of ", k.dims.size(), " dimensions; tandem takes "
                        "a trained operand [C, H, W] over an image (each axis as large or 1), or over a sequence's or a "
                        "vector's last axes (a layer scale)")};
    Value x = as_tensor(in);
    if (k.dims.size() == 3)  // a binary's operand of three axes is an image's (ImageOrder)
      throw Refusal{cat("its trained operand '", k.name, "' has 3 dimensions over a tensor that is not an image; tandem "
                        "takes 1 or 2 there")};
    if (x.order != identity_order(x.dims.size()))
      throw Refusal{cat("it ", verb, " a tensor stored in another order than ONNX's by the trained '", k.name, "'")};
    if (k.dims.empty() || k.dims.size() > x.dims.size())
      throw Refusal{cat("its trained operand '", k.name, "' has ", k.dims.size(), " dimensions; tandem takes 1 to the tensor's ",
                        x.dims.size(), " a sample (no batch axis)")};
    std::vector<int64_t> dims = x.dims;
    const std::size_t shift = x.dims.size() - k.dims.size();
    for (std::size_t i = 0; i < k.dims.size(); ++i) {
      const int64_t a = x.dims[shift + i], b = k.dims[i];
      if (a != b && a != 1 && b != 1)
        throw Refusal{cat("its trained operand '", k.name, "' of ", b, " at axis ", shift + i + 1, " does not broadcast with ", a)};
      dims[shift + i] = std::max(a, b);
    }
    NodeSpec s = node_of(functional_node_name(n), "binary", {x.node});
    s.binary.mode = mode;
    s.binary.operand = k.dims;
    s.binary.scalar_first = at == 1 && (mode == BinaryAttrs::Mode::sub || mode == BinaryAttrs::Mode::div);
    add_weight(s, "operand", k);
    x.node = add_node(n, std::move(s));
    x.dims = dims;
    values_[n.outputs.at(0)] = settled_form(std::move(x));
  }

  // The general tensor `x` stored in the axis order `want`: as it is, a view where only its
  // axes of one element lie elsewhere, or a transpose.
  Value stored_as(const OnnxNode& n, Value x, const std::vector<int>& want) {
    auto big = [&](const std::vector<int>& order) {
      std::vector<int> b;
      for (int a : order)
        if (x.dims[static_cast<std::size_t>(a)] != 1) b.push_back(a);
      return b;
    };
    if (x.order == want) return x;
    if (big(x.order) != big(want)) return store_in(n, x, want);
    NodeSpec s = node_of(module_child(n, "reshape"), "reshape", {x.node});
    for (int a : want) s.reshape.push_back(x.dims[static_cast<std::size_t>(a)]);
    x.node = add_node(n, std::move(s));
    x.order = want;
    return x;
  }

  // MatMul of two computed tensors (attention written by hand: q @ k^T, p @ v): tandem's
  // matmul, each operand stored in ONNX's order (a transpose where it is not), the axes
  // before the matrices broadcast.
  void general_matmul(const OnnxNode& n) {
    const Value t[2] = {operand(n, 0, "multiplies"), operand(n, 1, "multiplies")};
    const std::vector<int64_t>&da = t[0].dims, &db = t[1].dims;
    if (da.size() < 2 || db.size() < 2)
      throw Refusal{"it multiplies a tensor of one dimension a sample, which ONNX's MatMul reads with the batch as a matrix's "
                    "rows; tandem multiplies each sample's matrices"};
    if (da.size() != db.size())
      throw Refusal{cat("it multiplies tensors of ", da.size() + 1, " and ", db.size() + 1,
                        " dimensions; broadcast, their batch axes would not line up")};
    const std::size_t r = da.size();
    if (da[r - 1] != db[r - 2]) throw Refusal{cat("its operands' inner dimensions ", da[r - 1], " and ", db[r - 2], " differ")};
    std::vector<int64_t> dims(r);
    for (std::size_t k = 0; k + 2 < r; ++k) {
      if (da[k] != db[k] && da[k] != 1 && db[k] != 1)
        throw Refusal{cat("its operands' axis ", k + 1, " is ", da[k], " and ", db[k], "; they do not broadcast")};
      dims[k] = std::max(da[k], db[k]);
    }
    dims[r - 2] = da[r - 2];
    dims[r - 1] = db[r - 1];
    const std::vector<int> order = identity_order(r);
    NodeSpec s = node_of(functional_node_name(n), "matmul", {stored_as(n, t[0], order).node, stored_as(n, t[1], order).node});
    emit_general(n, std::move(s), t[0], std::move(dims), order);
  }
  // `node`, made for `n` from the general tensor `like`: its output, `dims` stored in `order`.
  void emit_general(const OnnxNode& n, NodeSpec node, Value like, std::vector<int64_t> dims, std::vector<int> order) {
    like.node = add_node(n, std::move(node));
    like.dims = std::move(dims);
    like.order = std::move(order);
    values_[n.outputs.at(0)] = settled_form(std::move(like));
  }

  // nn.Hardsigmoid: relu6(x + 3) / 6, HardSigmoid with alpha 1/6 and beta 0.5.
  void hard_sigmoid(const OnnxNode& n) {
    const float alpha = float_attr(n, "alpha", 0.2f), beta = float_attr(n, "beta", 0.5f);
    if (std::abs(alpha - 1.0f / 6.0f) > 1e-6f || beta != 0.5f)
      throw Refusal{cat("alpha ", alpha, " and beta ", beta, "; tandem's hardsigmoid is PyTorch's (alpha 1/6, beta 0.5)")};
    activation(n, "hardsigmoid");
  }

  void flatten(const OnnxNode& n) {
    const Value& x = input(n, 0);
    if (int_attr(n, "axis", 1) != 1) throw Refusal{"it flattens from another axis than 1; tandem keeps the batch first"};
    flatten_to(n, x);
  }
  void flatten_to(const OnnxNode& n, const Value& x) {
    if (x.form == Form::Sequence)  // [T, F] -> [T F], in one order in both
      return emit(n, node_of(functional_node_name(n), "flatten", {x.node}), Form::Vector, n.outputs.at(0), {count_of(x.dims)});
    if (x.form != Form::Image) return alias(n, x, x.form == Form::Pooled ? Form::Vector : x.form);
    if (x.dims.size() == 3 && x.dims[1] == 1 && x.dims[2] == 1)  // [C, 1, 1]: (h, w, c) and (c, h, w) agree
      return emit(n, node_of(functional_node_name(n), "flatten", {x.node}), Form::Vector, n.outputs.at(0), {x.dims[0]});
    emit(n, node_of(functional_node_name(n), "flatten", {x.node}), Form::FlatImage, n.outputs.at(0));
  }

  // Reshape's target for one sample: its shape (computed from shapes, the batch symbolic,
  // or a constant) with 0 (copy; allowzero=0) and -1 (the rest) resolved against `dims`.
  // The batch must stay first and alone.
  std::vector<int64_t> reshape_target(const OnnxNode& n, const std::vector<int64_t>& dims) {
    const Folded* target = folded(n, 1);
    if (!target) throw Refusal{"its shape is computed from tensor values; tandem reshapes to shapes known at import"};
    if (target->dims.size() != 1) throw Refusal{"its shape is not a list"};
    if (int_attr(n, "allowzero", 0) != 0) throw Refusal{"allowzero=1 is not supported"};
    std::vector<Sym> full{{1, 1}};
    for (int64_t d : dims) full.push_back({d, 0});
    std::vector<Sym> out = target->v;
    int64_t known = 1, rest = -1;
    int batch = 0;
    for (std::size_t k = 0; k < out.size(); ++k) {
      if (out[k].unknown) throw Refusal{"its shape uses a dimension of a tensor whose shape import does not track"};
      if (out[k].p == 0 && out[k].c == 0) {
        if (k >= full.size()) throw Refusal{cat("its shape copies dimension ", k, ", which the input lacks")};
        out[k] = full[k];
      }
      if (out[k].p == 0 && out[k].c == -1) {
        if (rest >= 0) throw Refusal{"its shape has two -1s"};
        rest = static_cast<int64_t>(k);
        continue;
      }
      if (out[k].c <= 0) throw Refusal{cat("its shape has the dimension ", out[k].c)};
      if (out[k].p > 1 || (out[k].p == 1 && (out[k].c != 1 || k != 0)))
        throw Refusal{"it reshapes across the batch; tandem keeps each sample's values apart"};
      batch += out[k].p;
      if (__builtin_mul_overflow(known, out[k].c, &known) || known > (int64_t{1} << 62))
        throw Refusal{"its shape multiplies past what tandem computes with"};
    }
    const int64_t total = count_of(dims);
    if (rest == 0) {  // -1 first: the batch, if the rest is one sample's
      if (known != total) throw Refusal{"it reshapes across the batch; tandem keeps each sample's values apart"};
      out[0] = {1, 1};
    } else if (rest > 0) {
      if (known == 0 || total % known != 0) throw Refusal{"its -1 does not divide the input's size"};
      out[static_cast<std::size_t>(rest)] = {total / known, 0};
    } else if (known != total) {
      throw Refusal{cat("it reshapes ", total, " values a sample into ", known)};
    }
    if (rest != 0 && batch != 1) throw Refusal{"its shape does not keep the batch first"};
    std::vector<int64_t> per_sample;
    for (std::size_t k = 1; k < out.size(); ++k) per_sample.push_back(out[k].c);
    return per_sample;
  }

  // ---- general tensors: reshape and transpose where no pattern takes them ----

  static std::vector<int> identity_order(std::size_t rank) {
    std::vector<int> o(rank);
    for (std::size_t k = 0; k < rank; ++k) o[k] = static_cast<int>(k);
    return o;
  }
  static const std::vector<int>& image_order() {
    static const std::vector<int> o{1, 2, 0};  // [C, H, W] stored [H, W, C]
    return o;
  }
  // `x` as a general tensor: an image [C, H, W] stored [H, W, C]; a sequence or a vector as it is.
  Value as_tensor(const Value& x) const {
    if ((bool_inputs_.count(x.node) || box_inputs_.count(x.node)) && x.form != Form::Mask)
      throw Refusal{cat("it reads the input '", x.node, "' as a tensor; tandem reads a boolean input only as attention's key "
                        "padding mask, and integers [batch, tokens, 4] only as LayoutLM's boxes")};
    Value t = x;
    if (x.form == Form::Tensor) return t;
    if (x.form == Form::Image && x.dims.size() == 3) {
      t.order = image_order();
    } else if ((x.form == Form::Sequence || x.form == Form::Vector) && !x.dims.empty()) {
      t.order = identity_order(x.dims.size());
    } else {
      throw Refusal{x.form == Form::FlatImage ? "it reshapes a flattened image, whose values tandem orders (h, w, c) and PyTorch (c, h, w)"
                                              : "it reshapes a tensor whose shape import does not know"};
    }
    t.form = Form::Tensor;
    return t;
  }
  // A general tensor's form: an image where it is [C, H, W] stored [H, W, C], a sequence or a
  // vector where it is stored in ONNX's order; else a Tensor.
  static Value settled_form(Value v) {
    if (v.dims.size() == 3 && v.order == image_order()) v.form = Form::Image;
    else if (v.dims.size() <= 2 && v.order == identity_order(v.dims.size())) v.form = v.dims.size() == 2 ? Form::Sequence : Form::Vector;
    else v.form = Form::Tensor;
    if (v.form != Form::Tensor) v.order.clear();
    return v;
  }
  // A transpose node storing the tensor `x` (of `n`'s making or reading) in the order `want`.
  Value store_in(const OnnxNode& n, Value x, const std::vector<int>& want) {
    std::vector<int> at(x.order.size()), perm;
    for (std::size_t k = 0; k < x.order.size(); ++k) at[static_cast<std::size_t>(x.order[k])] = static_cast<int>(k);
    for (int a : want) perm.push_back(at[static_cast<std::size_t>(a)]);
    NodeSpec s = node_of(module_child(n, "transpose"), "transpose", {x.node});
    s.perm = perm;
    x.node = add_node(n, std::move(s));
    x.order = want;
    return x;
  }
  // A general tensor read by an op that reads images, sequences and vectors: stored as one
  // (a transpose where its order is not one's), and kept so for its other readers.
  const Value& settle(const OnnxNode& n, const std::string& name) {
    Value x = values_.at(name);
    const std::size_t rank = x.dims.size();
    if (rank == 0 || rank > 3)
      throw Refusal{cat("it reads a tensor of ", rank, " dimensions a sample (a reshape's); tandem's ops other than reshape, "
                        "transpose and slice read images [C, H, W], sequences and vectors")};
    const std::vector<int> want = rank == 3 ? image_order() : identity_order(rank);
    auto big = [&](const std::vector<int>& order) {  // the axes of more than one element, in storage order
      std::vector<int> b;
      for (int a : order)
        if (x.dims[static_cast<std::size_t>(a)] != 1) b.push_back(a);
      return b;
    };
    if (big(x.order) != big(want)) return values_[name] = settled_form(store_in(n, x, want));
    // Stored so but for where its axes of one element lie (a 1x1 image's): a view.
    NodeSpec s = node_of(module_child(n, "reshape"), "reshape", {x.node});
    for (int a : want) s.reshape.push_back(x.dims[static_cast<std::size_t>(a)]);
    x.node = add_node(n, std::move(s));
    x.order = want;
    return values_[name] = settled_form(std::move(x));
  }
  // Reshape of a general tensor. ONNX's axes fall into groups that become one another (an axis
  // split, axes merged); where each group's axes lie side by side in storage in ONNX's order,
  // the reshape is a view of the stored tensor; else one transpose first puts them so (a
  // channel shuffle's [C/g, g, H, W] stored [H, W, g, C/g] -> [H, W, C/g, g]).
  void general_reshape(const OnnxNode& n, const Value& in, const std::vector<int64_t>* given = nullptr) {
    Value x = as_tensor(in);
    const std::vector<int64_t>& d = x.dims;
    const std::vector<int64_t> to = given ? *given : reshape_target(n, d);
    if (to.empty() || static_cast<int>(to.size()) >= kMaxRank)
      throw Refusal{cat("it reshapes a sample to ", to.size(), " dimensions; tandem's tensors hold 1 to ", kMaxRank - 1, " a sample")};
    struct Group {
      std::vector<int> src, dst;
    };
    std::vector<Group> groups;
    std::vector<int> group_of(d.size());
    for (std::size_t i = 0, j = 0; i < d.size() || j < to.size();) {
      Group g;
      int64_t ps = 1, pt = 1;
      auto take_src = [&] { ps *= d[i], g.src.push_back(static_cast<int>(i++)); };
      auto take_dst = [&] { pt *= to[j], g.dst.push_back(static_cast<int>(j++)); };
      i < d.size() ? take_src() : take_dst();
      while (ps != pt) {
        if (ps < pt && i < d.size()) take_src();
        else if (ps > pt && j < to.size()) take_dst();
        else throw Refusal{"its shape does not hold the input's values"};
      }
      for (int a : g.src) group_of[static_cast<std::size_t>(a)] = static_cast<int>(groups.size());
      groups.push_back(std::move(g));
    }
    // Whether a group's axes of more than one element lie side by side in storage, in ONNX's order.
    auto side_by_side = [&](const Group& g) {
      std::vector<int> big;  // the stored axes of more than one element
      for (int a : x.order)
        if (d[static_cast<std::size_t>(a)] != 1) big.push_back(a);
      std::vector<int> mine;
      for (int a : g.src)
        if (d[static_cast<std::size_t>(a)] != 1) mine.push_back(a);
      if (mine.size() < 2) return true;
      const auto first = std::find(big.begin(), big.end(), mine[0]);
      return static_cast<std::size_t>(big.end() - first) >= mine.size() && std::equal(mine.begin(), mine.end(), first);
    };
    bool view = true;
    for (const Group& g : groups) view = view && side_by_side(g);
    if (!view) {  // each group's axes together, in ONNX's order, where its first one is stored
      std::vector<int> want;
      std::vector<bool> placed(groups.size(), false);
      for (int a : x.order) {
        const auto gi = static_cast<std::size_t>(group_of[static_cast<std::size_t>(a)]);
        if (d[static_cast<std::size_t>(a)] == 1 || side_by_side(groups[gi])) {
          want.push_back(a);
        } else if (!placed[gi]) {
          placed[gi] = true;
          for (int b : groups[gi].src)
            if (d[static_cast<std::size_t>(b)] != 1) want.push_back(b);
        }
      }
      x = store_in(n, x, want);
    }
    std::vector<int> order;  // the target's axes in storage: each group's where its first axis was
    std::vector<bool> done(groups.size(), false);
    for (int a : x.order) {
      const auto gi = static_cast<std::size_t>(group_of[static_cast<std::size_t>(a)]);
      if (d[static_cast<std::size_t>(a)] == 1 && groups[gi].src.size() > 1) continue;
      if (done[gi]) continue;
      done[gi] = true;
      order.insert(order.end(), groups[gi].dst.begin(), groups[gi].dst.end());
    }
    for (std::size_t gi = 0; gi < groups.size(); ++gi)
      if (!done[gi]) order.insert(order.end(), groups[gi].dst.begin(), groups[gi].dst.end());
    std::vector<int64_t> stored, before;
    for (int a : order) stored.push_back(to[static_cast<std::size_t>(a)]);
    for (int a : x.order) before.push_back(d[static_cast<std::size_t>(a)]);
    Value v = x;
    v.dims = to;
    v.order = order;
    if (stored != before) {
      NodeSpec s = node_of(functional_node_name(n), "reshape", {x.node});
      s.reshape = stored;
      v.node = add_node(n, std::move(s));
    }
    values_[n.outputs.at(0)] = settled_form(std::move(v));
  }
  // Transpose of a general tensor, an image, a sequence or a vector: its axes named anew, no
  // copy (a reader that needs them stored otherwise makes the transpose).
  void general_transpose(const OnnxNode& n, const Value& in) {
    Value x = as_tensor(in);
    const std::size_t rank = x.dims.size();
    std::vector<int64_t> perm = ints_attr(n, "perm", {});
    if (perm.empty())
      for (std::size_t k = 0; k <= rank; ++k) perm.insert(perm.begin(), static_cast<int64_t>(k));
    if (perm.size() != rank + 1) throw Refusal{cat("its perm has ", perm.size(), " axes; the tensor has ", rank + 1)};
    if (perm[0] != 0) throw Refusal{"it moves the batch from the first axis; tandem keeps each sample's values apart"};
    std::vector<int> inverse(rank, -1);
    std::vector<int64_t> dims(rank);
    for (std::size_t k = 0; k < rank; ++k) {
      if (perm[k + 1] < 1 || perm[k + 1] > static_cast<int64_t>(rank)) throw Refusal{"its perm is not an order of the tensor's axes"};
      const int64_t a = perm[k + 1] - 1;
      if (inverse[static_cast<std::size_t>(a)] >= 0)
        throw Refusal{"its perm is not an order of the tensor's axes"};
      inverse[static_cast<std::size_t>(a)] = static_cast<int>(k);
      dims[k] = x.dims[static_cast<std::size_t>(a)];
    }
    for (int& a : x.order) a = inverse[static_cast<std::size_t>(a)];
    x.dims = dims;
    values_[n.outputs.at(0)] = settled_form(std::move(x));
  }

  // Reshape: to [N, -1] (a flatten); a sequence [N, T, F] to heads [N, T, H, D]; attention's
  // context [N, T, H, D] back to [N, T, H D]; a sequence to its own shape.
  void reshape(const OnnxNode& n) {
    skip_refused(n);
    const Value& x = any_input(n, 0);
    if (x.form == Form::SequenceTM || x.form == Form::ContextTM || x.form == Form::TokensTM) return reshape_time_major(n, x);
    if (x.form == Form::Mask || bool_inputs_.count(x.node)) return reshape_mask(n);
    if (x.form == Form::ContextTokens) {
      const std::vector<int64_t> to = reshape_target(n, x.dims);
      if (to.size() != 2 || to[0] != x.dims[0] || to[1] != x.dims[1] * x.dims[2])
        throw Refusal{"attention's context is reshaped to another shape than [batch, tokens, features]"};
      return as_step(n, x, Form::Sequence, to);
    }
    if (x.form == Form::Tensor) return general_reshape(n, x);
    input(n, 0);  // a plain tensor from here on
    if (x.dims.empty() && x.form != Form::Image && x.form != Form::Pooled && x.form != Form::FlatImage)
      throw Refusal{"it reshapes a tensor whose shape import does not know"};
    const Folded* target = folded(n, 1);
    if (x.form == Form::Image && x.dims.size() == 3 && target && target->v.size() == 3) {  // [N, C, H W]: patches
      const std::vector<int64_t> to = reshape_target(n, x.dims);
      if (to != std::vector<int64_t>{x.dims[0], count_of({x.dims[1], x.dims[2]})})
        throw Refusal{"it reshapes an image to another shape than [batch, channels, height * width] (a ViT's patches)"};
      return as_step(n, x, Form::Patches, to);
    }
    if (x.form == Form::Image || x.form == Form::Pooled || x.form == Form::FlatImage) {  // [N, -1]: a flatten
      if (target && target->v.size() == 2 && target->v[1] == Sym{-1, 0} && (target->v[0] == Sym{1, 1} || target->v[0] == Sym{0, 0}))
        return flatten_to(n, x);
      if (x.form != Form::Image || x.dims.size() != 3)
        throw Refusal{"it reshapes an image whose shape import does not know to another shape than [batch, -1] (export "
                      "with a dynamic batch, dynamic_axes={'<input>': {0: 'batch'}})"};
      return general_reshape(n, x);
    }
    const std::vector<int64_t> to = reshape_target(n, x.dims);
    if (to == x.dims) return alias(n, x, x.form);
    if (to.size() == 1) return flatten_to(n, x);
    if (x.form == Form::Sequence && to.size() == 3 && to[0] == x.dims[0] && to[1] > 0 && x.dims[1] % to[1] == 0 &&
        x.dims[1] / to[1] == to[2]) {
      Value v = x;
      v.heads = to[1];
      return as_step(n, std::move(v), Form::Heads, to);
    }
    general_reshape(n, x);
  }

  // Whether `target` (Reshape's input 1) is exactly `want`, the batch symbolic.
  bool target_is(const OnnxNode& n, const std::vector<Sym>& want) const {
    const Folded* target = folded(n, 1);
    if (!target || target->dims.size() != 1 || target->v.size() != want.size()) return false;
    for (std::size_t k = 0; k < want.size(); ++k)
      if (!(target->v[k] == want[k])) return false;
    return true;
  }
  // nn.MultiheadAttention's views, time-major: [T, N, F] -> [T, N H, D] (heads merged with the
  // batch) or [T N, F]; the context [T, N H, D] -> [T N, H D] or [T, N, H D]; [T N, F] -> [T, N, F].
  void reshape_time_major(const OnnxNode& n, const Value& x) {
    if (int_attr(n, "allowzero", 0) != 0) throw Refusal{"allowzero=1 is not supported"};
    Value v = x;
    const int64_t t = x.dims[0], f = x.form == Form::ContextTM ? x.dims[1] * x.dims[2] : x.dims.back();
    const Folded* target = folded(n, 1);
    if (x.form == Form::SequenceTM && target && target->v.size() == 3 && target->v[1].p == 1 && target->v[1].c > 0 &&
        f % target->v[1].c == 0 && target_is(n, {{t, 0}, {target->v[1].c, 1}, {f / target->v[1].c, 0}})) {
      v.form = Form::HeadsTM;
      v.heads = target->v[1].c;
      v.dims = {t, v.heads, f / v.heads};
    } else if ((x.form == Form::SequenceTM || x.form == Form::ContextTM) && target_is(n, {{t, 1}, {f, 0}})) {
      v.form = Form::TokensTM;
      v.dims = {t, f};
    } else if ((x.form == Form::TokensTM || x.form == Form::ContextTM) && target_is(n, {{t, 0}, {1, 1}, {f, 0}})) {
      v.form = Form::SequenceTM;
      v.dims = {t, f};
    } else {
      throw Refusal{cat("it reshapes ", step_name(x.form), " otherwise than nn.MultiheadAttention does")};
    }
    values_[n.outputs.at(0)] = v;
  }

  // The input of a linear layer: a plain tensor, or a sequence time-major or flattened so
  // (nn.MultiheadAttention's projections, per token as on [N, T, F]).
  const Value& linear_input(const OnnxNode& n, std::size_t i) {
    const Form f = form_of(n, i);
    return f == Form::SequenceTM || f == Form::TokensTM ? any_input(n, i) : last_axis_input(n, i);
  }

  void linear(const OnnxNode& n, const Value& in, const OnnxTensor& w, bool transposed, const OnnxTensor* b) {
    if (in.form == Form::Image) throw Refusal{"it multiplies an image; flatten it first"};
    Value x = in;
    std::vector<int64_t> stored;  // a channels-last tensor's stored dims: the linear reads it as [pixels, C]
    if (last_stored_last(in)) {
      for (int a : in.order) stored.push_back(in.dims[static_cast<std::size_t>(a)]);
      NodeSpec view = node_of(module_child(n, "reshape"), "reshape", {in.node});
      view.reshape = {count_of({stored.begin(), stored.end() - 1}), stored.back()};
      x.node = add_node(n, std::move(view));
      x.form = Form::Sequence;
    }
    if (w.dims.size() != 2) throw Refusal{cat("its weight has ", w.dims.size(), " dimensions; a linear layer's has two")};
    const int64_t out_features = transposed ? w.dims[1] : w.dims[0];
    if (b && !(b->dims == std::vector<int64_t>{out_features} || b->dims == std::vector<int64_t>{1, out_features}))
      throw Refusal{cat("its bias has dimensions other than [", out_features, "] or [1, ", out_features, "]")};
    NodeSpec s = node_of(param_node_name(n, w), "linear", {x.node});
    s.linear = {out_features, b != nullptr};
    add_weight(s, "weight", w, transposed);
    if (b) {
      OnnxTensor flat = *b;
      flat.dims = {out_features};
      add_weight(s, "bias", flat);
    }
    std::vector<int64_t> dims = in.dims;
    if (!dims.empty()) dims.back() = out_features;
    if (!stored.empty()) {  // back to the tensor's stored shape, C replaced
      stored.back() = out_features;
      Value y = in;
      y.node = add_node(n, std::move(s));
      NodeSpec back = node_of(module_child(n, "reshape"), "reshape", {y.node});
      back.reshape = stored;
      y.node = add_node(n, std::move(back));
      y.dims = dims;
      values_[n.outputs.at(0)] = std::move(y);
      return;
    }
    const bool tokens = x.form == Form::Sequence || x.form == Form::SequenceTM || x.form == Form::TokensTM;
    emit(n, std::move(s), tokens ? x.form : Form::Vector, n.outputs.at(0), dims);
  }

  void gemm(const OnnxNode& n) {
    const Value& a = linear_input(n, 0);
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
    skip_refused(n);
    const Form f = form_of(n, 0);
    const std::vector<int64_t> swap01{1, 0, 2};
    if ((f == Form::Sequence || f == Form::SequenceTM) && ints_attr(n, "perm", {}) == swap01)  // nn.MultiheadAttention's batch_first, there and back
      return alias(n, any_input(n, 0), f == Form::Sequence ? Form::SequenceTM : Form::Sequence);
    if (f == Form::SequenceTM) throw Refusal{"it permutes a time-major sequence otherwise than back to [N, T, F]"};
    if (f == Form::Image || f == Form::Sequence || f == Form::Vector || f == Form::Tensor) return general_transpose(n, any_input(n, 0));
    if (f == Form::Pooled && pooled_channels_.count(n.inputs.at(0))) {  // [N, C, 1, 1], stored [C]: viewed [1, 1, C]
      Value x = any_input(n, 0);
      const int64_t c = pooled_channels_.at(n.inputs[0]);
      NodeSpec view = node_of(module_child(n, "reshape"), "reshape", {x.node});
      view.reshape = {1, 1, c};
      x.node = add_node(n, std::move(view));
      x.form = Form::Image;
      x.dims = {c, 1, 1};
      return general_transpose(n, x);
    }
    if (f == Form::Patches) {  // [N, C, H W] -> [N, H W, C]: a ViT's patch embedding, tandem's tokens view
      const Value& x = any_input(n, 0);
      if (ints_attr(n, "perm", {}) != std::vector<int64_t>{0, 2, 1})
        throw Refusal{"it permutes an image's patches otherwise than to [batch, patches, channels]"};
      const std::string m = module_of(n.name);
      out_.fused.push_back(cat(m.empty() ? n.name : m, ": Reshape [N, C, H W], Transpose -> tokens"));
      return emit(n, node_of(module_child(n, "tokens"), "tokens", {x.node}), Form::Sequence, n.outputs.at(0),
                  {x.dims[1], x.dims[0]});
    }
    // Attention's permutations, as BERT writes them ([N, T, H, D] ...) and as nn.MultiheadAttention
    // does (heads merged with the batch: [T, N H, D] ...): the step each makes, and its dims'
    // order (Heads and HeadsTM [T, H, D]; HeadsFirst and Context [H, T, D]).
    struct Permutation {
      Form from;
      bool merged;  // the input's
      std::vector<int64_t> perm;
      Form to;
      std::array<std::size_t, 3> order;
      bool merged_out;
    };
    static const std::vector<Permutation> permutations = {
        {Form::Heads, false, {0, 2, 1, 3}, Form::HeadsFirst, {1, 0, 2}, false},
        {Form::Heads, false, {0, 2, 3, 1}, Form::KeysT, {1, 2, 0}, false},
        {Form::HeadsFirst, false, {0, 1, 3, 2}, Form::KeysT, {0, 2, 1}, false},
        {Form::Context, false, {0, 2, 1, 3}, Form::ContextTokens, {1, 0, 2}, false},
        {Form::HeadsTM, false, swap01, Form::HeadsFirst, {1, 0, 2}, true},
        {Form::HeadsTM, false, {1, 2, 0}, Form::KeysT, {1, 2, 0}, true},
        {Form::HeadsFirst, true, {0, 2, 1}, Form::KeysT, {0, 2, 1}, true},
        {Form::Context, true, swap01, Form::ContextTM, {1, 0, 2}, false},
    };
    if (f == Form::Heads || f == Form::HeadsFirst || f == Form::Context || f == Form::HeadsTM) {
      Value v = any_input(n, 0);
      const std::vector<int64_t> perm = ints_attr(n, "perm", {});
      for (const Permutation& p : permutations)
        if (p.from == f && p.merged == v.merged && p.perm == perm) {
          const std::vector<int64_t> d = v.dims;
          v.merged = p.merged_out;
          return as_step(n, std::move(v), p.to, {d[p.order[0]], d[p.order[1]], d[p.order[2]]});
        }
      throw Refusal{cat("it permutes ", step_name(f), " otherwise than multi-head attention does",
                        v.merged || f == Form::HeadsTM ? " (nn.MultiheadAttention's)" : "")};
    }
    const OnnxTensor* t = stored(n, 0);
    const std::vector<int64_t> perm = ints_attr(n, "perm", {1, 0});
    if (!t || t->integer || t->dims.size() != 2 || perm != std::vector<int64_t>{1, 0})
      throw Refusal{"tandem transposes only a stored matrix (a Linear's weight) yet"};
    transposed_[n.outputs.at(0)] = t;
  }

  void matmul(const OnnxNode& n) {
    skip_refused(n);
    const Form a = form_of(n, 0), b = form_of(n, 1);
    const bool alike = a != Form::Unknown && b != Form::Unknown && any_input(n, 0).merged == any_input(n, 1).merged;
    if (a == Form::HeadsFirst && b == Form::KeysT && alike) return attention_scores(n);
    if (a == Form::Probs && b == Form::HeadsFirst && alike) return attention(n);
    if ((a == Form::Patches || b == Form::Patches) && form_of(n, 1) != Form::Unknown) return general_matmul(n);
    if ((is_step(a) && a != Form::SequenceTM && a != Form::TokensTM) || is_step(b))  // those two: by a linear's weight
      throw Refusal{cat("it multiplies ", step_name(is_step(b) ? b : a), " otherwise than attention does (softmax(Q K^T / sqrt(d) + mask) V)")};
    const auto pre = n.inputs.size() == 2 ? transposed_.find(n.inputs[1]) : transposed_.end();
    const bool stored_out_in = pre != transposed_.end();  // W as nn.Linear holds it: [out, in]
    if (!stored_out_in && !constant(n, 1) && form_of(n, 1) != Form::Unknown) return general_matmul(n);
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
    if (!bias) return linear(n, linear_input(n, 0), w, !stored_out_in, nullptr);
    absorbed_.insert(add_index);  // refused or not, the Add is the linear's
    const std::string& sum = g_.nodes[add_index].outputs[0];
    values_[sum] = {};
    linear(n, linear_input(n, 0), w, !stored_out_in, bias);
    values_[sum] = values_[n.outputs[0]];
    out_.fused.push_back(cat(module_of(n.name).empty() ? n.name : module_of(n.name), ": MatMul + Add -> linear"));
  }

  void add(const OnnxNode& n) {
    skip_refused(n);
    const Form fa = form_of(n, 0), fb = form_of(n, 1);
    if (fa == Form::Positions || fb == Form::Positions) return position_embedding(n, fa == Form::Positions ? 0 : 1);
    if (fa == Form::TypeRow || fb == Form::TypeRow) return token_types(n, fa == Form::TypeRow ? 0 : 1);
    if (fa == Form::LayoutRows || fb == Form::LayoutRows) return layout_add(n, fa == Form::LayoutRows ? 0 : 1);
    if (fa == Form::Scores || fb == Form::Scores) return mask_scores(n, fa == Form::Scores ? 0 : 1);
    if (fa == Form::WithClass || fb == Form::WithClass) return class_token(n, fa == Form::WithClass ? 0 : 1);
    if (constant(n, 0) || constant(n, 1) || !same_shaped(n)) return general_binary(n, BinaryAttrs::Mode::add);
    const Value& a = input(n, 0);
    const Value& b = input(n, 1);
    emit(n, node_of(functional_node_name(n), "add", {a.node, b.node}), a.form, n.outputs.at(0), a.dims);
  }

  void concat(const OnnxNode& n) {
    int64_t axis = int_attr(n, "axis", 1);
    if (n.inputs.size() == 1 && !is_step(form_of(n, 0))) {  // torch.cat([x]) (DenseNet's first layer): x itself
      const Value& x = any_input(n, 0);
      return alias(n, x, x.form);
    }
    if (form_of(n, 0) == Form::ClassToken || form_of(n, 1) == Form::ClassToken) return join_class_token(n);
    std::vector<std::string> inputs;
    Form form = Form::Unknown;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const Value& v = input(n, i);
      if (i && v.form != form)
        throw Refusal{cat("it joins tensors of different ranks", v.form == Form::FlatImage || form == Form::FlatImage ? " (a flattened image and a vector)" : "",
                          " at input ", i)};
      form = v.form;
      inputs.push_back(v.node);
    }
    if (form == Form::FlatImage)
      throw Refusal{"it joins flattened images, whose values tandem orders (h, w, c) and PyTorch (c, h, w)"};
    const int64_t rank = form == Form::Image || form == Form::Pooled ? 4 : form == Form::Sequence ? 3 : 2;
    const int64_t features = form == Form::Sequence ? 2 : 1;
    if (axis < 0) axis += rank;
    if (axis != features) throw Refusal{cat("it joins along axis ", axis, "; tandem joins channels or features (axis ", features, ")")};
    std::vector<int64_t> dims;
    if (form == Form::Image) {  // channels side by side: [C1 + C2, H, W] where every one is known
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        const Value& v = input(n, i);
        if (v.dims.size() != 3 || (!dims.empty() && (v.dims[1] != dims[1] || v.dims[2] != dims[2]))) {
          dims.clear();
          break;
        }
        if (dims.empty()) dims = v.dims;
        else if (__builtin_add_overflow(dims[0], v.dims[0], &dims[0])) throw Refusal{"it joins more channels than tandem counts"};
      }
    }
    if (form == Form::Sequence || form == Form::Vector) {
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        const Value& v = input(n, i);
        if (v.dims.empty()) {
          dims.clear();
          break;
        }
        if (dims.empty()) dims = v.dims;
        else if (v.dims.size() != dims.size() || (form == Form::Sequence && v.dims[0] != dims[0]))
          throw Refusal{"it joins sequences of different lengths"};
        else dims.back() += v.dims.back();
      }
    }
    emit(n, node_of(functional_node_name(n), "concat", inputs), form, n.outputs.at(0), dims);
  }

  void dropout(const OnnxNode& n) {
    only_first_output_read(n);
    const float p = g_.opset >= 12 ? scalar(n, 1, 0.5f) : float_attr(n, "ratio", 0.5f);
    if (!(p >= 0.0f && p < 1.0f)) throw Refusal{cat("its ratio ", p, " is outside [0, 1)")};
    if (form_of(n, 0) == Form::Probs) {
      if (p != 0.0f)
        throw Refusal{cat("dropout (p = ", p, ") on attention's probabilities: tandem's attention has none; export with "
                          "it 0 (Hugging Face: attention_probs_dropout_prob=0)")};
      return alias(n, any_input(n, 0), Form::Probs);
    }
    const Value& x = input(n, 0);
    if (p == 0.0f) return alias(n, x, x.form);
    NodeSpec s = node_of(module_node_name(n, "dropout"), "dropout", {x.node});
    s.dropout.p = p;
    emit(n, std::move(s), x.form, n.outputs.at(0), x.dims);
  }

  void identity(const OnnxNode& n) {
    const Value& x = input(n, 0);
    alias(n, x, x.form);
  }

  void constant_node(const OnnxNode& n) {  // registered by run() before the nodes
    const OnnxAttribute* v = n.attribute("value");
    if (!v || v->kind != OnnxAttribute::Kind::Tensor) throw Refusal{"only a 'value' tensor constant is read"};
  }

  // ---- transformers: embeddings, attention, the key padding mask, the first token ----

  InputSpec* graph_input(const std::string& name) {
    for (InputSpec& in : out_.spec.inputs)
      if (in.name == name) return &in;
    return nullptr;
  }

  // Gather: rows of a stored table by a graph input of token ids (nn.Embedding); rows
  // 0..T-1 of a stored table (a position table, added to a sequence next); a sequence's first
  // token (x[:, 0], BERT's pooler).
  void gather(const OnnxNode& n) {
    skip_refused(n);
    const int64_t axis = int_attr(n, "axis", 0);
    if (form_of(n, 0) == Form::Sequence && box_inputs_.count(any_input(n, 0).node)) return box_column(n, axis);
    if (const OnnxTensor* table = stored(n, 0)) {
      if (table->integer || table->dims.size() != 2 || axis != 0)
        throw Refusal{"it gathers from a stored tensor other than an embedding table's rows"};
      if (form_of(n, 1) == Form::BoxColumn || form_of(n, 1) == Form::BoxSpan) {  // LayoutLM: a box table's rows
        Value v = any_input(n, 1);
        v.form = Form::LayoutRows;
        v.table = table;
        v.dims = {v.dims.at(0), table->dims[1]};
        values_[n.outputs.at(0)] = std::move(v);
        return;
      }
      if (folded(n, 1) || per_sample_.count(n.inputs.at(1))) {
        const bool expanded = !folded(n, 1);
        std::vector<int64_t> rows;
        if (expanded) {
          for (const Sym& r : per_sample_.at(n.inputs[1]).v) {
            if (r.unknown || r.p != 0) throw Refusal{"its row indices are computed from the batch"};
            rows.push_back(r.c);
          }
        } else {
          rows = plain_ints(n, 1);
        }
        const std::vector<int64_t>& shape = expanded ? per_sample_.at(n.inputs[1]).dims : folded(n, 1)->dims;
        const int64_t t = static_cast<int64_t>(rows.size());
        const bool one_row = shape == std::vector<int64_t>{1, t} && t > 1 && table->dims[0] <= 16 &&
                             std::all_of(rows.begin(), rows.end(), [](int64_t r) { return r == 0; });
        bool in_order = !one_row && (shape == std::vector<int64_t>{t} || shape == std::vector<int64_t>{1, t});
        for (int64_t k = 0; k < t && in_order; ++k) in_order = rows[static_cast<std::size_t>(k)] == k;
        if (!in_order && !one_row)
          throw Refusal{cat("it gathers rows of '", table->name, "' other than 0, 1, ..., T-1 (a position table) or row 0 at "
                            "every token (a token-type table of at most 16 types, one segment)")};
        Value v;
        v.form = one_row ? Form::TypeRow : Form::Positions;
        v.table = table;
        v.dims = {t, table->dims[1]};
        values_[n.outputs.at(0)] = v;
        return;
      }
      // ids as given, or cast (int32 to int64) or reshaped on the way: what the mask's chain
      // would take for its own until it is inverted or scaled
      const Value* given = &any_input(n, 1);
      if (given->form == Form::Mask && !given->inverted && given->mask_scale == 1.0 && given->dims.size() == 1)
        given = &values_.at(given->node);
      const Value& ids = *given;
      if (is_step(ids.form)) input(n, 1);  // refused, saying what it reads
      const InputSpec* in = graph_input(ids.node);
      if (in && in->mask) throw Refusal{cat("it reads '", ids.node, "' as token ids, which attention reads as its mask")};
      if (in) id_inputs_.insert(ids.node);
      if (!in || !in->integer || ids.dims.size() != 1)
        throw Refusal{"it looks up rows by a tensor that is not a graph input of token ids [batch, tokens]"};
      NodeSpec s = node_of(param_node_name(n, *table), "embedding", {ids.node});
      s.embedding = {table->dims[0], table->dims[1]};
      add_weight(s, "weight", *table);
      return emit(n, std::move(s), Form::Sequence, n.outputs.at(0), {ids.dims[0], table->dims[1]});
    }
    const Folded* index = folded(n, 1);
    if (!index) throw Refusal{"it gathers at indices computed from tensor values; tandem gathers at indices known at import"};
    if (any_input(n, 0).form != Form::Sequence || (axis != 1 && axis != -2) || !index->dims.empty() ||
        plain_ints(n, 1) != std::vector<int64_t>{0})
      return general_gather(n, axis, *index);
    const Value& x = input(n, 0);
    NodeSpec s = node_of(functional_node_name(n), "token_pool", {x.node});
    s.token_pool.mean = false;
    out_.fused.push_back(cat(s.name, ": Gather(axis 1, index 0) -> token_pool (first)"));
    emit(n, std::move(s), Form::Vector, n.outputs.at(0), {x.dims[1]});
  }

  // Gather of a computed tensor at constant indices along a per-sample axis: x[:, k] (one
  // index: the axis goes) or x[:, [a, a+1, ..., b-1]] (a run: the axis stays), a slice of the
  // axis as stored, then a view without it where one index was given. (x[:, 0] of a sequence
  // is token_pool's first token.)
  void general_gather(const OnnxNode& n, int64_t axis, const Folded& index) {
    const Value& in = any_input(n, 0);
    if (is_step(in.form)) input(n, 0);  // refused, naming the step
    if (in.form == Form::FlatImage || in.form == Form::Pooled || in.dims.empty())
      throw Refusal{"it gathers from a flattened image, or a tensor whose shape import does not know"};
    Value x = as_tensor(in);
    const auto rank = static_cast<int64_t>(x.dims.size()) + 1;
    if (axis < 0) axis += rank;
    if (axis <= 0 || axis >= rank) throw Refusal{cat("it gathers along axis ", axis, " (the batch, or outside the tensor's ", rank, ")")};
    const auto a = static_cast<std::size_t>(axis - 1);
    const int64_t size = x.dims[a];
    std::vector<int64_t> at = plain_ints(n, 1);
    if (at.empty() || index.dims.size() > 1) throw Refusal{"it gathers at no index, or at a table of indices"};
    for (int64_t& k : at) {
      if (k < -size || k >= size) throw Refusal{cat("its index ", k, " is outside the axis's ", size)};
      if (k < 0) k += size;
    }
    for (std::size_t k = 1; k < at.size(); ++k)
      if (at[k] != at[k - 1] + 1) throw Refusal{"it gathers indices that are not a run (a, a+1, ..., b-1); tandem slices runs"};
    int stored = 0;  // the axis's place in storage
    while (x.order[static_cast<std::size_t>(stored)] != static_cast<int>(a)) ++stored;
    NodeSpec s = node_of(functional_node_name(n), "slice", {x.node});
    s.slice = {stored, at.front(), at.back() + 1};
    Value v = x;
    v.node = add_node(n, std::move(s));
    v.dims[a] = static_cast<int64_t>(at.size());
    if (index.dims.empty()) {  // one index: the axis goes, a view
      if (x.dims.size() == 1) throw Refusal{"it gathers one number a sample; tandem keeps at least one axis (index with a list)"};
      v.dims.erase(v.dims.begin() + static_cast<std::ptrdiff_t>(a));
      v.order.erase(v.order.begin() + stored);
      for (int& o : v.order)
        if (o > static_cast<int>(a)) --o;
      NodeSpec view = node_of(module_child(n, "reshape"), "reshape", {v.node});
      for (int o : v.order) view.reshape.push_back(v.dims[static_cast<std::size_t>(o)]);
      v.node = add_node(n, std::move(view));
    }
    values_[n.outputs.at(0)] = settled_form(std::move(v));
  }

  // ---- a ViT's embeddings: the class token and the positions ----

  // Expand(a stored [1, 1, F] class token, [batch, 1, 1]): torchvision's
  // class_token.expand(n, -1, -1), joined before the patches next.
  void expand(const OnnxNode& n) {
    skip_refused(n);
    if (form_of(n, 0) == Form::Mask) return expand_mask(n);
    if (!n.inputs.empty() && values_.count(n.inputs[0]) && !is_step(form_of(n, 0))) return general_expand(n);
    if (const Folded* x = folded(n, 0); x && folded(n, 1) && !x->dims.empty() && x->dims[0] == 1) {
      const Folded& shape = *folded(n, 1);
      bool over_batch = shape.v.size() == x->dims.size() && (shape.v[0] == Sym{1, 1});
      for (std::size_t k = 1; over_batch && k < x->dims.size(); ++k)
        over_batch = shape.v[k] == Sym{x->dims[k], 0} || shape.v[k] == Sym{1, 0} || shape.v[k] == Sym{-1, 0};
      if (over_batch) {  // x.expand(batch, ...): the same values for every sample
        per_sample_[n.outputs.at(0)] = *x;
        return;
      }
    }
    const OnnxTensor* token = stored(n, 0);
    const Folded* shape = folded(n, 1);
    auto one = [](const Sym& s) { return s == Sym{1, 0} || s == Sym{-1, 0}; };
    if (!token || token->integer || token->dims.size() != 3 || token->dims[0] != 1 || token->dims[1] != 1 || !shape ||
        shape->v.size() != 3 || !(shape->v[0] == Sym{1, 1}) || !one(shape->v[1]) || !(one(shape->v[2]) || shape->v[2] == Sym{token->dims[2], 0}))
      throw Refusal{"tandem expands only a stored class token [1, 1, F] over the batch (a ViT's "
                    "class_token.expand(batch, -1, -1))"};
    Value v;
    v.form = Form::ClassToken;
    v.table = token;
    v.dims = {1, token->dims[2]};
    values_[n.outputs.at(0)] = v;
  }

  // Concat(class token, patches [N, T, F]) along the tokens: the class token first.
  void join_class_token(const OnnxNode& n) {
    if (n.inputs.size() != 2 || form_of(n, 0) != Form::ClassToken || form_of(n, 1) != Form::Sequence)
      throw Refusal{"it joins a class token otherwise than before a sequence's tokens"};
    const int64_t axis = int_attr(n, "axis", 1);
    const Value& token = any_input(n, 0);
    const Value& x = input(n, 1);
    if ((axis != 1 && axis != -2) || x.dims.size() != 2 || x.dims[1] != token.dims[1])
      throw Refusal{"it joins a class token otherwise than before the tokens of a sequence of as many features"};
    if (x.dims[0] >= kMaxSampleElements) throw Refusal{cat("it joins a class token before ", x.dims[0], " tokens")};
    Value v = x;
    v.table = token.table;
    as_step(n, std::move(v), Form::WithClass, {x.dims[0] + 1, x.dims[1]});
  }

  // Add(class token and patches, a stored position table [1, T + 1, F]): tandem's class_token,
  // under torch's names for both tensors.
  void class_token(const OnnxNode& n, std::size_t at) {
    const Value& x = any_input(n, at);
    const OnnxTensor* positions = stored(n, 1 - at);
    if (!positions || positions->integer || positions->dims != std::vector<int64_t>{1, x.dims[0], x.dims[1]})
      throw Refusal{cat("it adds to the class token and patches something other than a stored position table [1, ", x.dims[0],
                        ", ", x.dims[1], "]; tandem's class_token adds one")};
    NodeSpec s = node_of(module_child(n, "class_token"), "class_token", {x.node});
    add_weight(s, "cls_token", *x.table);
    add_weight(s, "position_embeddings", *positions);
    out_.fused.push_back(cat(s.name, ": Expand, Concat, Add -> class_token"));
    emit(n, std::move(s), Form::Sequence, n.outputs.at(0), x.dims);
  }

  // Slice of a tensor: one axis, step 1, bounds computed at import -> tandem's slice (a packed
  // in-projection's query, key and value are slices of its features).
  void slice(const OnnxNode& n) {
    skip_refused(n);
    const Form f = form_of(n, 0);
    const Value& x = f == Form::SequenceTM || f == Form::Tensor ? any_input(n, 0) : input(n, 0);
    if (g_.opset < 10) throw Refusal{"Slice before opset 10 is not read; export at opset 13 or later"};
    if (n.inputs.size() < 3 || !folded(n, 1) || !folded(n, 2) || (n.inputs.size() > 3 && !n.inputs[3].empty() && !folded(n, 3)) ||
        (n.inputs.size() > 4 && !n.inputs[4].empty() && !folded(n, 4)))
      throw Refusal{"its bounds are computed from tensor values; tandem slices at bounds known at import"};
    const std::vector<int64_t> starts = plain_ints(n, 1), ends = plain_ints(n, 2);
    const std::vector<int64_t> axes = n.inputs.size() > 3 && !n.inputs[3].empty() ? plain_ints(n, 3) : std::vector<int64_t>{0};
    const std::vector<int64_t> steps = n.inputs.size() > 4 && !n.inputs[4].empty() ? plain_ints(n, 4) : std::vector<int64_t>{1};
    if (starts.size() != 1 || ends.size() != 1 || axes.size() != 1 || steps.size() != 1)
      throw Refusal{"it slices more than one axis at once; tandem's slice takes one"};
    if (steps[0] != 1) throw Refusal{cat("it slices with step ", steps[0], "; tandem's slice takes every element (step 1)")};
    if (x.dims.empty() || x.form == Form::Pooled || x.form == Form::FlatImage)
      throw Refusal{"it slices a tensor whose shape import does not know, or a flattened image"};
    // ONNX's axis over [N, ...] (SequenceTM: [T, N, F]) -> tandem's per-sample axis
    const int64_t rank = static_cast<int64_t>(x.dims.size()) + 1;
    const int64_t axis = axes[0] < 0 ? axes[0] + rank : axes[0];
    if (axis < 0 || axis >= rank) throw Refusal{cat("its axis ", axes[0], " is outside the tensor's ", rank)};
    const int64_t per_sample = x.form == Form::SequenceTM ? (axis == 0 ? 0 : axis == 2 ? 1 : -1) : axis - 1;
    if (per_sample < 0) throw Refusal{"it slices the batch; tandem keeps each sample whole"};
    const int64_t d = x.dims[static_cast<std::size_t>(per_sample)];
    const int64_t b = std::clamp(starts[0] < 0 ? std::max(starts[0], -d) + d : starts[0], int64_t{0}, d);
    const int64_t e = std::clamp(ends[0] < 0 ? std::max(ends[0], -d) + d : ends[0], int64_t{0}, d);
    if (b >= e) throw Refusal{cat("it slices nothing (", starts[0], " to ", ends[0], " of ", d, ")")};
    slice_into(n, x, per_sample, b, e, n.outputs.at(0));
  }
  // Elements [b, e) of x's per-sample axis `per_sample` as `output`: the tensor itself where
  // that is all of it, else a slice of the axis as stored.
  void slice_into(const OnnxNode& n, const Value& x, int64_t per_sample, int64_t b, int64_t e, const std::string& output) {
    if (b == 0 && e == x.dims[static_cast<std::size_t>(per_sample)]) {
      Value copy = x;
      values_[output] = std::move(copy);
      return;
    }
    const Value t = x.form == Form::SequenceTM ? x : as_tensor(x);  // an image's channels are its last axis stored
    int64_t stored_axis = per_sample;
    if (!t.order.empty())
      stored_axis = std::find(t.order.begin(), t.order.end(), static_cast<int>(per_sample)) - t.order.begin();
    NodeSpec s = node_of(functional_node_name(n), "slice", {x.node});
    s.slice = {stored_axis, b, e};
    Value v = t;
    v.node = add_node(n, std::move(s));
    v.dims[static_cast<std::size_t>(per_sample)] = e - b;
    values_[output] = x.form == Form::SequenceTM ? std::move(v) : settled_form(std::move(v));
  }

  // Add(sequence, a position table's rows 0..T-1): BERT's position embedding.
  void position_embedding(const OnnxNode& n, std::size_t at) {
    const Value& rows = any_input(n, at);
    const Value& x = form_of(n, 1 - at) == Form::WithTypes ? any_input(n, 1 - at) : input(n, 1 - at);
    if ((x.form != Form::Sequence && x.form != Form::WithTypes) || x.dims != rows.dims)
      throw Refusal{"it adds a position table's rows to something other than a sequence of as many tokens and features"};
    NodeSpec s = node_of(param_node_name(n, *rows.table), "position_embedding", {x.node});
    s.embedding.count = rows.table->dims[0];
    add_weight(s, "weight", *rows.table);
    if (x.form == Form::WithTypes) {  // one segment: the token-type table's row 0 too, under its own name
      s.embedding.types = x.table->dims[0];
      add_weight(s, "token_type_embeddings", *x.table);
    }
    // A model under Hugging Face's names without a token-type table: export writes none
    // (tandem's own BERT specs get HF's zero table, hugging_face_export_extras).
    const std::string suffix = "position_embeddings";
    if (x.form != Form::WithTypes && s.name.size() >= suffix.size() &&
        s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        !stored_.count(s.name.substr(0, s.name.size() - suffix.size()) + "token_type_embeddings.weight"))
      s.torch_names.emplace_back("token_type_embeddings", "");
    out_.fused.push_back(cat(s.name, x.form == Form::WithTypes ? ": Gather(token type 0) + Add, Gather(rows 0..T-1) + Add"
                                                               : ": Gather(rows 0..T-1) + Add", " -> position_embedding"));
    emit(n, std::move(s), Form::Sequence, n.outputs.at(0), x.dims);
  }

  // Add(words [N, T, F], a token-type table's row 0 at every token): Hugging Face's one
  // segment (token_type_ids left to its buffer of zeros), added to the position table's rows next.
  void token_types(const OnnxNode& n, std::size_t at) {
    const Value& row = any_input(n, at);
    const Value& x = input(n, 1 - at);
    if (x.form != Form::Sequence || x.dims != row.dims)
      throw Refusal{"it adds a token-type row to something other than a sequence of as many tokens and features"};
    // Added after the positions (LayoutLM adds it last): the row joins the position_embedding
    // that made this sum through nothing but layout_embeddings, each read by the next alone.
    if (NodeSpec* pos = additive_source(x.node, n.inputs[1 - at])) {
      pos->embedding.types = row.table->dims[0];
      std::erase(pos->torch_names, std::pair<std::string, std::string>{"token_type_embeddings", ""});
      add_weight(*pos, "token_type_embeddings", *row.table);
      out_.fused.push_back(cat(pos->name, ": Gather(token type 0) + Add -> position_embedding's token-type table"));
      values_[n.outputs.at(0)] = x;
      return;
    }
    Value v = x;
    v.table = row.table;
    as_step(n, std::move(v), Form::WithTypes, x.dims);
  }
  // The position_embedding without a token-type table whose output reaches tandem node `node`
  // (ONNX's `value`) through layout_embeddings only, nothing else reading any of them; or null.
  NodeSpec* additive_source(std::string node, const std::string& value) {
    auto index = [&](const std::string& name) {
      for (std::size_t i = 0; i < out_.spec.nodes.size(); ++i)
        if (out_.spec.nodes[i].name == name) return static_cast<int>(i);
      return -1;
    };
    auto read_once = [&](const std::string& name) {  // by one tandem node, or by `value`'s one reader
      int readers = 0;
      for (const NodeSpec& s : out_.spec.nodes)
        for (const std::string& in : s.inputs) readers += in == name;
      for (const auto& [onnx, v] : values_)
        if (v.node == name && v.form != Form::Unknown && (onnx == value ? uses_[onnx] != 1 : uses_[onnx] > 1)) return false;
      return readers <= 1;
    };
    if (uses_[value] != 1 || !read_once(node)) return nullptr;
    for (int i = index(node); i >= 0;) {
      NodeSpec& s = out_.spec.nodes[static_cast<std::size_t>(i)];
      if (s.op == "position_embedding") return s.embedding.types == 0 ? &s : nullptr;
      if (s.op != "layout_embedding" || s.inputs.empty() || !read_once(s.inputs[0])) return nullptr;
      i = index(s.inputs[0]);
    }
    return nullptr;
  }

  // ---- LayoutLM's 2-D positions ----

  // Gather(boxes [N, T, 4], k, axis 2): bbox[:, :, k], a coordinate of each token's box.
  void box_column(const OnnxNode& n, int64_t axis) {
    const Value& boxes = any_input(n, 0);
    const Folded* k = folded(n, 1);
    if ((axis != 2 && axis != -1) || !k || !k->dims.empty() || k->v.size() != 1 || k->v[0].p != 0 || k->v[0].unknown ||
        k->v[0].c < 0 || k->v[0].c > 3)
      throw Refusal{"it reads the boxes otherwise than one coordinate of every token's box (bbox[:, :, k], k in 0..3)"};
    Value v;
    v.form = Form::BoxColumn;
    v.node = v.boxes = boxes.node;
    v.part = static_cast<int>(k->v[0].c);
    v.dims = {boxes.dims.at(0)};
    values_[n.outputs.at(0)] = std::move(v);
  }
  // Sub(y1, y0) and Sub(x1, x0): a box's height and width (parts 4 and 5).
  void box_span(const OnnxNode& n) {
    if (form_of(n, 0) != Form::BoxColumn || form_of(n, 1) != Form::BoxColumn)
      throw Refusal{"it subtracts something else from a box coordinate; tandem takes y1 - y0 and x1 - x0 (LayoutLM's)"};
    const Value& hi = any_input(n, 0);
    const Value& lo = any_input(n, 1);
    Value v = hi;
    v.form = Form::BoxSpan;
    v.part = hi.part == 3 && lo.part == 1 ? 4 : hi.part == 2 && lo.part == 0 ? 5 : -1;
    if (v.part < 0 || hi.boxes != lo.boxes)
      throw Refusal{"it subtracts box coordinates otherwise than LayoutLM does (y1 - y0 for the height, x1 - x0 for the width)"};
    values_[n.outputs.at(0)] = std::move(v);
  }
  // Add(sequence, a box table's rows): one of LayoutLM's six; with all six, layout_embedding.
  void layout_add(const OnnxNode& n, std::size_t at) {
    static const char* const parts[] = {"x0", "y0", "x1", "y1", "height", "width"};
    const Value& rows = any_input(n, at);
    const Value& x = form_of(n, 1 - at) == Form::WithLayout ? any_input(n, 1 - at) : input(n, 1 - at);
    if ((x.form != Form::Sequence && x.form != Form::WithLayout) || x.dims != rows.dims)
      throw Refusal{"it adds a box table's rows to something other than a sequence of as many tokens and features"};
    Value v = x;
    if (x.form == Form::Sequence) v.layout = {}, v.boxes = rows.boxes;
    const auto k = static_cast<std::size_t>(rows.part);
    if (v.boxes != rows.boxes) throw Refusal{"it adds rows picked by two different box inputs"};
    if (v.layout[k]) throw Refusal{cat("it adds the box's ", parts[k], " embedding twice")};
    v.layout[k] = rows.table;
    const std::size_t twin = k < 4 ? (k + 2) % 4 : k;  // x0 and x1 read one x table, y0 and y1 one y table
    if (v.layout[twin] && v.layout[twin] != rows.table)
      throw Refusal{cat("its ", parts[k], " and ", parts[twin], " read different tables; LayoutLM's share one")};
    if (std::any_of(v.layout.begin(), v.layout.end(), [](const OnnxTensor* t) { return !t; })) {
      as_step(n, std::move(v), Form::WithLayout, x.dims);
      return;
    }
    const OnnxTensor* tables[4] = {v.layout[0], v.layout[1], v.layout[4], v.layout[5]};  // x, y, h, w
    for (const OnnxTensor* t : tables)
      if (t->dims != tables[0]->dims) throw Refusal{"its x, y, height and width tables differ in size; tandem's layout_embedding has one"};
    if (std::set<const OnnxTensor*>(std::begin(tables), std::end(tables)).size() != 4)
      throw Refusal{"its x, y, height and width tables are not four tables"};
    const std::string m = module_of(n.name);
    NodeSpec s = node_of(unique(m.empty() ? "layout_embedding" : m), "layout_embedding", {v.node, v.boxes});
    s.embedding.count = tables[0]->dims[0];
    add_weight(s, "x_position_embeddings.weight", *tables[0]);
    add_weight(s, "y_position_embeddings.weight", *tables[1]);
    add_weight(s, "h_position_embeddings.weight", *tables[2]);
    add_weight(s, "w_position_embeddings.weight", *tables[3]);
    out_.fused.push_back(cat(s.name, ": Gather(bbox[:, :, k]) x 4, Sub x 2, Gather x 6, Add x 6 -> layout_embedding"));
    emit(n, std::move(s), Form::Sequence, n.outputs.at(0), x.dims);
  }

  // MatMul(query heads [N, H, T, D], keys [N, H, D, T]): attention's scores.
  void attention_scores(const OnnxNode& n) {
    const Value& q = any_input(n, 0);
    const Value& k = any_input(n, 1);
    if (k.dims != std::vector<int64_t>{q.dims[0], q.dims[2], q.dims[1]})
      throw Refusal{"its query and keys differ in heads, tokens or head size"};
    Value v;
    v.form = Form::Scores;
    v.dims = q.dims;  // the query's [H, T, D]
    v.heads = q.heads;
    v.query = q.node;
    v.key = k.node;
    v.divisor = q.divisor * k.divisor;
    v.merged = q.merged;
    values_[n.outputs.at(0)] = v;
  }

  // Div or Mul of the scores by a constant: the 1/sqrt(D) scale (checked at the softmax); of
  // the query or the keys before their product (nn.MultiheadAttention scales the query).
  void scale_scores(const OnnxNode& n, std::size_t at, bool divide) {
    Value v = any_input(n, at);
    const OnnxTensor* c = constant(n, 1 - at);
    if (!one_value(c) || (divide && at != 0)) throw Refusal{"it scales attention scores by other than a constant"};
    const double by = *one_value(c);
    if (by == 0.0 || !std::isfinite(by)) throw Refusal{cat("it scales attention scores by ", by)};
    if (!v.mask.empty() || v.causal)
      throw Refusal{"it scales attention scores after a mask was added; tandem's attention scales, then masks"};
    v.divisor = divide ? v.divisor * by : v.divisor / by;
    values_[n.outputs.at(0)] = std::move(v);
  }

  // Add(scores, (1 - mask) * a large negative, as [N, 1, 1, T]): the key padding mask.
  void mask_scores(const OnnxNode& n, std::size_t at) {
    Value v = any_input(n, at);
    if (const std::optional<std::vector<int64_t>> c = causal_of(n, 1 - at)) {  // + attn_mask: causal
      const int64_t t = v.dims[1];
      std::vector<int64_t> lead(c->begin(), c->end() - 2);
      if (v.causal) throw Refusal{"it adds a second causal mask to attention scores"};
      if (c->back() != t || std::any_of(lead.begin(), lead.end(), [](int64_t d) { return d != 1; }) ||
          c->size() > (v.merged ? 3u : 4u))
        throw Refusal{cat("its causal mask is not [", t, ", ", t, "] (with leading axes of 1) over the scores' ", t, " tokens")};
      v.causal = true;
      values_[n.outputs.at(0)] = std::move(v);
      return;
    }
    if (form_of(n, 1 - at) != Form::Mask)
      throw Refusal{"it adds to attention scores something other than a key padding mask from a graph input or a causal "
                    "mask (0 on and below the diagonal, -inf above it)"};
    const Value& m = any_input(n, 1 - at);
    if (!v.mask.empty()) throw Refusal{"it adds a second mask to attention scores"};
    // (1 - keep) * c or padding * c with c far below any score (masked_fill's -inf included)
    if (!(m.mask_scale <= -1e4))
      throw Refusal{cat("it adds a mask computed otherwise than (1 - mask) * c or mask * c with c <= -1e4 (it is ",
                        m.inverted ? "(1 - mask)" : "mask", " * ", m.mask_scale,
                        "); tandem's attention takes a key padding mask, one value per key")};
    if (m.merged != v.merged || m.dims != std::vector<int64_t>{m.merged ? v.heads : 1, 1, v.dims[1]})
      throw Refusal{v.merged ? "its mask is not [batch * heads, 1, tokens] (a key_padding_mask expanded over the heads): one "
                               "per key, alike for every head and query (an attn_mask other than a causal one is not supported)"
                             : "its mask is not [batch, 1, 1, tokens]: one per key, alike for every head and query"};
    if (m.causal && v.causal) throw Refusal{"it adds a second causal mask to attention scores"};
    v.mask = m.node;
    v.mask_marks_padding = !m.inverted;
    v.causal = v.causal || m.causal;
    values_[n.outputs.at(0)] = std::move(v);
  }

  void softmax(const OnnxNode& n) {
    skip_refused(n);
    if (form_of(n, 0) != Form::Scores) return general_softmax(n);
    Value v = any_input(n, 0);
    const int64_t axis = int_attr(n, "axis", g_.opset >= 13 ? -1 : 1);
    if (axis != -1 && axis != (v.merged ? 2 : 3)) throw Refusal{"it normalizes attention scores over another axis than the keys"};
    const double want = std::sqrt(static_cast<double>(v.dims[2]));
    if (!(std::abs(v.divisor - want) <= 1e-5 * want))
      throw Refusal{cat("it scales attention scores by 1/", v.divisor, "; tandem's attention scales by 1/sqrt(head size) = 1/", want)};
    v.form = Form::Probs;
    values_[n.outputs.at(0)] = std::move(v);
  }

  // Softmax outside attention (scores written by hand): tandem's softmax over the last axis,
  // which a sequence and a vector store last too. The model's output is the loss's logits.
  void general_softmax(const OnnxNode& n) {
    for (const OnnxValue& o : g_.outputs)
      if (o.name == n.outputs.at(0)) throw Refusal{"a Softmax at the output; tandem's loss takes the logits (export them)"};
    const Value& in = any_input(n, 0);
    if (is_step(in.form)) input(n, 0);  // refused, naming the step
    if (in.form == Form::Pooled || in.form == Form::FlatImage || in.dims.empty())
      throw Refusal{"a Softmax over a flattened or pooled image, or a tensor whose shape import does not know"};
    Value x = as_tensor(in);
    const auto rank = static_cast<int64_t>(x.dims.size()) + 1;
    int64_t axis = int_attr(n, "axis", g_.opset >= 13 ? -1 : 1);
    if (axis < 0) axis += rank;
    if (axis != rank - 1 || (g_.opset < 13 && rank > 2))
      throw Refusal{cat("a Softmax over axis ", axis, " of ", rank, "; tandem's softmax normalizes the last axis")};
    if (x.order.back() != static_cast<int>(x.dims.size()) - 1) {  // the last axis stored last first (an image's columns)
      std::vector<int> want;
      for (int a : x.order)
        if (a != static_cast<int>(x.dims.size()) - 1) want.push_back(a);
      want.push_back(static_cast<int>(x.dims.size()) - 1);
      x = stored_as(n, x, want);
    }
    NodeSpec s = node_of(functional_node_name(n), "softmax", {x.node});
    x.node = add_node(n, std::move(s));
    values_[n.outputs.at(0)] = settled_form(std::move(x));
  }

  // Reciprocal (1 / x; torch writes c / x as Reciprocal, Mul) and Neg (0 - x): a binary with
  // the scalar first.
  void scalar_first(const OnnxNode& n, BinaryAttrs::Mode mode, float c) {
    skip_refused(n);
    if (is_step(any_input(n, 0).form)) input(n, 0);
    const Value& x = any_input(n, 0);
    if (x.form == Form::FlatImage)
      throw Refusal{"it computes on a flattened image, whose values tandem orders (h, w, c) and PyTorch (c, h, w)"};
    NodeSpec s = node_of(functional_node_name(n), "binary", {x.node});
    s.binary.mode = mode;
    s.binary.has_scalar = true;
    s.binary.scalar = c;
    s.binary.scalar_first = true;
    Value out = x;
    out.node = add_node(n, std::move(s));
    values_[n.outputs.at(0)] = std::move(out);
  }

  // MatMul(probabilities, value heads [N, H, T, D]): tandem's attention op.
  void attention(const OnnxNode& n) {
    const Value& p = any_input(n, 0);
    const Value& v = any_input(n, 1);
    if (v.dims != p.dims) throw Refusal{"its values differ from the query in heads, tokens or head size"};
    if (v.divisor != 1.0) throw Refusal{"it scales attention's values; tandem's attention scales the scores only"};
    const std::string m = module_of(n.name);  // the module is the attention (BertSelfAttention, nn.MultiheadAttention)
    NodeSpec s = node_of(unique(m.empty() ? own_name(n.name, n.op_type) : m), "attention", {p.query, p.key, v.node});
    s.attention.heads = p.heads;
    s.attention.causal = p.causal;
    if (!p.mask.empty()) {
      s.inputs.push_back(p.mask);
      InputSpec* in = graph_input(p.mask);
      if (!in) throw Refusal{"its mask is not a graph input"};
      if (id_inputs_.count(p.mask)) throw Refusal{cat("its mask '", p.mask, "' is read as token ids too")};
      if (in->mask && in->marks_padding != p.mask_marks_padding)
        throw Refusal{cat("it reads mask '", p.mask, "' with 1 marking ", p.mask_marks_padding ? "padding" : "a kept token",
                          " where another attention reads 1 as ", p.mask_marks_padding ? "a kept token" : "padding")};
      in->mask = true;
      in->marks_padding = p.mask_marks_padding;
      in->integer = false;
    }
    out_.fused.push_back(cat(s.name, ": Reshape, Transpose, MatMul, Div", p.mask.empty() ? "" : ", Add (mask)",
                             p.causal ? ", Add (causal mask)" : "",
                             ", Softmax, MatMul, Transpose, Reshape -> attention"));
    emit(n, std::move(s), Form::Context, n.outputs.at(0), p.dims);
    values_[n.outputs[0]].heads = p.heads;
    values_[n.outputs[0]].merged = p.merged;
  }

  // The key padding mask on its way to the scores: Unsqueeze, Cast, 1 - mask, times c, in
  // any order, from a graph input [batch, tokens].
  Value mask_of(const OnnxNode& n, std::size_t at) {
    if (form_of(n, at) == Form::Mask) return any_input(n, at);
    const Value& x = bool_inputs_.count(any_input(n, at).node) ? any_input(n, at) : input(n, at);
    if (!graph_input(x.node) || x.dims.size() != 1)
      throw Refusal{"tandem reads a key padding mask from a graph input [batch, tokens] only"};
    Value m;
    m.form = Form::Mask;
    m.node = x.node;
    m.dims = x.dims;
    return m;
  }
  void cast(const OnnxNode& n) {
    skip_refused(n);
    if (const OnnxTensor* c = constant(n, 0); c && c->integer && int_attr(n, "to", 0) == 1) {  // a number for the scores
      OnnxTensor& f = made_.emplace_back();
      f.name = n.outputs.at(0);
      f.dims = c->dims;
      for (int64_t v : c->ints) f.floats.push_back(static_cast<float>(v));
      consts_[f.name] = &f;
      return;
    }
    if (!mask_like(any_input(n, 0))) return general_cast(n);
    values_[n.outputs.at(0)] = mask_of(n, 0);
  }
  void unsqueeze(const OnnxNode& n) {
    skip_refused(n);
    if (const std::optional<std::vector<int64_t>> c = causal_of(n, 0)) {  // attn_mask.unsqueeze(0)
      std::vector<int64_t> dims = *c;
      const std::vector<int64_t> given = axes_given(n);
      if (given.empty()) throw Refusal{"it names no axes"};
      for (int64_t a : distinct_axes(given, dims.size() + given.size())) dims.insert(dims.begin() + a, 1);
      if (dims.size() > 4) throw Refusal{"it gives a causal mask more than 4 dimensions"};
      causal_[n.outputs.at(0)] = std::move(dims);
      return;
    }
    if (!mask_like(any_input(n, 0))) return general_unsqueeze(n);
    Value m = mask_of(n, 0);
    const std::vector<int64_t> given = axes_given(n);
    if (given.empty()) throw Refusal{"it names no axes"};
    for (int64_t a : distinct_axes(given, m.dims.size() + 1 + given.size())) {
      if (a == 0) throw Refusal{"it puts an axis before the batch"};
      m.dims.insert(m.dims.begin() + (a - 1), 1);
    }
    values_[n.outputs.at(0)] = std::move(m);
  }
  void sub(const OnnxNode& n) {
    skip_refused(n);
    if (form_of(n, 0) == Form::BoxColumn || form_of(n, 1) == Form::BoxColumn) return box_span(n);
    if (form_of(n, 1) != Form::Mask || !is_scalar(n, 0, 1.0)) return general_binary(n, BinaryAttrs::Mode::sub);
    Value m = any_input(n, 1);
    if (m.inverted || m.mask_scale != 1.0) throw Refusal{"it computes the mask otherwise than (1 - mask) * c"};
    m.inverted = true;
    values_[n.outputs.at(0)] = std::move(m);
  }
  // nn.MultiheadAttention's key_padding_mask: x.view(N, 1, 1, T), expanded over the heads,
  // .reshape(N H, 1, T): only its per-sample dims change (a graph input [batch, tokens] first).
  void reshape_mask(const OnnxNode& n) {
    if (int_attr(n, "allowzero", 0) != 0) throw Refusal{"allowzero=1 is not supported"};
    Value m = mask_of(n, 0);
    if (m.inverted || m.mask_scale != 1.0) throw Refusal{"it reshapes a key padding mask after computing on it"};
    const std::vector<int64_t> flat = {1, 1, m.dims.back()};
    if (!m.merged && m.dims == std::vector<int64_t>{m.dims.back()} && target_is(n, {{1, 1}, {1, 0}, {1, 0}, {m.dims.back(), 0}})) {
      m.dims = flat;
    } else if (!m.merged && m.dims.size() == 3 && m.dims[1] == 1 && m.dims[0] > 0 &&
               target_is(n, {{m.dims[0], 1}, {1, 0}, {m.dims[2], 0}})) {
      m.merged = true;  // [N, H, 1, T] -> [N H, 1, T]: dims stay [H, 1, T]
    } else {
      throw Refusal{"it reshapes a key padding mask otherwise than nn.MultiheadAttention does "
                    "(view(batch, 1, 1, tokens), then reshape(batch * heads, 1, tokens) after expanding over the heads)"};
    }
    values_[n.outputs.at(0)] = std::move(m);
  }
  // Expand([N, 1, 1, T] mask, [1 or -1, H, 1 or -1, 1 or -1]): the same mask for every head.
  void expand_mask(const OnnxNode& n) {
    Value m = any_input(n, 0);
    const Folded* shape = folded(n, 1);
    auto one = [](const Sym& s) { return s == Sym{1, 0} || s == Sym{-1, 0}; };
    if (m.merged || m.dims.size() != 3 || m.dims[0] != 1 || m.dims[1] != 1 || !shape || shape->v.size() != 4 ||
        !(one(shape->v[0]) || shape->v[0] == Sym{1, 1}) || shape->v[1].unknown || shape->v[1].p != 0 || shape->v[1].c < 1 ||
        !one(shape->v[2]) || !(one(shape->v[3]) || shape->v[3] == Sym{m.dims[2], 0}))
      throw Refusal{"it expands a key padding mask otherwise than over the heads (expand(-1, heads, -1, -1))"};
    m.dims[0] = shape->v[1].c;
    values_[n.outputs.at(0)] = std::move(m);
  }
  // ConstantOfShape of a float: zeros (masked_fill's other value); Where reads them.
  void constant_of_shape(const OnnxNode& n) {
    skip_refused(n);
    const OnnxAttribute* value = n.attribute("value");
    const Folded* shape = folded(n, 0);
    if (value && value->kind == OnnxAttribute::Kind::Tensor && value->t.integer && value->t.ints.size() == 1 && shape &&
        shape->dims.size() == 1 && !shape->v.empty() && shape->v[0] == Sym{1, 1}) {  // [batch, ...] of one integer
      Folded f;
      f.dims = {1};
      for (std::size_t k = 1; k < shape->v.size(); ++k) {
        if (shape->v[k].unknown || shape->v[k].p != 0 || shape->v[k].c < 1)
          throw Refusal{"it fills a shape whose dimensions past the batch are not known numbers"};
        f.dims.push_back(shape->v[k].c);
      }
      const int64_t count = count_of(f.dims);
      if (count > static_cast<int64_t>(kMaxFolded)) throw Refusal{cat("it computes a shape of more than ", kMaxFolded, " values")};
      f.v.assign(static_cast<std::size_t>(count), Sym{value->t.ints[0], 0});
      per_sample_[n.outputs.at(0)] = std::move(f);  // the same for every sample
      return;
    }
    if (!value || value->kind != OnnxAttribute::Kind::Tensor || value->t.integer || value->t.floats.size() != 1 || !shape ||
        shape->dims.size() != 1)
      throw Refusal{"tandem fills integer constants of a computed shape, and float ones for a masked_fill, only"};
    fills_[n.outputs.at(0)] = {value->t.floats[0], shape->v};
  }
  // Where(mask, c, zeros) = mask * c and Where(mask, zeros, c) = (1 - mask) * c: a boolean key
  // padding mask filled with -inf (F.multi_head_attention_forward's masked_fill).
  void where(const OnnxNode& n) {
    skip_refused(n);
    if (form_of(n, 1) == Form::Scores || form_of(n, 2) == Form::Scores) return causal_where(n);
    const auto cond = n.inputs.empty() ? values_.end() : values_.find(n.inputs[0]);
    if (cond == values_.end() || (cond->second.form != Form::Mask && !bool_inputs_.count(cond->second.node)))
      return general_where(n);
    Value m = mask_of(n, 0);
    if (m.inverted || m.mask_scale != 1.0) throw Refusal{"it selects by a key padding mask after computing on it"};
    auto zero = [&](std::size_t i) {
      const auto f = i < n.inputs.size() ? fills_.find(n.inputs[i]) : fills_.end();
      if (f == fills_.end()) return is_scalar(n, i, 0.0);
      const std::optional<std::vector<Sym>> mine = onnx_shape(n.inputs[0]);
      return f->second.value == 0.0 && mine && f->second.shape.size() == mine->size() &&
             std::equal(mine->begin(), mine->end(), f->second.shape.begin());
    };
    if (const std::optional<std::vector<int64_t>> causal = causal_of(n, 2)) {
      // attn_mask.masked_fill(key_padding_mask [N H, 1, T], -inf): both masks, added to the scores
      const std::optional<double> c = one_value(constant(n, 1));
      const std::vector<int64_t> lead(causal->begin(), causal->end() - 2);
      if (!c || !(*c <= -1e4) || causal->back() != m.dims.back() || (*causal)[causal->size() - 2] != m.dims.back() ||
          causal->size() > 3 || std::any_of(lead.begin(), lead.end(), [](int64_t d) { return d != 1; }))
        throw Refusal{"it fills a causal mask where a key padding mask holds with other than -inf (or c <= -1e4), or a "
                      "causal mask other than [1, T, T] over the mask's T tokens"};
      m.mask_scale = *c;
      m.causal = true;
      values_[n.outputs.at(0)] = std::move(m);
      return;
    }
    const bool fill_first = zero(2), fill_second = !fill_first && zero(1);
    const std::optional<double> c = one_value(constant(n, fill_first ? 1 : 2));
    if ((!fill_first && !fill_second) || !c)
      throw Refusal{"it selects by a key padding mask between other values than a constant and zeros of the mask's shape"};
    m.inverted = fill_second;  // Where(keep, 0, c) = (1 - keep) * c
    m.mask_scale = *c;
    values_[n.outputs.at(0)] = std::move(m);
  }



  // Where(cond, -inf, scores) or Where(cond, scores, -inf) with cond a constant [.., T, T]
  // (nanoGPT's att.masked_fill(self.bias[:, :, :T, :T] == 0, -inf)): attention's causal
  // when cond masks exactly the keys after each query.
  void causal_where(const OnnxNode& n) {
    const std::size_t at = form_of(n, 1) == Form::Scores ? 1 : 2;
    Value v = any_input(n, at);
    const OnnxTensor* cond = constant_or_derived(n, 0);
    const std::optional<double> fill = one_value(constant(n, 3 - at));
    if (!cond || !fill || !(*fill <= -1e4))
      throw Refusal{"it selects attention scores otherwise than filling -inf (or c <= -1e4) where a constant causal "
                    "condition holds (masked_fill(mask == 0, -inf))"};
    const int64_t t = v.dims[1];
    const std::size_t rank = cond->dims.size();
    bool causal = rank >= 2 && rank <= (v.merged ? 3u : 4u) && cond->dims[rank - 1] == t && cond->dims[rank - 2] == t;
    for (std::size_t a = 0; causal && a + 2 < rank; ++a) causal = cond->dims[a] == 1;
    const bool masked_when_true = at == 2;  // Where(cond, -inf, scores): true masks
    for (int64_t r = 0; causal && r < t; ++r)
      for (int64_t c = 0; causal && c < t; ++c) {
        const auto i = static_cast<std::size_t>(r * t + c);
        const double x = cond->integer ? (i < cond->ints.size() ? static_cast<double>(cond->ints[i]) : NAN)
                                       : (i < cond->floats.size() ? cond->floats[i] : NAN);
        if (std::isnan(x)) causal = false;
        else causal = ((x != 0.0) == masked_when_true) == (c > r);
      }
    if (!causal)
      throw Refusal{cat("its condition is not a causal mask over the scores' ", t, " tokens (the keys after each query "
                        "masked); tandem's attention takes a causal mask and a key padding mask")};
    if (v.causal) throw Refusal{"it adds a second causal mask to attention scores"};
    v.causal = true;
    values_[n.outputs.at(0)] = std::move(v);
  }
  // Split of a computed tensor along a per-sample axis (nanoGPT's q, k, v = qkv.split(C, 2)):
  // one slice per output.
  void split(const OnnxNode& n) {
    skip_refused(n);
    const Value& x = input(n, 0);
    if (x.dims.empty() || x.form == Form::Pooled || x.form == Form::FlatImage)
      throw Refusal{"it splits a tensor whose shape import does not know, or a flattened image"};
    const int64_t rank = static_cast<int64_t>(x.dims.size()) + 1;
    int64_t axis = int_attr(n, "axis", 0);
    if (axis < -rank || axis >= rank) throw Refusal{cat("its axis ", axis, " is outside the tensor's ", rank)};
    if (axis < 0) axis += rank;
    if (axis == 0) throw Refusal{"it splits the batch; tandem keeps each sample whole"};
    const int64_t d = x.dims[static_cast<std::size_t>(axis - 1)];
    std::vector<int64_t> sizes;
    if (g_.opset >= 13 && n.inputs.size() > 1 && !n.inputs[1].empty()) {
      if (!folded(n, 1)) throw Refusal{"its sizes are computed from tensor values; tandem splits at sizes known at import"};
      sizes = plain_ints(n, 1);
    } else if (g_.opset < 13) {
      sizes = ints_attr(n, "split", {});
    }
    if (sizes.empty()) {  // equal parts, one an output
      const auto parts = static_cast<int64_t>(n.outputs.size());
      if (parts < 1 || d % parts != 0) throw Refusal{cat("it splits ", d, " into ", parts, " equal parts")};
      sizes.assign(static_cast<std::size_t>(parts), d / parts);
    }
    if (sizes.size() != n.outputs.size()) throw Refusal{cat("it gives ", sizes.size(), " sizes for ", n.outputs.size(), " outputs")};
    int64_t start = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      if (sizes[k] < 1 || sizes[k] > d - start) throw Refusal{cat("its sizes do not split the axis's ", d)};
      slice_into(n, x, axis - 1, start, start + sizes[k], n.outputs[k]);
      start += sizes[k];
    }
    if (start != d) throw Refusal{cat("its sizes add up to ", start, ", not the axis's ", d)};
  }
  // Arithmetic on constants (nanoGPT's 1 / sqrt(k.size(-1)) as Cast, Pow, Reciprocal, Mul; a
  // causal buffer sliced to the tokens and compared with 0): done at import, a constant.
  bool fold_floats(const OnnxNode& n) {
    static const std::set<std::string> ops = {"Cast", "Pow", "Reciprocal", "Sqrt", "Neg", "Add", "Sub", "Mul", "Div", "Equal", "Slice"};
    if (!ops.count(n.op_type) || n.outputs.empty() || n.outputs[0].empty() || n.inputs.empty()) return false;
    bool from_stored = false;
    for (const std::string& in : n.inputs) {
      if (in.empty()) continue;
      if (!consts_.count(in) && !folded_.count(in) && !derived_.count(in)) return false;
      // a stored float may be a trained parameter (torch's own "onnx::MatMul_7" ones too); integers never are
      from_stored = from_stored || derived_.count(in) || (stored_.count(in) && !stored_.at(in)->integer);
    }
    if (from_stored && n.op_type != "Slice" && n.op_type != "Equal" && n.op_type != "Cast")
      return false;  // a weight in arithmetic: the handlers' (a trained operand, or refused)
    auto numbers = [&](std::size_t i, std::vector<int64_t>& dims) {  // a constant's values, or folded plain integers
      std::vector<double> v;
      if (const OnnxTensor* k = constant_or_derived(n, i)) {
        const std::size_t count = k->integer ? k->ints.size() : k->floats.size();
        if (static_cast<int64_t>(count) != k->count()) throw Refusal{cat("input ", i, " holds fewer values than its shape")};
        dims = k->dims;
        for (std::size_t j = 0; j < count; ++j) v.push_back(k->integer ? static_cast<double>(k->ints[j]) : k->floats[j]);
      } else {
        for (int64_t x : plain_ints(n, i)) v.push_back(static_cast<double>(x));
        dims = folded(n, i)->dims;
      }
      return v;
    };
    const OnnxTensor* first = constant_or_derived(n, 0);
    const bool floats_in = first && !first->integer;
    const bool to_float = n.op_type == "Cast" && int_attr(n, "to", 0) == 1;
    const bool to_bool = n.op_type == "Cast" && int_attr(n, "to", 0) == 9 && first;  // a mask's == 0, cast (0/1 floats)
    if (!floats_in && !to_float && !to_bool) return false;  // integers: shapes' arithmetic (fold) or the handlers'
    if (n.op_type == "Cast" && !to_float && !to_bool) return false;
    if (first && first->count() > (int64_t{1} << 20)) throw Refusal{"it computes on a constant of more than 2^20 values"};
    OnnxTensor& out = made_.emplace_back();
    out.name = n.outputs[0];
    std::vector<int64_t> da;
    const std::vector<double> a = numbers(0, da);
    if (n.op_type == "Slice") {
      if (n.inputs.size() < 3 || g_.opset < 10) throw Refusal{"it slices a constant without starts and ends"};
      const std::vector<int64_t> starts = plain_ints(n, 1), ends = plain_ints(n, 2);
      std::vector<int64_t> axes, steps;
      if (n.inputs.size() > 3 && !n.inputs[3].empty()) axes = plain_ints(n, 3);
      else for (std::size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<int64_t>(k));
      if (n.inputs.size() > 4 && !n.inputs[4].empty()) steps = plain_ints(n, 4);
      else steps.assign(starts.size(), 1);
      if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
        throw Refusal{"its starts, ends, axes and steps differ in length"};
      std::vector<int64_t> lo(da.size(), 0), hi = da;
      for (std::size_t k = 0; k < axes.size(); ++k) {
        const int64_t ax = axis_in(axes[k], da.size()), dd = da[static_cast<std::size_t>(ax)];
        if (steps[k] != 1) throw Refusal{"it slices a constant with a step other than 1"};
        lo[static_cast<std::size_t>(ax)] = std::clamp(starts[k] < 0 ? std::max(starts[k], -dd) + dd : starts[k], int64_t{0}, dd);
        hi[static_cast<std::size_t>(ax)] = std::clamp(ends[k] < 0 ? std::max(ends[k], -dd) + dd : ends[k], int64_t{0}, dd);
      }
      for (std::size_t k = 0; k < da.size(); ++k) out.dims.push_back(std::max<int64_t>(0, hi[k] - lo[k]));
      const int64_t total = count_of(out.dims);
      std::vector<int64_t> at(da.size(), 0);
      for (int64_t j = 0; j < total; ++j) {
        int64_t src = 0;
        for (std::size_t k = 0; k < da.size(); ++k) src = src * da[k] + lo[k] + at[k];
        out.floats.push_back(static_cast<float>(a[static_cast<std::size_t>(src)]));
        for (std::size_t k = da.size(); k-- > 0;) {
          if (++at[k] < out.dims[k]) break;
          at[k] = 0;
        }
      }
    } else if (n.op_type == "Cast" || n.op_type == "Reciprocal" || n.op_type == "Sqrt" || n.op_type == "Neg") {
      out.dims = da;
      for (double x : a)
        out.floats.push_back(static_cast<float>(n.op_type == "Reciprocal" ? 1.0 / x : n.op_type == "Sqrt" ? std::sqrt(x)
                                                : n.op_type == "Neg" ? -x : to_bool ? (x != 0.0 ? 1.0 : 0.0) : x));
    } else {  // two inputs: of one shape, or one of them a single value
      if (n.inputs.size() != 2 || n.inputs[1].empty()) throw Refusal{"it lacks its second input"};
      std::vector<int64_t> db;
      const std::vector<double> b = numbers(1, db);
      if (a.empty() || b.empty()) throw Refusal{"it computes on an empty constant"};
      if ((a.size() != b.size() && a.size() != 1 && b.size() != 1) || (a.size() == b.size() && a.size() > 1 && da != db))
        throw Refusal{"it computes on constants of different shapes"};
      out.dims = a.size() >= b.size() ? da : db;
      if (a.size() == b.size() && da.size() != db.size()) out.dims = da.size() > db.size() ? da : db;
      for (std::size_t j = 0; j < std::max(a.size(), b.size()); ++j) {
        const double x = a[a.size() == 1 ? 0 : j], y = b[b.size() == 1 ? 0 : j];
        const std::string& op = n.op_type;
        out.floats.push_back(static_cast<float>(op == "Add" ? x + y : op == "Sub" ? x - y : op == "Mul" ? x * y
                                                : op == "Div" ? x / y : op == "Pow" ? std::pow(x, y) : (x == y ? 1.0 : 0.0)));
      }
    }
    (from_stored ? derived_ : consts_)[out.name] = &out;
    return true;
  }
  const OnnxTensor* constant_or_derived(const OnnxNode& n, std::size_t i) const {
    if (const OnnxTensor* k = constant(n, i)) return k;
    if (i >= n.inputs.size() || n.inputs[i].empty()) return nullptr;
    const auto it = derived_.find(n.inputs[i]);
    return it == derived_.end() ? nullptr : it->second;
  }

  // ---- causal masks (nn.Transformer.generate_square_subsequent_mask, an attn_mask) ----

  // Input i as a causal mask: one made so far, or a stored constant [.., T, T] of 0 on and below
  // the diagonal and c <= -1e4 above it; nullopt otherwise.
  std::optional<std::vector<int64_t>> causal_of(const OnnxNode& n, std::size_t i) const {
    if (i >= n.inputs.size() || n.inputs[i].empty()) return std::nullopt;
    if (const auto it = causal_.find(n.inputs[i]); it != causal_.end()) return it->second;
    const OnnxTensor* k = constant_or_derived(n, i);
    if (!k || k->integer || k->dims.size() < 2 || k->dims.size() > 4) return std::nullopt;
    const int64_t t = k->dims.back();
    for (std::size_t a = 0; a + 2 < k->dims.size(); ++a)
      if (k->dims[a] != 1) return std::nullopt;
    if (t < 2 || t > 4096 || k->dims[k->dims.size() - 2] != t || static_cast<int64_t>(k->floats.size()) != t * t)
      return std::nullopt;
    for (int64_t r = 0; r < t; ++r)
      for (int64_t c = 0; c < t; ++c) {
        const float v = k->floats[static_cast<std::size_t>(r * t + c)];
        if (c > r ? !(v <= -1e4f) : v != 0.0f) return std::nullopt;
      }
    return k->dims;
  }
  // Trilu(upper=1, k=1) of a square filled with -inf (or c <= -1e4): a causal mask.
  void trilu(const OnnxNode& n) {
    skip_refused(n);
    const auto f = n.inputs.empty() ? fills_.end() : fills_.find(n.inputs[0]);
    const bool one_above = n.inputs.size() > 1 && !n.inputs[1].empty() && folded(n, 1) && plain_ints(n, 1) == std::vector<int64_t>{1};
    const bool square = f != fills_.end() && f->second.shape.size() == 2 && f->second.shape[0] == f->second.shape[1] &&
                        !f->second.shape[0].unknown && f->second.shape[0].p == 0 && f->second.shape[0].c >= 1;
    if (!square || int_attr(n, "upper", 1) != 1 || !one_above || !(f->second.value <= -1e4))
      throw Refusal{"tandem takes Trilu only as a causal mask: the part above the diagonal (upper=1, k=1) of a square "
                    "filled with -inf or c <= -1e4 (nn.Transformer.generate_square_subsequent_mask)"};
    const int64_t t = f->second.shape[0].c;
    causal_[n.outputs.at(0)] = {t, t};
  }

  // ---- comparisons, selections and repeats no pattern takes: binary's comparisons, where, expand ----

  // A graph input [batch, tokens] or the mask's chain: what the key padding mask's handlers
  // (Cast, Unsqueeze) take; any other tensor is the general ops'.
  bool mask_like(const Value& v) {
    return v.form == Form::Mask || ((graph_input(v.node) || bool_inputs_.count(v.node)) && v.dims.size() == 1);
  }
  static BinaryAttrs::Mode mirrored(BinaryAttrs::Mode m) {  // a op b as b op' a
    using M = BinaryAttrs::Mode;
    switch (m) {
      case M::less: return M::greater;
      case M::greater: return M::less;
      case M::less_equal: return M::greater_equal;
      case M::greater_equal: return M::less_equal;
      default: return m;
    }
  }
  // Equal, Less, Greater, LessOrEqual, GreaterOrEqual of computed tensors (or one and a
  // constant): binary's comparison, 0/1 floats (ONNX's bool) that where, And, Or and Not read.
  void compare(const OnnxNode& n, BinaryAttrs::Mode mode) {
    skip_refused(n);
    general_binary(n, mode);
    bools_.insert(n.outputs.at(0));
  }
  // A computed boolean (a comparison's 0/1), or refused naming what it is.
  void boolean(const OnnxNode& n, std::size_t i) const {
    if (i >= n.inputs.size() || !bools_.count(n.inputs[i]))
      throw Refusal{cat("its input ", i, " is not a comparison's result; tandem computes logic on comparisons of tensors only")};
  }
  // Not(c) = (c == 0); And(a, b) = a * b; Xor(a, b) = (a != b); Or(a, b) = (a + b > 0).
  void logical_not(const OnnxNode& n) {
    skip_refused(n);
    boolean(n, 0);
    emit_scalar_binary(n, input_tensor(n, 0), BinaryAttrs::Mode::equal, 0.0f, n.outputs.at(0));
    bools_.insert(n.outputs.at(0));
  }
  void logical(const OnnxNode& n, BinaryAttrs::Mode mode) {
    skip_refused(n);
    boolean(n, 0);
    boolean(n, 1);
    general_binary(n, mode);
    bools_.insert(n.outputs.at(0));
  }
  void logical_and(const OnnxNode& n) { logical(n, BinaryAttrs::Mode::mul); }
  void logical_or(const OnnxNode& n) {
    logical(n, BinaryAttrs::Mode::add);  // a + b in {0, 1, 2}, then > 0
    const Value sum = values_.at(n.outputs.at(0));
    emit_scalar_binary(n, sum, BinaryAttrs::Mode::greater, 0.0f, n.outputs.at(0));
  }
  // Input i as a general tensor (a comparison's, a plain one's).
  Value input_tensor(const OnnxNode& n, std::size_t i) { return operand(n, i, "computes on"); }
  // binary(x, scalar) for `n` into `output`, in x's shape and order.
  void emit_scalar_binary(const OnnxNode& n, const Value& x, BinaryAttrs::Mode mode, float scalar, const std::string& output) {
    NodeSpec s = node_of(functional_node_name(n), "binary", {x.node});
    s.binary.mode = mode;
    s.binary.has_scalar = true;
    s.binary.scalar = scalar;
    Value out = as_tensor(x);
    out.node = add_node(n, std::move(s));
    values_[output] = settled_form(std::move(out));
  }
  // Cast of a computed tensor: to a float type, as it is (a comparison's 0/1 become numbers);
  // to bool, x != 0 (a comparison's as it is); to an integer type, a comparison's only (other
  // floats would be truncated, which tandem does not compute).
  void general_cast(const OnnxNode& n) {
    const int64_t to = int_attr(n, "to", 0);
    const bool boolean_in = bools_.count(n.inputs.at(0)) > 0;
    const Value& x = any_input(n, 0);
    if (to == 1 || to == 10 || to == 11 || to == 16) {  // float, float16, double, bfloat16: tandem's floats
      if (boolean_in) return alias(n, x, x.form);
      if (const InputSpec* in = graph_input(x.node); in && in->integer)
        throw Refusal{cat("it reads the integer input '", x.node, "' as numbers; tandem reads integer inputs as token ids, "
                          "masks and boxes")};
      return alias(n, input(n, 0), x.form);
    }
    if (to == 9) {  // bool
      if (boolean_in) {
        alias(n, x, x.form);
        bools_.insert(n.outputs[0]);
        return;
      }
      emit_scalar_binary(n, input_tensor(n, 0), BinaryAttrs::Mode::not_equal, 0.0f, n.outputs.at(0));
      bools_.insert(n.outputs.at(0));
      return;
    }
    if (boolean_in && (to == 2 || to == 3 || to == 4 || to == 5 || to == 6 || to == 7 || to == 12 || to == 13)) {
      alias(n, x, x.form);
      bools_.insert(n.outputs[0]);
      return;
    }
    throw Refusal{cat("it casts a computed tensor to ONNX type ", to, "; tandem computes on floats and casts comparisons' "
                      "results (0/1) only")};
  }
  // Where(cond, a, b) of computed tensors (cond a comparison's, or any: nonzero picks a), a or
  // b a constant scalar (masked_fill's value, -inf too): tandem's where, the three stored in
  // one order, broadcast as ONNX does (aligned on the last axis; each operand as many
  // dimensions, so the batch lines up).
  void general_where(const OnnxNode& n) {
    if (constant(n, 0) || folded(n, 0))
      throw Refusal{"its condition is a constant of the graph; tandem selects by a condition computed from the batch "
                    "(a comparison of tensors)"};
    if (n.inputs.size() != 3) throw Refusal{cat("it has ", n.inputs.size(), " inputs (Where takes 3)")};
    WhereAttrs w;
    std::vector<Value> t{operand(n, 0, "selects by")};
    for (std::size_t i = 1; i < 3; ++i) {
      if (const OnnxTensor* k = constant(n, i)) {
        const std::optional<double> v = one_value(k);
        if (v && k->dims.size() > t[0].dims.size() + 1)
          throw Refusal{cat("it selects a constant of ", k->dims.size(), " dimensions, more than the condition's ",
                            t[0].dims.size() + 1, " (its output would gain axes before the batch)")};
        if (!v)
          throw Refusal{cat("it selects from a constant of ", k->count(), " values; tandem selects a constant scalar or a "
                            "computed tensor")};
        if (std::isnan(*v)) throw Refusal{"it selects NaN; tandem's where takes numbers and infinities"};
        (i == 1 ? w.a : w.b) = static_cast<float>(*v);
      } else {
        t.push_back(operand(n, i, "selects"));
      }
    }
    std::vector<int64_t> dims = t[0].dims;
    for (std::size_t k = 1; k < t.size(); ++k) {
      if (t[k].dims.size() != dims.size())
        throw Refusal{cat("it selects among tensors of ", dims.size() + 1, " and ", t[k].dims.size() + 1,
                          " dimensions; broadcast, their batch axes would not line up")};
      for (std::size_t a = 0; a < dims.size(); ++a) {
        const int64_t x = dims[a], y = t[k].dims[a];
        if (x != y && x != 1 && y != 1) throw Refusal{cat("its operands' axis ", a + 1, " is ", x, " and ", y, "; they do not broadcast")};
        dims[a] = std::max(x, y);
      }
    }
    std::vector<int> order = t[0].order;  // the order of an operand as large as the output
    for (const Value& v : t)
      if (v.dims == dims) {
        order = v.order;
        break;
      }
    std::vector<std::string> inputs;
    for (const Value& v : t) inputs.push_back(stored_as(n, v, order).node);
    NodeSpec s = node_of(functional_node_name(n), "where", inputs);
    s.where = w;
    emit_general(n, std::move(s), t[0], std::move(dims), std::move(order));
  }
  // Expand(computed x, shape known at import): tandem's expand in x's stored order, the batch
  // axis kept (1, -1 or the batch), each other axis x's or, where x has 1, any size.
  void general_expand(const OnnxNode& n) {
    Value x = operand(n, 0, "expands");
    const Folded* shape = folded(n, 1);
    if (!shape) throw Refusal{"its shape is computed from tensor values; tandem expands to shapes known at import"};
    const std::size_t rank = x.dims.size() + 1;
    if (shape->dims.size() != 1 || shape->v.size() != rank)
      throw Refusal{cat("it expands a tensor of ", rank, " dimensions to ", shape->v.size(), "; tandem keeps the batch first (a "
                        "shape of as many dimensions)")};
    if (!(shape->v[0] == Sym{1, 1} || shape->v[0] == Sym{1, 0} || shape->v[0] == Sym{-1, 0}))
      throw Refusal{"it expands the batch axis; tandem keeps each sample's values apart"};
    std::vector<int64_t> dims = x.dims;
    for (std::size_t k = 1; k < rank; ++k) {
      const Sym& v = shape->v[k];
      if (v.unknown || (v.p != 0 && v.c != 0)) throw Refusal{cat("its shape's axis ", k, " is computed from the batch")};
      const int64_t want = v.c == -1 ? 1 : v.c, have = x.dims[k - 1];
      if (want < 1) throw Refusal{cat("its shape's axis ", k, " is ", v.c)};
      if (want != have && want != 1 && have != 1)
        throw Refusal{cat("it expands axis ", k, " of ", have, " to ", want, "; only an axis of 1 repeats")};
      dims[k - 1] = std::max(want, have);
    }
    if (dims == x.dims) return alias(n, any_input(n, 0), any_input(n, 0).form);
    NodeSpec s = node_of(functional_node_name(n), "expand", {x.node});
    for (int a : x.order) s.expand.push_back(dims[static_cast<std::size_t>(a)]);
    x.node = add_node(n, std::move(s));
    x.dims = dims;
    values_[n.outputs.at(0)] = settled_form(std::move(x));
  }
  // Unsqueeze and Squeeze of a computed tensor: views (an axis of 1 added or taken away).
  void general_unsqueeze(const OnnxNode& n) {
    const Value& in = any_input(n, 0);
    const Value x = operand(n, 0, "unsqueezes");
    const std::vector<int64_t> given = axes_given(n);
    if (given.empty()) throw Refusal{"it names no axes"};
    std::vector<int64_t> to = x.dims;
    for (int64_t a : distinct_axes(given, x.dims.size() + 1 + given.size())) {
      if (a == 0) throw Refusal{"it puts an axis before the batch"};
      to.insert(to.begin() + (a - 1), 1);
    }
    if (static_cast<int>(to.size()) >= kMaxRank)
      throw Refusal{cat("it makes a sample of ", to.size(), " dimensions; tandem's tensors hold 1 to ", kMaxRank - 1)};
    general_reshape(n, in, &to);
  }
  void squeeze(const OnnxNode& n) {
    skip_refused(n);
    const Value& in = any_input(n, 0);
    const Value x = operand(n, 0, "squeezes");
    std::vector<int64_t> axes = axes_given(n);
    const std::size_t rank = x.dims.size() + 1;
    if (axes.empty())
      for (std::size_t a = 0; a < x.dims.size(); ++a)
        if (x.dims[a] == 1) axes.push_back(static_cast<int64_t>(a + 1));
    std::vector<int64_t> to = x.dims;
    axes = distinct_axes(axes, rank);
    for (std::size_t k = axes.size(); k-- > 0;) {
      if (axes[k] == 0) throw Refusal{"it squeezes the batch axis; tandem keeps each sample's values apart"};
      if (x.dims[static_cast<std::size_t>(axes[k] - 1)] != 1) throw Refusal{cat("it squeezes axis ", axes[k], ", which is not 1")};
      to.erase(to.begin() + (axes[k] - 1));
    }
    if (to.empty()) throw Refusal{"it squeezes a sample to one number; tandem keeps at least one axis"};
    general_reshape(n, in, &to);
  }
  void mask_step(const OnnxNode& n, std::size_t at) {  // Mul(mask, c)
    Value m = any_input(n, at);
    const OnnxTensor* c = constant(n, 1 - at);
    if (!one_value(c)) throw Refusal{"it multiplies the mask by other than a constant"};
    if (!std::isfinite(*one_value(c))) throw Refusal{cat("it multiplies the mask by ", *one_value(c), " (0 padding times that is NaN)")};
    m.mask_scale *= *one_value(c);
    values_[n.outputs.at(0)] = std::move(m);
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
      {"HardSigmoid", &I::hard_sigmoid},
      {"Clip", &I::clip},
      {"MaxPool", [](I& i, const OnnxNode& n) { i.pool(n, "max_pool2d"); }},
      {"AveragePool", [](I& i, const OnnxNode& n) { i.pool(n, "avg_pool2d"); }},
      {"GlobalAveragePool", &I::global_avg_pool},
      {"ReduceMean", &I::reduce_mean},
      {"ReduceSum", [](I& i, const OnnxNode& n) { i.general_reduce(n, ReduceAttrs::Mode::sum); }},
      {"ReduceMax", [](I& i, const OnnxNode& n) { i.general_reduce(n, ReduceAttrs::Mode::max); }},
      {"ReduceMin", [](I& i, const OnnxNode& n) { i.general_reduce(n, ReduceAttrs::Mode::min); }},
      {"GlobalMaxPool", &I::global_max_pool},
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
      {"Gather", &I::gather},
      {"Softmax", &I::softmax},
      {"Reciprocal", [](I& i, const OnnxNode& n) { i.scalar_first(n, BinaryAttrs::Mode::div, 1.0f); }},
      {"Neg", [](I& i, const OnnxNode& n) { i.scalar_first(n, BinaryAttrs::Mode::sub, 0.0f); }},
      {"Cast", &I::cast},
      {"Unsqueeze", &I::unsqueeze},
      {"Sub", &I::sub},
      {"Shape", [](I& i, const OnnxNode& n) {
         i.skip_refused(n);
         throw Refusal{"it reads the shape of a tensor whose shape import does not track"};
       }},
      {"Squeeze", &I::squeeze},
      {"Slice", &I::slice},
      {"ConstantOfShape", &I::constant_of_shape},
      {"Equal", [](I& i, const OnnxNode& n) { i.compare(n, BinaryAttrs::Mode::equal); }},
      {"Less", [](I& i, const OnnxNode& n) { i.compare(n, BinaryAttrs::Mode::less); }},
      {"Greater", [](I& i, const OnnxNode& n) { i.compare(n, BinaryAttrs::Mode::greater); }},
      {"LessOrEqual", [](I& i, const OnnxNode& n) { i.compare(n, BinaryAttrs::Mode::less_equal); }},
      {"GreaterOrEqual", [](I& i, const OnnxNode& n) { i.compare(n, BinaryAttrs::Mode::greater_equal); }},
      {"Not", &I::logical_not},
      {"And", &I::logical_and},
      {"Or", &I::logical_or},
      {"Xor", [](I& i, const OnnxNode& n) { i.logical(n, BinaryAttrs::Mode::not_equal); }},
      {"Where", &I::where},
      {"Expand", &I::expand},
      {"Pad", &I::pad},
      {"Trilu", &I::trilu},
      {"Split", &I::split},
      {"Range", [](I& i, const OnnxNode& n) {
         i.skip_refused(n);
         throw Refusal{"tandem computes ranges of numbers known at import only (torch.arange over a tensor's size)"};
       }},
      {"Pow", [](I& i, const OnnxNode& n) {
         i.skip_refused(n);
         throw Refusal{"tandem raises constants to a power, and squares within LayerNorm's pattern, only"};
       }},
      {"Sqrt", [](I& i, const OnnxNode& n) {
         i.skip_refused(n);
         throw Refusal{"tandem takes square roots of constants, and within LayerNorm's pattern, only"};
       }},
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
