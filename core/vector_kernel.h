// The passes over parameters and gradients a backend runs where it keeps tensors (VectorKernel)
// and the optimizer steps' constants they take. Plain C++17: nvcc compiles the cuda kernels with it.
#pragma once

#include <cstdint>

namespace tandem {

// One optimizer step's constants for VectorKernel::sgd and ::adam (core/optimizer.cpp sets
// them as torch.optim does).
struct SgdUpdate {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first;  // the momentum buffer takes the gradient as it is (torch's first step)
};
struct AdamUpdate {
  float step_size;  // lr / (1 - beta1^t)
  float root_c2;    // sqrt(1 - beta2^t)
  float beta1, beta2, eps, weight_decay;
  float shrink;     // AdamW: weights scale by 1 - lr * weight_decay first
  bool decoupled;   // AdamW (else Adam, decay added to the gradient)
};

// An elementwise pass over operands broadcast to one shape (the binary op's): `dims` the
// output's (row-major, rank at most 6), and each operand's step along each axis, 0 where it is
// repeated (numpy's broadcasting).
constexpr int kBroadcastRank = 6;
enum class Elementwise : int {
  add,       // x0 + x1
  sub,       // x0 - x1
  mul,       // x0 * x1
  div,       // x0 / x1
  div_right,  // -x0 * x1 / (x2 * x2): d(a / b)/db times dy, with x0 = dy, x1 = a, x2 = b
  select,     // x0 != 0 ? x1 : x2 (torch.where, ONNX's Where; the branch not taken is not read into the sum)
  // Comparisons: 1 where true, else 0 (ONNX's Equal, Less, ...; their outputs train nothing)
  equal,          // x0 == x1
  not_equal,      // x0 != x1
  less,           // x0 < x1
  greater,        // x0 > x1
  less_equal,     // x0 <= x1
  greater_equal,  // x0 >= x1
};
struct Broadcast {
  int rank;
  int64_t dims[kBroadcastRank];
  int64_t strides[3][kBroadcastRank];  // operand k's step along axis i
};

// Products C_p = A_p B_p of `count` pairs of matrices (the matmul op's): A_p [m][k] and B_p
// [k][n] read at element steps (A(i, l) = a[i * a_row + l * a_col]: a transposed operand is
// the same memory read the other way), the pairs at the batch axes' steps (0 where an operand
// repeats); C_p [m][n] contiguous, one after the other in the batch axes' row-major order.
struct Matmul {
  int64_t m, n, k;
  int64_t a_row, a_col, b_row, b_col;
  int rank;  // batch axes
  int64_t dims[kBroadcastRank];
  int64_t a_steps[kBroadcastRank], b_steps[kBroadcastRank];
};

// Passes over a parameter's or a gradient's floats: gradient sums, fills and copies, the
// global norm, the optimizers' updates. They run where the backend keeps tensors (on the
// device for cuda's managed tensors), so that core never touches values there on the host
// in a step. CPU backends share the host loops (host_vectors(), core/host_vectors.h).
class VectorKernel {
 public:
  virtual ~VectorKernel() = default;
  virtual void fill(float* x, float value, int64_t n) = 0;
  virtual void copy(float* to, const float* from, int64_t n) = 0;
  // `rows` runs of `width` floats, a row `from_stride` floats after the one before in `from`
  // and `to_stride` in `to` (concat's columns).
  virtual void copy_rows(float* to, int64_t to_stride, const float* from, int64_t from_stride, int64_t width,
                         int64_t rows) = 0;
  // `from`, a row-major tensor of `rank` (at most 6) dimensions `dims`, with its axes permuted
  // into `to`: output axis i is input axis perm[i] (transpose's forward, and its backward with
  // the inverse order).
  virtual void permute(float* to, const float* from, const int64_t* dims, const int* perm, int rank) = 0;
  // to[r] = scale * (the sum of from[r * width ... r * width + width - 1]), for `rows` rows
  // (reduce's forward), and its transpose: to[r * width + j] = scale * from[r] (its backward).
  virtual void sum_rows(float* to, const float* from, int64_t rows, int64_t width, float scale) = 0;
  virtual void spread_rows(float* to, const float* from, int64_t rows, int64_t width, float scale) = 0;
  // to[r] = the maximum (max) or the minimum of row r of `from` (NaN where the row holds one):
  // reduce's max and min; and their backward: to[r * width + j] = dy[r] at the first j where
  // x's row r holds y[r], 0 elsewhere.
  virtual void extreme_rows(float* to, const float* from, int64_t rows, int64_t width, bool max) = 0;
  virtual void route_rows(float* to, const float* x, const float* y, const float* dy, int64_t rows, int64_t width) = 0;
  // to[i] = op(x0, x1, x2) at output index i, each operand read at its strides (x2 only for
  // div_right; unused operands may be null).
  virtual void elementwise(Elementwise op, float* to, const float* x0, const float* x1, const float* x2,
                           const Broadcast& b) = 0;
  // c = the products m describes (sums in float, in k's order).
  virtual void matmul(float* c, const float* a, const float* b, const Matmul& m) = 0;
  virtual void accumulate(float* acc, const float* add, int64_t n) = 0;  // acc += add
  virtual void scale(float* x, double factor, int64_t n) = 0;           // x = float(x * factor)
  virtual double squared_norm(const float* x, int64_t n) = 0;           // in double
  // squared_norm of each of `count` arrays (x[i] of n[i] floats) into out[i]: the optimizer's
  // global norm, one wait for all where the backend runs them on a device.
  virtual void squared_norms(const float* const* x, const int64_t* n, int count, double* out) {
    for (int i = 0; i < count; ++i) out[i] = squared_norm(x[i], n[i]);
  }
  // torch.optim.SGD on w with gradient g (momentum null when momentum is 0).
  virtual void sgd(const SgdUpdate& u, float* w, const float* g, float* momentum, int64_t n) = 0;
  // torch.optim.Adam / AdamW on w with gradient g and moments m, v.
  virtual void adam(const AdamUpdate& u, float* w, const float* g, float* m, float* v, int64_t n) = 0;
  // Until the passes above have finished, where a backend lets them run ahead of the host
  // (cuda with TANDEM_CUDA_ASYNC=1); squared_norm always returns finished. Host loops: nothing.
  virtual void wait() {}
};

}  // namespace tandem
