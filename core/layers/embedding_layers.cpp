// The embedding layers (core/ops/embedding_op.cpp): a table row read per token forward, the
// token's gradient added into that row backward. The same loops on every backend: a gather
// and a scatter-add of whole rows, memory-bound, with nothing for a library to fuse.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/layers/layers.h"

namespace tandem {
namespace {

// The integer an f32 tensor carries at `i`, or an Error naming the node, what it is and where.
int64_t index_at(const Tensor& t, int64_t i, int64_t count, const std::string& node, const char* what) {
  const float v = t[i];
  if (!(v >= 0.0f && v < static_cast<float>(count)) || v != std::floor(v))
    fail("embedding", cat("node '", node, "': ", what, " ", v, " at element ", i, " is not an integer in [0, ", count,
                          ")"));
  return static_cast<int64_t>(v);
}

void add_row(const float* row, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] += row[j];
}

// The table's gradient: zero, then each token's output gradient added into its row.
template <typename RowOf>
void scatter_rows(Param& table, const Tensor& grad_out, int64_t features, RowOf&& row_of) {
  if (!table.trainable()) return;  // frozen (NodeSpec::freeze)
  float* g = table.grad_target();
  std::memset(g, 0, static_cast<std::size_t>(table.value().numel()) * sizeof(float));
  const int64_t tokens = grad_out.numel() / features;
  for (int64_t t = 0; t < tokens; ++t) add_row(grad_out.data() + t * features, g + row_of(t) * features, features);
  table.commit_grad();
}

void pass_gradient(const Tensor& grad_out, std::span<Tensor> grad_in) {
  if (grad_in[0].defined())
    std::memcpy(grad_in[0].data(), grad_out.data(), static_cast<std::size_t>(grad_out.numel()) * sizeof(float));
  for (std::size_t i = 1; i < grad_in.size(); ++i)
    if (grad_in[i].defined()) grad_in[i].fill(0.0f);  // boxes are not differentiable
}

}  // namespace

void init_normal(Param& p, float stddev, Rng& rng) {
  float* v = p.value().data();
  for (int64_t i = 0, n = p.value().numel(); i < n; ++i) {
    // Box-Muller; 1 - u keeps the logarithm's argument in (0, 1].
    const float u = 1.0f - rng.uniform01(), w = rng.uniform01();
    v[i] = stddev * std::sqrt(-2.0f * std::log(u)) * std::cos(6.28318530718f * w);
  }
  p.bump_version();
}

EmbeddingLayer::EmbeddingLayer(const GraphNode& node, Rng& rng)
    : Layer(node.spec.name), count_(node.spec.embedding.count), features_(node.spec.embedding.features),
      weight_(node.spec.name + ".weight", Shape{count_, features_}) {
  init_normal(weight_, 1.0f, rng);  // torch.nn.Embedding's N(0, 1)
  if (node.spec.freeze) weight_.freeze();
}

void EmbeddingLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const Tensor& ids = in[0];
  for (int64_t t = 0, n = ids.numel(); t < n; ++t)
    std::memcpy(out.data() + t * features_, weight_.value().data() + index_at(ids, t, count_, name(), "token id") * features_,
                static_cast<std::size_t>(features_) * sizeof(float));
}

void EmbeddingLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash&) {
  if (grad_in[0].defined()) grad_in[0].fill(0.0f);  // ids are not differentiable
  scatter_rows(weight_, grad_out, features_, [&](int64_t t) { return static_cast<int64_t>(in[0][t]); });
}

PositionEmbeddingLayer::PositionEmbeddingLayer(const GraphNode& node, const Shape& in, Rng& rng)
    : Layer(node.spec.name), features_(in[1]),
      weight_(node.spec.name + ".weight", Shape{node.spec.embedding.count, features_}) {
  init_normal(weight_, 1.0f, rng);
  if (node.spec.freeze) weight_.freeze();
  if (node.spec.embedding.types > 0) {
    types_.emplace(node.spec.name + ".token_type_embeddings", Shape{node.spec.embedding.types, features_});
    init_normal(*types_, 1.0f, rng);
    if (node.spec.freeze) types_->freeze();
  }
}

void PositionEmbeddingLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const int64_t sample = in[0].shape()[1] * features_;
  for (int64_t b = 0, n = in[0].numel() / sample; b < n; ++b) {
    std::memcpy(out.data() + b * sample, in[0].data() + b * sample, static_cast<std::size_t>(sample) * sizeof(float));
    add_row(weight_.value().data(), out.data() + b * sample, sample);  // rows 0..tokens-1 are contiguous
    if (types_)  // segment 0's row at every token
      for (int64_t t = 0; t < sample; t += features_) add_row(types_->value().data(), out.data() + b * sample + t, features_);
  }
}

void PositionEmbeddingLayer::backward(std::span<const Tensor>, const Tensor&, const Tensor& grad_out,
                                      std::span<Tensor> grad_in, Stash&) {
  pass_gradient(grad_out, grad_in);
  const int64_t tokens = grad_out.shape()[1];
  scatter_rows(weight_, grad_out, features_, [&](int64_t t) { return t % tokens; });
  if (types_) scatter_rows(*types_, grad_out, features_, [](int64_t) { return int64_t{0}; });
}

LayoutEmbeddingLayer::LayoutEmbeddingLayer(const GraphNode& node, const Shape& in, Rng& rng)
    : Layer(node.spec.name), count_(node.spec.embedding.count), features_(in[1]),
      x_(node.spec.name + ".x_position_embeddings.weight", Shape{count_, features_}),
      y_(node.spec.name + ".y_position_embeddings.weight", Shape{count_, features_}),
      h_(node.spec.name + ".h_position_embeddings.weight", Shape{count_, features_}),
      w_(node.spec.name + ".w_position_embeddings.weight", Shape{count_, features_}) {
  for (Param* p : params()) {
    init_normal(*p, 1.0f, rng);
    if (node.spec.freeze) p->freeze();
  }
}

// Row of each table for token t: x[x0], y[y0], x[x1], y[y1], h[y1 - y0], w[x1 - x0].
std::array<int64_t, 6> LayoutEmbeddingLayer::rows(const Tensor& boxes, int64_t t) const {
  const int64_t x0 = index_at(boxes, 4 * t, count_, name(), "box coordinate");
  const int64_t y0 = index_at(boxes, 4 * t + 1, count_, name(), "box coordinate");
  const int64_t x1 = index_at(boxes, 4 * t + 2, count_, name(), "box coordinate");
  const int64_t y1 = index_at(boxes, 4 * t + 3, count_, name(), "box coordinate");
  if (x1 < x0 || y1 < y0)
    fail("embedding", cat("node '", name(), "': box ", t, " [", x0, ", ", y0, ", ", x1, ", ", y1,
                          "] ends before it starts (boxes are [x0, y0, x1, y1])"));
  return {x0, y0, x1, y1, y1 - y0, x1 - x0};
}

void LayoutEmbeddingLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const Param* tables[6] = {&x_, &y_, &x_, &y_, &h_, &w_};
  std::memcpy(out.data(), in[0].data(), static_cast<std::size_t>(in[0].numel()) * sizeof(float));
  for (int64_t t = 0, n = in[0].numel() / features_; t < n; ++t) {
    const auto r = rows(in[1], t);
    for (int k = 0; k < 6; ++k) add_row(tables[k]->value().data() + r[k] * features_, out.data() + t * features_, features_);
  }
}

void LayoutEmbeddingLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                                    std::span<Tensor> grad_in, Stash&) {
  pass_gradient(grad_out, grad_in);
  if (!x_.trainable()) return;  // frozen (NodeSpec::freeze)
  // x and y tables are read twice a token (x0 and x1, y0 and y1): both rows get the gradient.
  const int64_t tokens = grad_out.numel() / features_;
  Param* tables[4] = {&x_, &y_, &h_, &w_};
  for (Param* p : tables) std::memset(p->grad_target(), 0, static_cast<std::size_t>(p->value().numel()) * sizeof(float));
  const int table_of[6] = {0, 1, 0, 1, 2, 3};
  for (int64_t t = 0; t < tokens; ++t) {
    const auto r = rows(in[1], t);
    for (int k = 0; k < 6; ++k)
      add_row(grad_out.data() + t * features_, tables[table_of[k]]->grad_target() + r[k] * features_, features_);
  }
  for (Param* p : tables) p->commit_grad();
}

ClassTokenLayer::ClassTokenLayer(const GraphNode& node, const Shape& in, Rng& rng)
    : Layer(node.spec.name), tokens_(in[0]), features_(in[1]), cls_(node.spec.name + ".cls_token", Shape{1, 1, in[1]}),
      positions_(node.spec.name + ".position_embeddings", Shape{1, in[0] + 1, in[1]}) {
  init_normal(cls_, 0.02f, rng);  // Hugging Face's ViT initialiser range
  init_normal(positions_, 0.02f, rng);
  if (node.spec.freeze) cls_.freeze(), positions_.freeze();
}

void ClassTokenLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const int64_t sample = tokens_ * features_, out_sample = sample + features_;
  for (int64_t b = 0, n = in[0].shape()[0]; b < n; ++b) {
    float* y = out.data() + b * out_sample;
    std::memcpy(y, cls_.value().data(), static_cast<std::size_t>(features_) * sizeof(float));
    std::memcpy(y + features_, in[0].data() + b * sample, static_cast<std::size_t>(sample) * sizeof(float));
    add_row(positions_.value().data(), y, out_sample);
  }
}

void ClassTokenLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                               std::span<Tensor> grad_in, Stash&) {
  const int64_t sample = tokens_ * features_, out_sample = sample + features_, n = in[0].shape()[0];
  if (!cls_.trainable()) {  // frozen: the input's gradient only
    for (int64_t b = 0; grad_in[0].defined() && b < n; ++b)
      std::memcpy(grad_in[0].data() + b * sample, grad_out.data() + b * out_sample + features_,
                  static_cast<std::size_t>(sample) * sizeof(float));
    return;
  }
  float* dcls = cls_.grad_target();
  float* dpos = positions_.grad_target();
  std::memset(dcls, 0, static_cast<std::size_t>(features_) * sizeof(float));
  std::memset(dpos, 0, static_cast<std::size_t>(out_sample) * sizeof(float));
  for (int64_t b = 0; b < n; ++b) {
    const float* dy = grad_out.data() + b * out_sample;
    add_row(dy, dcls, features_);
    add_row(dy, dpos, out_sample);
    if (grad_in[0].defined())
      std::memcpy(grad_in[0].data() + b * sample, dy + features_, static_cast<std::size_t>(sample) * sizeof(float));
  }
  cls_.commit_grad();
  positions_.commit_grad();
}

}  // namespace tandem
