// The parameter-free layers: ReLU, MaxPool2d (argmax or workspace stashed per micro-batch)
// and Flatten (a view), plus make_layer, which asks the op registry (core/ops) for the layer.
#include <algorithm>

#include "core/error.h"
#include "core/dropout_bits.h"
#include "core/layers/dropout_mask.h"
#include "core/layers/layers.h"
#include "core/ops/op.h"

namespace tandem {

void init_uniform(Param& p, float bound, Rng& rng) {
  float* v = p.value().data();
  for (int64_t i = 0, n = p.value().numel(); i < n; ++i) v[i] = rng.uniform(-bound, bound);
  p.bump_version();
}

void ReluLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(in[0].numel()).forward(in[0].data(), out.data());
}

void ReluLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                         std::span<Tensor> grad_in, Stash&) {
  if (grad_in[0].defined()) kernel(in[0].numel()).backward(out.data(), grad_out.data(), grad_in[0].data());
}

void ActivationLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(in[0].numel()).forward(in[0].data(), out.data());
}

void ActivationLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                               std::span<Tensor> grad_in, Stash&) {
  if (grad_in[0].defined())
    kernel(in[0].numel()).backward(in[0].data(), out.data(), grad_out.data(), grad_in[0].data());
}

namespace {

// Rows of the leading dimensions; each input holds `width(k)` values of a row.
int64_t last_dim(const Tensor& t) { return t.shape()[t.shape().rank() - 1]; }

}  // namespace

void dropout_mask(uint64_t seed, uint64_t call, float p, int64_t n, uint8_t* keep) {
  const uint64_t base = dropout_base(seed, call), threshold = dropout_threshold(p);
  for (int64_t i = 0; i < n; ++i) keep[i] = dropout_keeps(base, threshold, i);
}

DropoutKernel& DropoutLayer::kernel(int64_t elements) {
  return kernels_.get(elements, [&](int64_t n) { return backend_.dropout(n); });
}

void DropoutLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  const int64_t n = in[0].numel();
  auto* keep = static_cast<uint8_t*>(stash.reserve(static_cast<std::size_t>(n) + 1));
  keep[n] = training_ ? 1 : 0;  // the mode, for this micro-batch's backward
  if (!training_ || p_ == 0.0f) {
    backend_.vectors().copy(out.data(), in[0].data(), n);
    std::fill_n(keep, n, uint8_t{1});
    return;
  }
  kernel(n).forward(seed_, ++calls_, p_, in[0].data(), out.data(), keep);
}

void DropoutLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                            std::span<Tensor> grad_in, Stash& stash) {
  if (!grad_in[0].defined()) return;
  const int64_t n = in[0].numel();
  const auto* keep = reinterpret_cast<const uint8_t*>(stash.bytes.data());
  const float scale = keep[n] && p_ > 0.0f ? 1.0f / (1.0f - p_) : 1.0f;
  kernel(n).backward(keep, scale, grad_out.data(), grad_in[0].data());
}

void ConcatLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const int64_t total = last_dim(out), rows = out.numel() / total;
  int64_t offset = 0;
  for (const Tensor& t : in) {
    const int64_t w = last_dim(t);
    backend_.vectors().copy_rows(out.data() + offset, total, t.data(), w, w, rows);
    offset += w;
  }
}

void ConcatLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                           Stash&) {
  const int64_t total = last_dim(grad_out), rows = grad_out.numel() / total;
  int64_t offset = 0;
  for (std::size_t k = 0; k < in.size(); ++k) {
    const int64_t w = last_dim(in[k]);
    if (grad_in[k].defined()) backend_.vectors().copy_rows(grad_in[k].data(), w, grad_out.data() + offset, total, w, rows);
    offset += w;
  }
}

SliceLayer::Runs SliceLayer::runs(const Shape& in, const Shape& out) const {
  int64_t rows = 1, inner = 1;
  for (int i = 0; i < axis_; ++i) rows *= in[i];
  for (int i = static_cast<int>(axis_) + 1; i < in.rank(); ++i) inner *= in[i];
  return {rows, in[static_cast<int>(axis_)] * inner, out[static_cast<int>(axis_)] * inner, start_ * inner};
}

void SliceLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const Runs r = runs(in[0].shape(), out.shape());
  backend_.vectors().copy_rows(out.data(), r.width, in[0].data() + r.offset, r.along, r.width, r.rows);
}

void SliceLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                          Stash&) {
  if (!grad_in[0].defined()) return;
  const Runs r = runs(in[0].shape(), grad_out.shape());
  backend_.vectors().fill(grad_in[0].data(), 0.0f, grad_in[0].numel());
  backend_.vectors().copy_rows(grad_in[0].data() + r.offset, r.along, grad_out.data(), r.width, r.width, r.rows);
}

TransposeLayer::TransposeLayer(std::string name, const std::vector<int>& perm, Backend& backend)
    : Layer(std::move(name)), perm_{0}, inverse_(perm.size() + 1), backend_(backend) {
  for (int a : perm) perm_.push_back(a + 1);
  for (std::size_t i = 0; i < perm_.size(); ++i) inverse_[static_cast<std::size_t>(perm_[i])] = static_cast<int>(i);
}

void TransposeLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const Shape& s = in[0].shape();
  int64_t dims[kMaxRank];
  for (int i = 0; i < s.rank(); ++i) dims[i] = s[i];
  backend_.vectors().permute(out.data(), in[0].data(), dims, perm_.data(), s.rank());
}

void TransposeLayer::backward(std::span<const Tensor>, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                              Stash&) {
  if (!grad_in[0].defined()) return;
  const Shape& s = grad_out.shape();
  int64_t dims[kMaxRank];
  for (int i = 0; i < s.rank(); ++i) dims[i] = s[i];
  backend_.vectors().permute(grad_in[0].data(), grad_out.data(), dims, inverse_.data(), s.rank());
}

ReduceLayer::ReduceLayer(std::string name, std::vector<int> axes, ReduceAttrs::Mode mode, Backend& backend)
    : Layer(std::move(name)), axes_(std::move(axes)), mode_(mode), backend_(backend) {}

ReduceLayer::Plan ReduceLayer::plan(const Shape& in) const {
  Plan p{};
  p.rank = in.rank();
  p.rows = in[0];
  p.width = 1;
  std::vector<int> kept{0}, reduced;
  for (int i = 1; i < in.rank(); ++i) {
    p.dims[i] = in[i];
    const bool r = std::binary_search(axes_.begin(), axes_.end(), i - 1);
    (r ? reduced : kept).push_back(i);
    (r ? p.width : p.rows) *= in[i];
  }
  p.dims[0] = in[0];
  if (reduced.front() != static_cast<int>(kept.size())) {  // not last already: permute them there
    p.perm = kept;
    p.perm.insert(p.perm.end(), reduced.begin(), reduced.end());
    p.inverse.resize(p.perm.size());
    for (std::size_t i = 0; i < p.perm.size(); ++i) p.inverse[static_cast<std::size_t>(p.perm[i])] = static_cast<int>(i);
  }
  return p;
}

float* ReduceLayer::scratch(Tensor& t, int64_t count) {
  if (!t.defined() || t.numel() < count) t = Tensor::empty(Shape{count});
  return t.data();
}

void ReduceLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const Plan p = plan(in[0].shape());
  VectorKernel& v = backend_.vectors();
  const float* x = in[0].data();
  if (!p.perm.empty()) {
    float* t = scratch(scratch_, in[0].numel());
    v.permute(t, x, p.dims, p.perm.data(), p.rank);
    x = t;
  }
  if (extreme()) return v.extreme_rows(out.data(), x, p.rows, p.width, mode_ == ReduceAttrs::Mode::max);
  const float scale = mode_ == ReduceAttrs::Mode::mean ? static_cast<float>(1.0 / static_cast<double>(p.width)) : 1.0f;
  v.sum_rows(out.data(), x, p.rows, p.width, scale);
}

void ReduceLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                           Stash&) {
  if (!grad_in[0].defined()) return;
  const Plan p = plan(in[0].shape());
  VectorKernel& v = backend_.vectors();
  float* to = p.perm.empty() ? grad_in[0].data() : scratch(routed_, grad_in[0].numel());
  if (extreme()) {  // the gradient to each row's first extreme, found again in the input as permuted
    const float* x = in[0].data();
    if (!p.perm.empty()) {
      float* t = scratch(scratch_, in[0].numel());
      v.permute(t, x, p.dims, p.perm.data(), p.rank);
      x = t;
    }
    v.route_rows(to, x, out.data(), grad_out.data(), p.rows, p.width);
  } else {
    const float scale = mode_ == ReduceAttrs::Mode::mean ? static_cast<float>(1.0 / static_cast<double>(p.width)) : 1.0f;
    v.spread_rows(to, grad_out.data(), p.rows, p.width, scale);
  }
  if (p.perm.empty()) return;
  int64_t permuted[kMaxRank];  // the permuted tensor's dims
  for (int i = 0; i < p.rank; ++i) permuted[i] = p.dims[p.perm[static_cast<std::size_t>(i)]];
  v.permute(grad_in[0].data(), to, permuted, p.inverse.data(), p.rank);
}

namespace {

// An operand's steps against the output `out` (both with the batch first): the per-sample
// axes aligned on the last, 0 along an axis the operand repeats (its dimension 1, or missing).
void broadcast_strides(const Shape& s, const Shape& out, int64_t* strides) {
  int64_t step = 1;
  const int shift = out.rank() - s.rank();
  for (int i = out.rank() - 1; i >= 1; --i) {
    const int j = i - shift;
    const int64_t d = j >= 1 ? s[j] : 1;
    if (d != 1 && d != out[i])  // never from a built graph; a read past the operand otherwise
      fail("binary", cat("an operand ", s.str(), " does not broadcast to ", out.str()));
    strides[i] = d == 1 ? 0 : step;
    step *= d;
  }
  strides[0] = s[0] == 1 ? 0 : step;  // the batch
}

}  // namespace

void sum_to_shape(VectorKernel& v, float* to, const Shape& shape, const float* full, const Shape& out, Tensor& scratch) {
  const int shift = out.rank() - shape.rank();
  std::vector<int> kept, repeated;
  int64_t rows = 1, width = 1;
  int64_t dims[kMaxRank];
  for (int i = 0; i < out.rank(); ++i) {  // the batch (axis 0) repeats where `shape` has one (a trained operand)
    dims[i] = out[i];
    const int j = i == 0 ? 0 : i - shift;
    const bool r = out[i] != 1 && (i > 0 && j < 1 ? true : shape[j] == 1);
    (r ? repeated : kept).push_back(i);
    (r ? width : rows) *= out[i];
  }
  if (!repeated.empty() && repeated.front() != static_cast<int>(kept.size())) {  // not last already: permute them there
    // (kept is never empty here: a repeated axis before a kept one)
    std::vector<int> perm = kept;
    perm.insert(perm.end(), repeated.begin(), repeated.end());
    if (!scratch.defined() || scratch.numel() < out.numel()) scratch = Tensor::empty(Shape{out.numel()});
    float* t = scratch.data();
    v.permute(t, full, dims, perm.data(), out.rank());
    full = t;
  }
  v.sum_rows(to, full, rows, width, 1.0f);
}

static Elementwise elementwise_of(BinaryAttrs::Mode m) {
  using M = BinaryAttrs::Mode;
  switch (m) {
    case M::add: return Elementwise::add;
    case M::sub: return Elementwise::sub;
    case M::mul: return Elementwise::mul;
    case M::div: return Elementwise::div;
    case M::equal: return Elementwise::equal;
    case M::not_equal: return Elementwise::not_equal;
    case M::less: return Elementwise::less;
    case M::greater: return Elementwise::greater;
    case M::less_equal: return Elementwise::less_equal;
    case M::greater_equal: return Elementwise::greater_equal;
  }
  return Elementwise::add;
}

BinaryLayer::BinaryLayer(const GraphNode& node, Backend& backend)
    : Layer(node.spec.name), attrs_(node.spec.binary), backend_(backend) {
  if (attrs_.operand.empty()) return;
  int64_t dims[kMaxRank] = {1};
  std::copy(attrs_.operand.begin(), attrs_.operand.end(), dims + 1);
  operand_shape_ = Shape::of(dims, static_cast<int>(attrs_.operand.size()) + 1);
  int64_t own[kMaxRank] = {};
  std::copy(attrs_.operand.begin(), attrs_.operand.end(), own);
  operand_ = std::make_unique<Param>(node.spec.name + ".operand", Shape::of(own, static_cast<int>(attrs_.operand.size())));
  const bool product = attrs_.mode == BinaryAttrs::Mode::mul || attrs_.mode == BinaryAttrs::Mode::div;
  operand_->value().fill(product ? 1.0f : 0.0f);
  if (node.spec.freeze) operand_->freeze();
}

Layer::Reads BinaryLayer::backward_reads() const {
  using M = BinaryAttrs::Mode;
  if (attrs_.compares()) return {0u, false};  // no gradient
  const bool product = attrs_.mode == M::mul || attrs_.mode == M::div;
  if (operand_) return {product ? 1u : 0u, false};  // the operand's gradient: dy a; -dy a / b^2 (b's its own)
  if (attrs_.scalar_first) return {attrs_.mode == M::div ? 1u : 0u, false};  // d(c / x) = -c dy / x^2
  if (attrs_.has_scalar) return {0u, false};  // dy c; dy / c
  return {product ? 0b11u : 0u, false};
}

Broadcast BinaryLayer::broadcast(std::span<const Tensor> in, const Shape& out) {
  Broadcast b{};
  b.rank = out.rank();
  for (int i = 0; i < b.rank; ++i) b.dims[i] = out[i];
  const int left = attrs_.scalar_first ? 1 : 0;  // the scalar's strides stay 0
  broadcast_strides(in[0].shape(), out, b.strides[left]);
  if (in.size() > 1) broadcast_strides(in[1].shape(), out, b.strides[1]);
  if (operand_) broadcast_strides(operand_shape_, out, b.strides[1 - left]);
  return b;
}

float* BinaryLayer::scratch(Tensor& t, int64_t count) {
  if (!t.defined() || t.numel() < count) t = Tensor::empty(Shape{count});
  return t.data();
}

void BinaryLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const float* a = in[0].data();
  const float* b = in.size() > 1 ? in[1].data() : nullptr;
  if (!b && operand_) {
    b = operand_->value().data();
    if (attrs_.scalar_first) std::swap(a, b);
  } else if (!b) {
    if (!scalar_.defined()) {
      scalar_ = Tensor::empty(Shape{1});
      backend_.vectors().fill(scalar_.data(), attrs_.scalar, 1);
    }
    b = scalar_.data();
    if (attrs_.scalar_first) std::swap(a, b);
  }
  backend_.vectors().elementwise(elementwise_of(attrs_.mode), out.data(), a, b, nullptr, broadcast(in, out.shape()));
}

void BinaryLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                           Stash&) {
  using M = BinaryAttrs::Mode;
  VectorKernel& v = backend_.vectors();
  if (attrs_.compares()) {  // a comparison's output is piecewise constant: no gradient
    for (Tensor& g : grad_in)
      if (g.defined()) v.fill(g.data(), 0.0f, g.numel());
    return;
  }
  const Shape& out = grad_out.shape();
  const Broadcast b = broadcast(in, out);
  const float* dy = grad_out.data();
  // Operands in the op's order: left (a) and right (b); the scalar where one input is.
  const float* constant = operand_ ? operand_->value().data() : scalar_.defined() ? scalar_.data() : nullptr;
  const float* left = attrs_.scalar_first ? constant : in[0].data();
  const float* right = attrs_.scalar_first ? in[0].data() : in.size() > 1 ? in[1].data() : constant;
  // The inputs' gradients, then the trained operand's (k = grad_in.size()), each as input k's.
  const std::size_t count = grad_in.size() + (operand_ && operand_->trainable() ? 1 : 0);
  for (std::size_t k = 0; k < count; ++k) {
    const bool own = k == grad_in.size();  // the trained operand
    if (!own && !grad_in[k].defined()) continue;
    const int side = own ? (attrs_.scalar_first ? 0 : 1) : attrs_.scalar_first || k == 1 ? 1 : 0;  // its place in a op b
    Broadcast g = b;  // slot 0 dy (the output's steps), 1 and 2 the operands' as they are read
    broadcast_strides(out, out, g.strides[0]);
    Elementwise op = Elementwise::add;
    const float *x0 = dy, *x1 = nullptr, *x2 = nullptr;
    switch (attrs_.mode) {
      default: break;  // (comparisons returned above)
      case M::add: break;                                             // dy
      case M::sub: if (side == 1) op = Elementwise::sub, x0 = nullptr, x1 = dy; break;  // dy; -dy
      case M::mul: op = Elementwise::mul, x1 = side == 0 ? right : left; break;        // dy b; dy a
      case M::div:
        if (side == 0) {
          op = Elementwise::div, x1 = right;  // dy / b
        } else {
          op = Elementwise::div_right, x1 = left, x2 = right;  // -dy a / b^2
        }
        break;
    }
    // The steps of what x1 and x2 point at: the other operand's (mul, div's left), or both
    // operands' (div's right); -dy reads the output's.
    if (x1 == dy) std::copy_n(g.strides[0], kBroadcastRank, g.strides[1]);
    else if (op == Elementwise::mul || op == Elementwise::div) std::copy_n(b.strides[side == 0 ? 1 : 0], kBroadcastRank, g.strides[1]);
    if (op == Elementwise::div_right) {
      std::copy_n(b.strides[0], kBroadcastRank, g.strides[1]);
      std::copy_n(b.strides[1], kBroadcastRank, g.strides[2]);
    }
    const Shape& shape = own ? operand_shape_ : in[k].shape();
    float* target = own ? operand_->grad_target() : grad_in[k].data();
    const bool whole = shape == out;
    const float* full = dy;  // the gradient over the whole output (add's: dy itself)
    if (op != Elementwise::add) {
      float* to = whole ? target : scratch(full_, out.numel());
      v.elementwise(op, to, x0, x1, x2, g);
      full = to;
    } else if (whole) {
      v.copy(target, dy, out.numel());
    }
    if (!whole) sum_to_shape(v, target, shape, full, out, permuted_);
    if (own) operand_->commit_grad();
  }
}

void ExpandLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  Broadcast b{};
  b.rank = out.shape().rank();
  for (int i = 0; i < b.rank; ++i) b.dims[i] = out.shape()[i];
  broadcast_strides(in[0].shape(), out.shape(), b.strides[0]);
  backend_.vectors().elementwise(Elementwise::add, out.data(), in[0].data(), nullptr, nullptr, b);  // x + 0
}

void ExpandLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                           Stash&) {
  if (grad_in.empty() || !grad_in[0].defined()) return;
  if (in[0].shape() == grad_out.shape()) return backend_.vectors().copy(grad_in[0].data(), grad_out.data(), grad_out.numel());
  sum_to_shape(backend_.vectors(), grad_in[0].data(), in[0].shape(), grad_out.data(), grad_out.shape(), permuted_);
}

WhereLayer::WhereLayer(const GraphNode& node, Backend& backend)
    : Layer(node.spec.name), attrs_(node.spec.where), backend_(backend) {}

Broadcast WhereLayer::broadcast(std::span<const Tensor> in, const Shape& out) const {
  Broadcast b{};
  b.rank = out.rank();
  for (int i = 0; i < b.rank; ++i) b.dims[i] = out[i];
  std::size_t next = 1;
  broadcast_strides(in[0].shape(), out, b.strides[0]);
  if (!attrs_.a) broadcast_strides(in[next++].shape(), out, b.strides[1]);
  if (!attrs_.b) broadcast_strides(in[next].shape(), out, b.strides[2]);
  return b;
}

void WhereLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  VectorKernel& v = backend_.vectors();
  if ((attrs_.a || attrs_.b) && !constants_.defined()) {
    constants_ = Tensor::empty(Shape{2});
    v.fill(constants_.data(), attrs_.a.value_or(0.0f), 1);
    v.fill(constants_.data() + 1, attrs_.b.value_or(0.0f), 1);
  }
  std::size_t next = 1;
  const float* a = attrs_.a ? constants_.data() : in[next++].data();
  const float* b = attrs_.b ? constants_.data() + 1 : in[next].data();
  v.elementwise(Elementwise::select, out.data(), in[0].data(), a, b, broadcast(in, out.shape()));
}

void WhereLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                          Stash&) {
  VectorKernel& v = backend_.vectors();
  const Shape& out = grad_out.shape();
  const Broadcast b = broadcast(in, out);
  if (!grad_in.empty() && grad_in[0].defined()) v.fill(grad_in[0].data(), 0.0f, grad_in[0].numel());  // cond
  std::size_t k = 1;
  for (int side = 1; side <= 2; ++side) {  // a, then b: dy where it was picked, else 0
    if ((side == 1 ? attrs_.a : attrs_.b).has_value()) continue;
    const std::size_t at = k++;
    if (at >= grad_in.size() || !grad_in[at].defined()) continue;
    Broadcast g = b;  // slot 0 cond as read, the picked slot dy at the output's steps, the other 0
    broadcast_strides(out, out, g.strides[side]);
    const Shape& shape = in[at].shape();
    const bool whole = shape == out;
    if (!whole && (!full_.defined() || full_.numel() < out.numel())) full_ = Tensor::empty(Shape{out.numel()});
    float* to = whole ? grad_in[at].data() : full_.data();
    v.elementwise(Elementwise::select, to, in[0].data(), side == 1 ? grad_out.data() : nullptr,
                  side == 2 ? grad_out.data() : nullptr, g);
    if (!whole) sum_to_shape(v, grad_in[at].data(), shape, to, out, permuted_);
  }
}

namespace {

// The product's description for a @ b with `out` = [batch..., M, N] (with the batch): A(i, l)
// at a_row, a_col and B(l, j) at b_row, b_col (a transposed operand swaps them); each
// operand's steps over the batch axes from its shape against `a_full`/`b_full`, the shape it
// has where nothing repeats.
Matmul product(const Shape& out, int64_t k, const Shape& a, const Shape& a_full, const Shape& b, const Shape& b_full,
               int64_t a_row, int64_t a_col, int64_t b_row, int64_t b_col) {
  Matmul m{};
  m.m = out[out.rank() - 2], m.n = out[out.rank() - 1], m.k = k;
  m.a_row = a_row, m.a_col = a_col, m.b_row = b_row, m.b_col = b_col;
  m.rank = out.rank() - 2;
  int64_t sa[kMaxRank], sb[kMaxRank];
  broadcast_strides(a, a_full, sa);
  broadcast_strides(b, b_full, sb);
  for (int i = 0; i < m.rank; ++i) m.dims[i] = out[i], m.a_steps[i] = sa[i], m.b_steps[i] = sb[i];
  return m;
}

// `out` with its last two axes replaced by (r, c).
Shape with_matrix(const Shape& out, int64_t r, int64_t c) {
  int64_t d[kMaxRank];
  for (int i = 0; i < out.rank(); ++i) d[i] = out[i];
  d[out.rank() - 2] = r, d[out.rank() - 1] = c;
  return Shape::of(d, out.rank());
}

}  // namespace

void MatmulLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  const Shape &a = in[0].shape(), &b = in[1].shape(), &c = out.shape();
  const int64_t M = c[c.rank() - 2], N = c[c.rank() - 1], K = a[a.rank() - 1];
  backend_.vectors().matmul(out.data(), in[0].data(), in[1].data(),
                            product(c, K, a, with_matrix(c, M, K), b, with_matrix(c, K, N), K, 1, N, 1));
}

void MatmulLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                           Stash&) {
  const Shape &a = in[0].shape(), &b = in[1].shape(), &c = grad_out.shape();
  const int64_t M = c[c.rank() - 2], N = c[c.rank() - 1], K = a[a.rank() - 1];
  VectorKernel& v = backend_.vectors();
  const Shape a_full = with_matrix(c, M, K), b_full = with_matrix(c, K, N);
  for (int k = 0; k < 2; ++k) {
    if (static_cast<std::size_t>(k) >= grad_in.size() || !grad_in[k].defined()) continue;
    const Shape& shape = k == 0 ? a : b;
    const Shape& full = k == 0 ? a_full : b_full;
    const bool whole = shape == full;
    if (!whole && (!full_.defined() || full_.numel() < full.numel())) full_ = Tensor::empty(Shape{full.numel()});
    float* to = whole ? grad_in[k].data() : full_.data();
    if (k == 0)  // dA(i, l) = sum over j of dC(i, j) B(l, j): B read transposed
      v.matmul(to, grad_out.data(), in[1].data(), product(a_full, N, c, c, b, b_full, N, 1, 1, N));
    else  // dB(l, j) = sum over i of A(i, l) dC(i, j): A read transposed
      v.matmul(to, in[0].data(), grad_out.data(), product(b_full, M, a, a_full, c, c, 1, K, N, 1));
    if (!whole) sum_to_shape(v, grad_in[k].data(), shape, to, full, permuted_);
  }
}

void AddLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernels_.get(out.numel(), [&](int64_t n) { return backend_.add(n); }).forward(in[0].data(), in[1].data(), out.data());
}

void AddLayer::backward(std::span<const Tensor>, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                        Stash&) {
  for (Tensor& g : grad_in)
    if (g.defined()) backend_.vectors().copy(g.data(), grad_out.data(), g.numel());
}

MulKernel& MulLayer::kernel(std::span<const Tensor> in) {
  const int64_t batch = in[0].shape()[0], inner = in[1].numel() / batch;
  return kernels_.get(batch, in[0].numel() / batch / inner, [&](int64_t b, int64_t outer) {
    return backend_.mul({b, outer, inner});
  });
}

void MulLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(in).forward(in[0].data(), in[1].data(), out.data());
}

void MulLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                        Stash&) {
  float* da = grad_in[0].defined() ? grad_in[0].data() : nullptr;
  float* db = grad_in.size() > 1 && grad_in[1].defined() ? grad_in[1].data() : nullptr;
  if (da || db) kernel(in).backward(grad_out.data(), in[0].data(), in[1].data(), da, db);
}

SoftmaxKernel& SoftmaxLayer::kernel(int64_t rows) {
  return kernels_.get(rows, [&](int64_t n) { return backend_.softmax(n, channels_); });
}

void SoftmaxLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(in[0].numel() / channels_).forward(in[0].data(), out.data());
}

void SoftmaxLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                            std::span<Tensor> grad_in, Stash&) {
  if (grad_in[0].defined()) kernel(in[0].numel() / channels_).backward(out.data(), grad_out.data(), grad_in[0].data());
}

GlobalAvgPoolKernel& GlobalAvgPoolLayer::kernel(int64_t batch) {
  return kernels_.get(batch, [&](int64_t n) { return backend_.global_avg_pool({n, in_[0], in_[1], in_[2]}); });
}

void GlobalAvgPoolLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(in[0].shape()[0]).forward(in[0].data(), out.data());
}

void GlobalAvgPoolLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                                  std::span<Tensor> grad_in, Stash&) {
  if (grad_in[0].defined()) kernel(in[0].shape()[0]).backward(grad_out.data(), grad_in[0].data());
}

ActivationKernel& ActivationLayer::kernel(int64_t elements) {
  return kernels_.get(elements, [&](int64_t n) { return backend_.activation(kind_, n); });
}

ReluKernel& ReluLayer::kernel(int64_t elements) {
  return kernels_.get(elements, [&](int64_t n) { return backend_.relu(n); });
}

namespace {

// A pool node's geometry for one image (the batch is set per kernel).
Pool2dGeometry pool_geometry(const GraphNode& node, const Shape& in) {
  const Pool2dAttrs& a = node.spec.pool;
  Pool2dGeometry g;
  g.in_h = in[0];
  g.in_w = in[1];
  g.channels = in[2];
  g.kernel_h = a.kernel[0];
  g.kernel_w = a.kernel[1];
  g.stride_h = a.stride[0];
  g.stride_w = a.stride[1];
  g.pad_h = a.padding[0];
  g.pad_w = a.padding[1];
  return g;
}

}  // namespace

MaxPool2dLayer::MaxPool2dLayer(const GraphNode& node, const Shape& in, Backend& backend)
    : Layer(node.spec.name), backend_(backend), geometry_(pool_geometry(node, in)) {}

AvgPool2dLayer::AvgPool2dLayer(const GraphNode& node, const Shape& in, Backend& backend)
    : Layer(node.spec.name), backend_(backend), geometry_(pool_geometry(node, in)) {}

AvgPool2dKernel& AvgPool2dLayer::kernel(int64_t batch) {
  return kernels_.get(batch, [&](int64_t n) {
    Pool2dGeometry g = geometry_;
    g.batch = n;
    return backend_.avg_pool2d(g);
  });
}

void AvgPool2dLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(in[0].shape()[0]).forward(in[0].data(), out.data());
}

void AvgPool2dLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash&) {
  if (grad_in[0].defined()) kernel(in[0].shape()[0]).backward(grad_out.data(), grad_in[0].data());
}

MaxPool2dKernel& MaxPool2dLayer::kernel(int64_t batch) {
  return kernels_.get(batch, [&](int64_t n) {
    Pool2dGeometry g = geometry_;
    g.batch = n;
    return backend_.max_pool2d(g);
  });
}

ReluKernel& MaxPool2dLayer::relu(int64_t elements) {
  return relus_.get(elements, [&](int64_t n) { return backend_.relu(n); });
}

void MaxPool2dLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  MaxPool2dKernel& k = kernel(in[0].shape()[0]);
  k.forward(in[0].data(), out.data(), stash.reserve(k.stash_bytes()));
  if (relu_) relu(out.numel()).forward(out.data(), out.data());
}

void MaxPool2dLayer::backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash& stash) {
  if (!grad_in[0].defined()) return;
  MaxPool2dKernel& k = kernel(in[0].shape()[0]);
  const float* dy = grad_out.data();
  if (relu_) {
    if (!masked_.defined() || masked_.numel() < out.numel()) masked_ = Tensor::empty(Shape{out.numel()});
    relu(out.numel()).backward(out.data(), dy, masked_.data());
    dy = masked_.data();
  }
  k.backward(dy, stash.bytes.data(), grad_in[0].data());
}

void ViewLayer::forward(std::span<const Tensor>, Tensor&, Stash&) {
  fail("network", cat("node '", name(), "' is a view; the network aliases it"));
}

void ViewLayer::backward(std::span<const Tensor>, const Tensor&, const Tensor&, std::span<Tensor>, Stash&) {
  fail("network", cat("node '", name(), "' is a view; the network aliases it"));
}

std::unique_ptr<Layer> make_layer(const GraphNode& node, const std::vector<Shape>& in, Backend& backend, Rng& rng) {
  return op_def(node.spec.op).make_layer(node, in, backend, rng);
}

const float* TokenPoolLayer::weights(std::span<const Tensor> in) {
  const int64_t batch = in[0].shape()[0], tokens = in[0].shape()[1];
  if (!weights_.defined() || weights_.numel() < batch * tokens) weights_ = Tensor::empty({batch * tokens});
  float* w = weights_.data();
  for (int64_t b = 0; b < batch; ++b) {
    float* row = w + b * tokens;
    if (!mean_) {
      for (int64_t t = 0; t < tokens; ++t) row[t] = t == 0 ? 1.0f : 0.0f;
      continue;
    }
    if (in.size() < 2) {
      for (int64_t t = 0; t < tokens; ++t) row[t] = 1.0f / static_cast<float>(tokens);
      continue;
    }
    const float* m = in[1].data() + b * tokens;
    int64_t kept = 0;
    for (int64_t t = 0; t < tokens; ++t) kept += m[t] != 0.0f;
    for (int64_t t = 0; t < tokens; ++t) row[t] = m[t] == 0.0f ? 0.0f : 1.0f / static_cast<float>(kept);
  }
  return w;
}

TokenPoolKernel& TokenPoolLayer::kernel(const Tensor& x) {
  return kernels_.get(x.shape()[0], x.shape()[1], [&](int64_t batch, int64_t tokens) {
    return backend_.token_pool({batch, tokens, features_});
  });
}

void TokenPoolLayer::forward(std::span<const Tensor> in, Tensor& out, Stash&) {
  kernel(in[0]).forward(in[0].data(), weights(in), out.data());
}

void TokenPoolLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash&) {
  if (grad_in.size() > 1 && grad_in[1].defined())  // the mask is not differentiable
    backend_.vectors().fill(grad_in[1].data(), 0.0f, grad_in[1].numel());
  if (grad_in[0].defined()) kernel(in[0]).backward(grad_out.data(), weights(in), grad_in[0].data());
}

}  // namespace tandem
