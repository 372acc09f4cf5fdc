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
