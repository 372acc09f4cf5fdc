// The embedding tables of a transformer's input, as Hugging Face's BERT, LayoutLM and ViT hold
// them: `embedding` (token ids -> vectors, torch.nn.Embedding), `position_embedding` (row t of
// a table added to token t), `layout_embedding` (LayoutLM's 2-D position: the x, y, height
// and width tables of each token's box [x0, y0, x1, y1] added) and `class_token` (ViT's: a
// learned [CLS] vector put before the patches, and a position embedding added to each). Ids and coordinates are
// integers carried in f32 tensors (exact below 2^24); a bad one stops the forward with an
// Error naming the node. Layers: embedding_layers.cpp.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

// Reads `embedding: { count, features }`; `features` only where the op is told it (token ids
// have none), else it follows the input.
std::function<void(const spec::Node&, NodeSpec&, const std::string&)> parse(const char* op, bool needs_features) {
  return [op, needs_features](const spec::Node& node, NodeSpec& out, const std::string& label) {
    const auto* a = node.embedding();
    if (!a) ops::fail_attr(label, op, "missing field 'embedding'");
    if (a->count() <= 0) ops::fail_attr(label, op, cat("field 'embedding.count' must be > 0, got ", a->count()));
    if (needs_features && a->features() <= 0)
      ops::fail_attr(label, op, cat("field 'embedding.features' must be > 0, got ", a->features()));
    if (a->types() < 0 || (a->types() > 0 && std::string_view(op) != "position_embedding"))
      ops::fail_attr(label, op, cat("field 'embedding.types' (a token-type table) belongs on position_embedding, ",
                                    "at least 1, got ", a->types()));
    out.embedding = {a->count(), a->features(), a->types()};
  };
}

// An input [tokens, features] whose tokens fit the table.
void expect_sequence(const NodeSpec& n, const Shape& x) {
  if (x.rank() != 2) ops::fail_node(n, cat("expects a sequence [tokens, features] per sample, got ", x.str()));
  if (x[0] > n.embedding.count)
    ops::fail_node(n, cat(x[0], " tokens exceed the table's ", n.embedding.count, " positions (field 'embedding.count')"));
}

OpDef token_embedding() {
  OpDef d;
  d.name = "embedding";
  d.sequence = SequenceLength::Follows;
  d.parse = parse("embedding", true);
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 0);
    if (in[0].rank() >= kMaxRank - 1) ops::fail_node(n, cat("ids of rank ", in[0].rank(), " are too many dimensions"));
    int64_t dims[kMaxRank] = {};
    for (int i = 0; i < in[0].rank(); ++i) dims[i] = in[0][i];
    dims[in[0].rank()] = n.embedding.features;
    return Shape::of(dims, in[0].rank() + 1);
  };
  // A row copied forward; its gradient added into the table backward (1 a value).
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape& out) {
    OpCost c;
    c.backward_weights_flops = ops::count(out);
    return c;
  };
  d.params = [](const NodeSpec& n, std::span<const Shape>) {
    return std::vector<ParamSpec>{{"weight", Shape{n.embedding.count, n.embedding.features}}};
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend&, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<EmbeddingLayer>(node, rng);
  };
  return d;
}

OpDef position_embedding() {
  OpDef d;
  d.name = "position_embedding";
  d.sequence = SequenceLength::Follows;  // a sequence of L tokens adds the table's rows 0..L-1
  d.parse = parse("position_embedding", false);
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 0);
    expect_sequence(n, in[0]);
    return in[0];
  };
  // An add a value forward (two with a token-type row); the gradient passes through and is
  // summed into the table (and the token-type row).
  d.cost = [](const NodeSpec& n, std::span<const Shape>, const Shape& out) {
    OpCost c;
    c.forward_flops = c.backward_weights_flops = ops::count(out) * (n.embedding.types > 0 ? 2 : 1);
    return c;
  };
  d.params = [](const NodeSpec& n, std::span<const Shape> in) {
    std::vector<ParamSpec> p{{"weight", Shape{n.embedding.count, in[0][1]}}};
    if (n.embedding.types > 0) p.push_back({"token_type_embeddings", Shape{n.embedding.types, in[0][1]}});
    return p;
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend&, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<PositionEmbeddingLayer>(node, in[0], rng);
  };
  return d;
}

OpDef layout_embedding() {
  OpDef d;
  d.name = "layout_embedding";
  d.sequence = SequenceLength::Follows;
  d.parse = parse("layout_embedding", false);
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    if (in.size() != 2) ops::fail_node(n, cat("field 'inputs' needs 2 inputs (the sequence, then the boxes), got ", in.size()));
    if (in[0].rank() != 2) ops::fail_node(n, cat("expects a sequence [tokens, features] per sample, got ", in[0].str()));
    if (in[1] != Shape{in[0][0], 4})
      ops::fail_node(n, cat("its boxes must be [tokens, 4] (x0, y0, x1, y1) = [", in[0][0], ", 4], got ", in[1].str()));
    return in[0];
  };
  // Six rows added a value forward (x0, y0, x1, y1, height, width); six sums backward.
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape& out) {
    OpCost c;
    c.forward_flops = c.backward_weights_flops = 6.0 * ops::count(out);
    return c;
  };
  d.params = [](const NodeSpec& n, std::span<const Shape> in) {
    const Shape table{n.embedding.count, in[0][1]};
    // Hugging Face's LayoutLM names: a node named "layoutlm.embeddings" holds its tensors.
    return std::vector<ParamSpec>{{"x_position_embeddings.weight", table},
                                  {"y_position_embeddings.weight", table},
                                  {"h_position_embeddings.weight", table},
                                  {"w_position_embeddings.weight", table}};
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend&, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<LayoutEmbeddingLayer>(node, in[0], rng);
  };
  return d;
}

OpDef class_token() {
  OpDef d;
  d.name = "class_token";
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 2);
    return Shape{in[0][0] + 1, in[0][1]};
  };
  // A copy and an add a value forward; the input's gradient is a copy, the tables' a sum.
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape& out) {
    OpCost c;
    c.forward_flops = c.backward_weights_flops = ops::count(out);
    return c;
  };
  // Hugging Face's ViTEmbeddings: a node named "vit.embeddings" holds its tensors.
  d.params = [](const NodeSpec&, std::span<const Shape> in) {
    return std::vector<ParamSpec>{{"cls_token", Shape{1, 1, in[0][1]}},
                                  {"position_embeddings", Shape{1, in[0][0] + 1, in[0][1]}}};
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend&, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<ClassTokenLayer>(node, in[0], rng);
  };
  return d;
}

}  // namespace

void define_embedding_op(OpTable& t) {
  for (OpDef d : {token_embedding(), position_embedding(), layout_embedding(), class_token()}) {
    d.freezable = true;
    t.add(std::move(d));
  }
}

}  // namespace tandem
