#include "core/host_vectors.h"

#include <algorithm>
#include <cmath>

namespace tandem {
namespace {

// Walks the output in order; its last axis is a strided run of the input (a plain copy where
// the permutation keeps the last axis).
void host_permute(float* to, const float* from, const int64_t* dims, const int* perm, int rank) {
  constexpr int kMax = 8;
  int64_t in_stride[kMax] = {}, out_dims[kMax] = {}, stride[kMax] = {}, at[kMax] = {};
  int64_t total = 1;
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) in_stride[i] = s, s *= dims[i];
  for (int i = 0; i < rank; ++i) out_dims[i] = dims[perm[i]], stride[i] = in_stride[perm[i]], total *= out_dims[i];
  if (total == 0) return;
  if (rank == 0) {
    *to = *from;
    return;
  }
  const int last = rank - 1;
  const int64_t run = out_dims[last], step = stride[last];
  for (int64_t done = 0; done < total; done += run) {
    const float* src = from;
    for (int i = 0; i < last; ++i) src += at[i] * stride[i];
    if (step == 1) {
      std::copy_n(src, run, to + done);
    } else {
      for (int64_t j = 0; j < run; ++j) to[done + j] = src[j * step];
    }
    for (int i = last - 1; i >= 0; --i) {  // the next run: count up the outer axes
      if (++at[i] < out_dims[i]) break;
      at[i] = 0;
    }
  }
}

float apply(Elementwise op, float a, float b, float c) {
  switch (op) {
    case Elementwise::add: return a + b;
    case Elementwise::sub: return a - b;
    case Elementwise::mul: return a * b;
    case Elementwise::div: return a / b;
    case Elementwise::div_right: return -a * b / (c * c);
    case Elementwise::select: return a != 0.0f ? b : c;
    case Elementwise::equal: return a == b ? 1.0f : 0.0f;
    case Elementwise::not_equal: return a != b ? 1.0f : 0.0f;
    case Elementwise::less: return a < b ? 1.0f : 0.0f;
    case Elementwise::greater: return a > b ? 1.0f : 0.0f;
    case Elementwise::less_equal: return a <= b ? 1.0f : 0.0f;
    case Elementwise::greater_equal: return a >= b ? 1.0f : 0.0f;
  }
  return 0.0f;
}

// Walks the output in order, a run of its last axis at a time, the operands' offsets counted
// up with it (null operands read as 0).
void host_elementwise(Elementwise op, float* to, const float* x0, const float* x1, const float* x2, const Broadcast& b) {
  int64_t total = 1;
  for (int i = 0; i < b.rank; ++i) total *= b.dims[i];
  if (total == 0) return;
  const float zero = 0.0f;
  if (b.rank == 0) {
    *to = apply(op, x0 ? *x0 : zero, x1 ? *x1 : zero, x2 ? *x2 : zero);
    return;
  }
  const int last = b.rank - 1;
  const int64_t run = b.dims[last];
  const int64_t t0 = x0 ? b.strides[0][last] : 0, t1 = x1 ? b.strides[1][last] : 0, t2 = x2 ? b.strides[2][last] : 0;
  int64_t at[kBroadcastRank] = {};
  for (int64_t done = 0; done < total; done += run) {
    int64_t o0 = 0, o1 = 0, o2 = 0;
    for (int i = 0; i < last; ++i) o0 += at[i] * b.strides[0][i], o1 += at[i] * b.strides[1][i], o2 += at[i] * b.strides[2][i];
    const float* a = x0 ? x0 + o0 : &zero;
    const float* c = x1 ? x1 + o1 : &zero;
    const float* d = x2 ? x2 + o2 : &zero;
    float* y = to + done;
    if (op == Elementwise::add && t0 == 1 && t1 == 1) {
      for (int64_t j = 0; j < run; ++j) y[j] = a[j] + c[j];
    } else if (op == Elementwise::mul && t0 == 1 && t1 == 1) {
      for (int64_t j = 0; j < run; ++j) y[j] = a[j] * c[j];
    } else if (op == Elementwise::mul && t0 == 1 && t1 == 0) {
      const float k = *c;
      for (int64_t j = 0; j < run; ++j) y[j] = a[j] * k;
    } else {
      for (int64_t j = 0; j < run; ++j) y[j] = apply(op, a[j * t0], c[j * t1], d[j * t2]);
    }
    for (int i = last - 1; i >= 0; --i) {  // the next run: count up the outer axes
      if (++at[i] < b.dims[i]) break;
      at[i] = 0;
    }
  }
}

// Each product by rows of C: C[i][:] = sum over l of A(i, l) B[l][:], the inner loop along
// B's rows where they are contiguous (vectorised), else element by element.
void host_matmul(float* c, const float* a, const float* b, const Matmul& m) {
  int64_t count = 1;
  for (int i = 0; i < m.rank; ++i) count *= m.dims[i];
  int64_t at[kBroadcastRank] = {};
  for (int64_t p = 0; p < count; ++p) {
    const float* ap = a;
    const float* bp = b;
    for (int i = 0; i < m.rank; ++i) ap += at[i] * m.a_steps[i], bp += at[i] * m.b_steps[i];
    float* cp = c + p * m.m * m.n;
    for (int64_t i = 0; i < m.m; ++i) {
      float* row = cp + i * m.n;
      std::fill_n(row, m.n, 0.0f);
      for (int64_t l = 0; l < m.k; ++l) {
        const float x = ap[i * m.a_row + l * m.a_col];
        const float* br = bp + l * m.b_row;
        if (m.b_col == 1) {
          for (int64_t j = 0; j < m.n; ++j) row[j] += x * br[j];
        } else {
          for (int64_t j = 0; j < m.n; ++j) row[j] += x * br[j * m.b_col];
        }
      }
    }
    for (int i = m.rank - 1; i >= 0; --i) {
      if (++at[i] < m.dims[i]) break;
      at[i] = 0;
    }
  }
}

class HostVectors final : public VectorKernel {
 public:
  void fill(float* x, float value, int64_t n) override { std::fill_n(x, n, value); }
  void copy(float* to, const float* from, int64_t n) override {
    if (to != from) std::copy_n(from, n, to);
  }
  void copy_rows(float* to, int64_t to_stride, const float* from, int64_t from_stride, int64_t width,
                 int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r) std::copy_n(from + r * from_stride, width, to + r * to_stride);
  }
  void permute(float* to, const float* from, const int64_t* dims, const int* perm, int rank) override {
    host_permute(to, from, dims, perm, rank);
  }
  // Each row's sum in double, in order.
  void sum_rows(float* to, const float* from, int64_t rows, int64_t width, float scale) override {
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0;
      for (int64_t j = 0; j < width; ++j) sum += from[r * width + j];
      to[r] = static_cast<float>(sum * scale);
    }
  }
  void spread_rows(float* to, const float* from, int64_t rows, int64_t width, float scale) override {
    for (int64_t r = 0; r < rows; ++r) std::fill_n(to + r * width, width, from[r] * scale);
  }
  void extreme_rows(float* to, const float* from, int64_t rows, int64_t width, bool max) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = from + r * width;
      float best = row[0];
      for (int64_t j = 1; j < width && !std::isnan(best); ++j)
        if (std::isnan(row[j]) || (max ? row[j] > best : row[j] < best)) best = row[j];
      to[r] = best;
    }
  }
  void route_rows(float* to, const float* x, const float* y, const float* dy, int64_t rows, int64_t width) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * width;
      float* out = to + r * width;
      std::fill_n(out, width, 0.0f);
      for (int64_t j = 0; j < width; ++j)
        if (row[j] == y[r] || (std::isnan(y[r]) && std::isnan(row[j]))) {
          out[j] = dy[r];
          break;
        }
    }
  }
  void elementwise(Elementwise op, float* to, const float* x0, const float* x1, const float* x2,
                   const Broadcast& b) override {
    host_elementwise(op, to, x0, x1, x2, b);
  }
  void matmul(float* c, const float* a, const float* b, const Matmul& m) override { host_matmul(c, a, b, m); }
  void accumulate(float* acc, const float* add, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) acc[i] += add[i];
  }
  void scale(float* x, double factor, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * factor);
  }

  // Eight independent partial sums: one running sum waits on each add's latency (about 0.6 ms
  // a step for 570K parameters here); eight vectorise.
  double squared_norm(const float* g, int64_t n) override {
    constexpr int kLanes = 8;
    double lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lanes[j] += static_cast<double>(g[i + j]) * g[i + j];
    double sum = 0.0;
    for (; i < n; ++i) sum += static_cast<double>(g[i]) * g[i];
    for (double lane : lanes) sum += lane;
    return sum;
  }

  void sgd(const SgdUpdate& u, float* w, const float* g, float* buf, int64_t n) override {
    // Locals, not u's fields: a store through w or buf could alias a field, and the compiler
    // would reload it every element instead of vectorising.
    const float lr = u.lr, mu = u.momentum, wd = u.weight_decay, damp = u.dampening;
    if (!buf) {
      for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
      return;
    }
    const bool first = u.first, nesterov = u.nesterov;
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + wd * w[i];
      buf[i] = first ? d : mu * buf[i] + (1.0f - damp) * d;
      w[i] -= lr * (nesterov ? d + mu * buf[i] : buf[i]);
    }
  }

  void adam(const AdamUpdate& u, float* w, const float* g, float* m, float* v, int64_t n) override {
    const float b1 = u.beta1, b2 = u.beta2, eps = u.eps, wd = u.weight_decay, shrink = u.shrink;
    const float step_size = u.step_size, root_c2 = u.root_c2;
    const bool decoupled = u.decoupled;
    if (decoupled)
      for (int64_t i = 0; i < n; ++i) w[i] *= shrink;
    for (int64_t i = 0; i < n; ++i) {
      const float d = decoupled ? g[i] : g[i] + wd * w[i];
      m[i] = b1 * m[i] + (1.0f - b1) * d;
      v[i] = b2 * v[i] + (1.0f - b2) * d * d;
      w[i] -= step_size * m[i] / (std::sqrt(v[i]) / root_c2 + eps);
    }
  }
};

}  // namespace

VectorKernel& host_vectors() {
  static HostVectors vectors;
  return vectors;
}

}  // namespace tandem
