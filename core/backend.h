// The kernel contract every backend (backends/: reference, portable, xnnpack, onednn, ...)
// implements: one small interface per kernel, created once per shape and reused; backward
// passes overwrite their outputs. Backends are made by name in backends/registry.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/activation.h"
#include "core/geometry.h"
#include "core/tensor.h"
#include "core/vector_kernel.h"

namespace tandem {

// Weights as a kernel sees them. `version` changes whenever the values change (the optimizer
// bumps it), so a backend that packs weights (XNNPACK) repacks once per step, not per call.
struct WeightsView {
  const float* weight = nullptr;
  const float* bias = nullptr;  // null when the layer has no bias
  uint64_t version = 0;
};

class Conv2dKernel {
 public:
  virtual ~Conv2dKernel() = default;
  // y[N, OH, OW, OC] = conv(x[N, H, W, IC], w[OC, KH, KW, IC]) + b
  virtual void forward(const float* x, const WeightsView& w, float* y) = 0;
  // dx[N, H, W, IC] from dy[N, OH, OW, OC]
  virtual void backward_data(const float* dy, const WeightsView& w, float* dx) = 0;
  // dw[OC, KH, KW, IC] and db[OC] (db may be null) from x and dy
  virtual void backward_weights(const float* x, const float* dy, float* dw, float* db) = 0;
};

class LinearKernel {
 public:
  virtual ~LinearKernel() = default;
  // y[N, O] = x[N, I] * w[O, I]^T + b
  virtual void forward(const float* x, const WeightsView& w, float* y) = 0;
  // dx[N, I] = dy[N, O] * w[O, I]
  virtual void backward_data(const float* dy, const WeightsView& w, float* dx) = 0;
  // dw[O, I] = dy^T * x, db[O] = column sums of dy (db may be null)
  virtual void backward_weights(const float* x, const float* dy, float* dw, float* db) = 0;
};

class ReluKernel {
 public:
  virtual ~ReluKernel() = default;
  virtual void forward(const float* x, float* y) = 0;
  // dx = dy where y > 0, else 0
  virtual void backward(const float* y, const float* dy, float* dx) = 0;
};

// An activation op (relu6, gelu, silu, ...: core/activation.h) over `elements` values.
class ActivationKernel {
 public:
  virtual ~ActivationKernel() = default;
  virtual void forward(const float* x, float* y) = 0;
  // dx from the forward's input x, its output y and dy.
  virtual void backward(const float* x, const float* y, const float* dy, float* dx) = 0;
};

// y = a + b elementwise (a residual connection); its backward passes dy to both inputs.
class AddKernel {
 public:
  virtual ~AddKernel() = default;
  virtual void forward(const float* a, const float* b, float* y) = 0;
};

// Softmax over the last dimension: x, y [rows, channels].
class SoftmaxKernel {
 public:
  virtual ~SoftmaxKernel() = default;
  virtual void forward(const float* x, float* y) = 0;
  // dx = y * (dy - sum over the row of dy * y)
  virtual void backward(const float* y, const float* dy, float* dx) = 0;
};

// Batch normalisation (BatchNormGeometry), as torch.nn.BatchNorm2d/1d on x [rows, channels]:
// y = (x - mean) * inv_std * gamma + beta per channel. Forward in training computes each
// channel's mean and biased variance over the rows, and writes them and inv_std =
// 1 / sqrt(var + eps); in evaluation it reads mean and inv_std (from the running statistics)
// and leaves var alone. Backward writes dgamma and dbeta (overwriting, as Param::grad_target
// wants) and dx when not null: in training dx carries the statistics' dependence on x, in
// evaluation it is the affine map alone.
class BatchNormKernel {
 public:
  virtual ~BatchNormKernel() = default;
  virtual void forward(const float* x, const float* gamma, const float* beta, bool training, float* mean,
                       float* inv_std, float* var, float* y) = 0;
  virtual void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* inv_std,
                        bool training, float* dx, float* dgamma, float* dbeta) = 0;
};
// Inverted dropout over `elements` values (the dropout op). Forward draws keep[i] as
// dropout_mask(seed, call, p) does (core/dropout_bits.h: the same bits on every backend),
// writes them to `keep` (the caller's stash, `elements` bytes) and y = keep ? x / (1 - p) : 0.
// Backward dx = keep ? dy * scale : 0 (scale 1 / (1 - p), or 1 after an evaluation pass).
class DropoutKernel {
 public:
  virtual ~DropoutKernel() = default;
  virtual void forward(uint64_t seed, uint64_t call, float p, const float* x, float* y, uint8_t* keep) = 0;
  virtual void backward(const uint8_t* keep, float scale, const float* dy, float* dx) = 0;
};

// Token pooling (TokenPoolGeometry; the token_pool op: BERT's pooler's first token, or a masked
// mean): y[b, f] = sum over t of w[b, t] x[b, t, f] for x [batch, tokens, features], with the
// weights w [batch, tokens] the layer computes (0 for a token it leaves out, whose x is not
// read); backward dx[b, t, f] = w[b, t] dy[b, f], overwritten.
class TokenPoolKernel {
 public:
  virtual ~TokenPoolKernel() = default;
  virtual void forward(const float* x, const float* w, float* y) = 0;
  virtual void backward(const float* dy, const float* w, float* dx) = 0;
};

// An elementwise product with broadcasting (MulGeometry; the mul op): y = a * b for a
// [batch, outer, inner] and b [batch, inner] repeated over `outer` (outer 1: one shape;
// MobileNetV3's squeeze-excitation: a an image [H W, C], b its channels' gates [C]). Backward
// writes da = dy * b and db = the sum over `outer` of dy * a, each when not null, overwritten.
class MulKernel {
 public:
  virtual ~MulKernel() = default;
  virtual void forward(const float* a, const float* b, float* y) = 0;
  virtual void backward(const float* dy, const float* a, const float* b, float* da, float* db) = 0;
};

// Layer normalisation (LayerNormGeometry): y = (x - mean) / sqrt(var + eps) * gamma + beta per
// row. Forward writes each row's mean and variance (biased, as PyTorch) for backward;
// backward writes dx (when not null) and this call's dgamma and dbeta (overwriting, as
// Param::grad_target wants).
class LayerNormKernel {
 public:
  virtual ~LayerNormKernel() = default;
  virtual void forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* var) = 0;
  virtual void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* var,
                        float* dx, float* dgamma, float* dbeta) = 0;
};

// Multi-head scaled dot-product attention (AttentionGeometry). Forward: per sample and head,
// P = softmax(q k^T / sqrt(head_dim)) over the keys the mask keeps (and, causal, those not
// after the query), out = P v; P is written to `probs` [batch, heads, tokens, tokens] for
// backward. A query that sees no key (all masked) gets P = 0 and out = 0, never NaN. `mask`
// [batch, tokens] (nonzero: keep) may be null. Backward writes dq, dk, dv (each may be null)
// from dout and the forward's probs; masked keys need no mask there (their P is 0).
class AttentionKernel {
 public:
  virtual ~AttentionKernel() = default;
  virtual void forward(const float* q, const float* k, const float* v, const float* mask, float* out, float* probs) = 0;
  virtual void backward(const float* q, const float* k, const float* v, const float* probs, const float* dout,
                        float* dq, float* dk, float* dv) = 0;
};

class GlobalAvgPoolKernel {
 public:
  virtual ~GlobalAvgPoolKernel() = default;
  virtual void forward(const float* x, float* y) = 0;
  // dx[n, h, w, c] = dy[n, c] / (H * W), overwritten
  virtual void backward(const float* dy, float* dx) = 0;
};

// Max pooling carries a payload from forward to backward (argmax indices or a backend's
// workspace) in `stash`, which the caller owns: stash_bytes() of it, one per micro-batch.
class MaxPool2dKernel {
 public:
  virtual ~MaxPool2dKernel() = default;
  virtual std::size_t stash_bytes() const = 0;
  virtual void forward(const float* x, float* y, void* stash) = 0;
  // dx[N, H, W, C] (overwritten) from dy[N, OH, OW, C] and the forward's stash
  virtual void backward(const float* dy, const void* stash, float* dx) = 0;
};

// Average pooling, PyTorch's default semantics (avg_pool2d.h): no payload between passes.
class AvgPool2dKernel {
 public:
  virtual ~AvgPool2dKernel() = default;
  virtual void forward(const float* x, float* y) = 0;
  // dx[N, H, W, C] (overwritten) from dy[N, OH, OW, C]
  virtual void backward(const float* dy, float* dx) = 0;
};

// G linear layers in one call; the same contract as LinearKernel per group (geometry.h).
class GroupedLinearKernel {
 public:
  virtual ~GroupedLinearKernel() = default;
  virtual void forward(const float* x, const WeightsView& w, float* y) = 0;
  virtual void backward_data(const float* dy, const WeightsView& w, float* dx) = 0;
  virtual void backward_weights(const float* x, const float* dy, float* dw, float* db) = 0;
};

struct BackendOptions {
  int threads = 1;
};

// A backend's answer to "can you run this op": yes, or no with the reason in words a user
// can act on (what is missing, which backend has it). Asked before any kernel is made.
struct Support {
  bool ok = true;
  std::string why;  // set when !ok
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether this backend runs `op` (an op registry name, core/ops) on inputs of these
  // per-sample shapes. The default is yes: a backend overrides it for what it lacks, and
  // the network asks it for every node before making a layer.
  virtual Support supports(std::string_view op, std::span<const Shape> inputs) const;
  virtual std::unique_ptr<Conv2dKernel> conv2d(const Conv2dGeometry& g) = 0;
  virtual std::unique_ptr<LinearKernel> linear(const LinearGeometry& g) = 0;
  virtual std::unique_ptr<ReluKernel> relu(int64_t elements) = 0;
  virtual std::unique_ptr<ActivationKernel> activation(const Activation& kind, int64_t elements) = 0;
  virtual std::unique_ptr<MaxPool2dKernel> max_pool2d(const Pool2dGeometry& g) = 0;
  virtual std::unique_ptr<AvgPool2dKernel> avg_pool2d(const Pool2dGeometry& g) = 0;
  virtual std::unique_ptr<GlobalAvgPoolKernel> global_avg_pool(const GlobalPoolGeometry& g) = 0;
  virtual std::unique_ptr<SoftmaxKernel> softmax(int64_t rows, int64_t channels) = 0;
  virtual std::unique_ptr<AddKernel> add(int64_t elements) = 0;
  virtual std::unique_ptr<BatchNormKernel> batch_norm(const BatchNormGeometry& g) = 0;
  virtual std::unique_ptr<LayerNormKernel> layer_norm(const LayerNormGeometry& g) = 0;
  virtual std::unique_ptr<TokenPoolKernel> token_pool(const TokenPoolGeometry& g) = 0;
  virtual std::unique_ptr<MulKernel> mul(const MulGeometry& g) = 0;
  virtual std::unique_ptr<DropoutKernel> dropout(int64_t elements) = 0;
  virtual std::unique_ptr<AttentionKernel> attention(const AttentionGeometry& g) = 0;
  // A backend without one says so in supports("heads"); asked anyway, it throws that answer.
  virtual std::unique_ptr<GroupedLinearKernel> grouped_linear(const GroupedLinearGeometry& g);
  // The passes over parameters and gradients (Param, Optimizer, Network's gradient sums);
  // the host loops unless the backend keeps tensors elsewhere.
  virtual VectorKernel& vectors();
  // Until every kernel call and vector pass made so far has finished and its outputs may be read
  // on the host. A kernel call returns finished unless the backend lets calls run ahead (cuda
  // with managed tensors and TANDEM_CUDA_ASYNC=1); the network waits before it returns a pass
  // and before a layer that touches values on the host (Layer::touches_host). CPU: nothing.
  virtual void wait() {}
};

}  // namespace tandem
