// The concrete layers of the core op set: Conv2d, Linear, ReLU, MaxPool2d, Flatten. Each is
// a thin binding of graph attributes to backend kernels; the maths lives in the backends.
#pragma once

#include <array>
#include <optional>

#include "core/layers/layer.h"

namespace tandem {

// Fills p with U(-bound, bound) from rng and bumps its version.
void init_uniform(Param& p, float bound, Rng& rng);
// Fills p with N(0, stddev^2) from rng and bumps its version.
void init_normal(Param& p, float stddev, Rng& rng);

class Conv2dLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Conv2dLayer(const GraphNode& node, const Shape& in, Backend& backend, Rng& rng);
  std::vector<Param*> params() override;
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;
  bool splits_backward() const override { return true; }
  void backward_data(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                     Stash& stash) override;
  void backward_weights(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, Stash& stash) override;

 private:
  Conv2dKernel& kernel(int64_t batch);
  Backend& backend_;
  Conv2dGeometry geometry_;
  Param weight_;
  std::optional<Param> bias_;
  KernelCache<Conv2dKernel> kernels_;
};

class LinearLayer final : public Layer {
 public:
  bool touches_host() const override { return lora_a_.has_value(); }  // LoRA's terms are host loops
  // x for the weight's gradient or the adapter's; a frozen linear reads nothing.
  Reads backward_reads() const override { return {weight_.trainable() || lora_a_ ? 1u : 0u, false}; }
  LinearLayer(const GraphNode& node, const Shape& in, Backend& backend, Rng& rng);
  std::vector<Param*> params() override;
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;
  bool splits_backward() const override { return true; }
  void backward_data(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                     Stash& stash) override;
  void backward_weights(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, Stash& stash) override;
  void set_training(bool training) override { training_ = training; }
  std::vector<std::pair<std::string, uint64_t*>> counters() override;

 private:
  LinearKernel& kernel(int64_t batch);
  int64_t rows(const Tensor& x) const;  // batch x tokens for a sequence
  // A LoRA adapter's kernels (x -> x A^T, then -> B) for one row count. Its temporaries
  // are the thread's (lora_scratch in linear_layer.cpp), shared by every adapter.
  struct Lora {
    std::unique_ptr<LinearKernel> down, up;
  };
  Lora& lora(int64_t batch);
  // The adapter's dropout mask for a micro-batch, drawn again from the call its stash names
  // (after x A^T and its gradient) into the thread's scratch, or null when its forward
  // dropped nothing (no dropout, or evaluation).
  const uint8_t* dropout_keep(const Stash& stash, int64_t n) const;
  // x with the mask applied and scaled by 1 / (1 - p), into `to` (n x in floats).
  const float* dropped_input(const float* x, const uint8_t* keep, int64_t n, float* to) const;
  Backend& backend_;
  LinearGeometry geometry_;
  Param weight_;
  std::optional<Param> bias_;
  std::optional<Param> lora_a_, lora_b_;  // NodeSpec::lora
  std::array<uint64_t, 2> lora_ids_{};    // their LinearGeometry::weights_id
  float lora_scale_ = 0.0f;
  float lora_dropout_ = 0.0f;
  uint64_t lora_seed_ = 0, lora_calls_ = 0;  // the dropout mask's stream (counters(): replayed on resume)
  bool training_ = true;
  KernelCache<LinearKernel> kernels_;
  KernelCache<Lora> lora_kernels_;
};

class HeadsLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  HeadsLayer(const GraphNode& node, const Shape& in, Backend& backend, Rng& rng);
  std::vector<Param*> params() override;
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;
  bool splits_backward() const override { return true; }
  void backward_data(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                     Stash& stash) override;
  void backward_weights(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, Stash& stash) override;
  int64_t count() const { return heads_.count; }

 private:
  struct Kernels {
    std::unique_ptr<LinearKernel> first;
    std::unique_ptr<ReluKernel> relu;
    std::unique_ptr<GroupedLinearKernel> second;
  };
  Kernels& kernels(int64_t batch);
  Backend& backend_;
  HeadsAttrs heads_;
  int64_t features_;
  Param w1_, b1_, w2_, b2_;
  std::vector<std::pair<int64_t, std::unique_ptr<Kernels>>> kernels_;  // per batch size
};

class ReluLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0u, true}; }  // relu's gradient reads y
  ReluLayer(std::string name, Backend& backend) : Layer(std::move(name)), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  ReluKernel& kernel(int64_t elements);
  Backend& backend_;
  KernelCache<ReluKernel> kernels_;
};

// An activation op (relu6, gelu, silu, ...): the backend's activation kernel on the whole tensor.
class ActivationLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  // x (oneDNN reads it for every kind), and y for sigmoid and tanh.
  Reads backward_reads() const override { return {1u, kind_.backward_reads_output}; }
  ActivationLayer(std::string name, const Activation& kind, Backend& backend)
      : Layer(std::move(name)), kind_(kind), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  ActivationKernel& kernel(int64_t elements);
  const Activation& kind_;
  Backend& backend_;
  KernelCache<ActivationKernel> kernels_;
};

// Inverted dropout with a seeded, counter-based mask: element i of the k-th training forward
// is kept when hash(seed, k, i) >= p, so a run is reproducible whatever the backend. The
// mask (one byte an element) stays in the micro-batch's stash for backward.
class DropoutLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0u, false}; }  // the mask is stashed
  DropoutLayer(std::string name, float p, uint64_t seed, Backend& backend)
      : Layer(std::move(name)), p_(p), seed_(seed), backend_(backend) {}
  void set_training(bool training) override { training_ = training; }
  std::vector<std::pair<std::string, uint64_t*>> counters() override {
    return {{name() + ".seed", &seed_}, {name() + ".calls", &calls_}};
  }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  DropoutKernel& kernel(int64_t elements);
  float p_;
  uint64_t seed_;
  uint64_t calls_ = 0;
  bool training_ = true;
  Backend& backend_;
  KernelCache<DropoutKernel> kernels_;
};

// Batch normalisation per channel (the last dimension); see batch_norm_layer.cpp.
class BatchNormLayer final : public Layer {
 public:
  BatchNormLayer(const GraphNode& node, const Shape& in, Backend& backend);
  std::vector<Param*> params() override;
  void set_training(bool training) override { training_ = training; }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;
  std::vector<std::pair<std::string, Tensor*>> buffers() override {
    return {{name() + ".running_mean", &running_mean_}, {name() + ".running_var", &running_var_}};
  }
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }

 private:
  BatchNormKernel& kernel(int64_t rows);

  BatchNormAttrs attrs_;
  int64_t channels_;
  Param weight_, bias_;
  Tensor running_mean_, running_var_;
  Tensor batch_var_;  // the micro-batch's biased variance, for the running statistics
  Backend& backend_;
  KernelCache<BatchNormKernel> kernels_;
  bool training_ = true;
};

// Layer normalisation over the last dimension (features), as torch.nn.LayerNorm: each row
// (a sample, or a token of one) normalised with its own statistics, scaled and shifted per
// feature; the same in training and evaluation. Kernels from the backend (oneDNN's fused
// primitive, the reference loops elsewhere).
class LayerNormLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {1u, false}; }
  LayerNormLayer(const GraphNode& node, const Shape& in, Backend& backend);
  std::vector<Param*> params() override { return {&weight_, &bias_}; }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  LayerNormKernel& kernel(int64_t rows);
  LayerNormAttrs attrs_;
  int64_t features_;
  Param weight_, bias_;
  Tensor frozen_grads_;  // frozen: where the kernel writes the gradients nobody takes
  Backend& backend_;
  KernelCache<LayerNormKernel> kernels_;
};

// Token ids (integers in f32, any shape) -> rows of a [count, features] table.
class EmbeddingLayer final : public Layer {
 public:
  Reads backward_reads() const override { return {1u, false}; }  // the ids
  EmbeddingLayer(const GraphNode& node, Rng& rng);
  std::vector<Param*> params() override { return {&weight_}; }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  int64_t count_, features_;
  Param weight_;
};

// A sequence [tokens, features] plus row t of a learned table at token t; with
// embedding.types, plus row 0 of a token-type table at every token (one segment).
class PositionEmbeddingLayer final : public Layer {
 public:
  Reads backward_reads() const override { return {0u, false}; }
  PositionEmbeddingLayer(const GraphNode& node, const Shape& in, Rng& rng);
  std::vector<Param*> params() override {
    if (types_) return {&weight_, &*types_};
    return {&weight_};
  }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  int64_t features_;  // the tokens: the input's shape[1] (length buckets)
  Param weight_;
  std::optional<Param> types_;
};

// LayoutLM's 2-D position: a sequence plus, per token, the rows its box [x0, y0, x1, y1]
// picks in the x, y, height and width tables.
class LayoutEmbeddingLayer final : public Layer {
 public:
  LayoutEmbeddingLayer(const GraphNode& node, const Shape& in, Rng& rng);
  std::vector<Param*> params() override { return {&x_, &y_, &h_, &w_}; }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  std::array<int64_t, 6> rows(const Tensor& boxes, int64_t token) const;
  int64_t count_, features_;
  Param x_, y_, h_, w_;
};

// ViT's embeddings after the patches: a learned [CLS] vector before the sequence [T, D], and
// a learned position embedding added to each of the T + 1 tokens.
class ClassTokenLayer final : public Layer {
 public:
  ClassTokenLayer(const GraphNode& node, const Shape& in, Rng& rng);
  std::vector<Param*> params() override { return {&cls_, &positions_}; }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  int64_t tokens_, features_;  // the input's
  Param cls_, positions_;
};

// Multi-head attention on query, key, value [tokens, features] and an optional mask [tokens];
// kernels from the backend, the softmax probabilities stashed per micro-batch.
class AttentionLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  // q, k, v (the probabilities are stashed), and the mask when they are computed again.
  Reads backward_reads() const override { return {recompute_ ? 0b1111u : 0b111u, false}; }
  AttentionLayer(const GraphNode& node, const Shape& in, Backend& backend);
  void set_training(bool training) override { training_ = training; }
  void set_recompute(bool recompute) override { recompute_ = recompute; }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  AttentionKernel& kernel(const Tensor& q);
  Backend& backend_;
  AttentionGeometry geometry_;  // batch and tokens set per kernel
  KernelCache<AttentionKernel> kernels_;
  bool training_ = true, recompute_ = false;
};

// A sequence [tokens, features] -> [features]: its first token, or the mean of the tokens the
// optional mask keeps.
class TokenPoolLayer final : public Layer {
 public:
  Reads backward_reads() const override { return {0b10u, false}; }  // the mask
  TokenPoolLayer(const GraphNode& node, const Shape& in, Backend& backend)
      : Layer(node.spec.name), mean_(node.spec.token_pool.mean), features_(in[1]), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  // Each sample's token weights [batch, tokens] for the kernel: 1 / kept tokens where the mask
  // keeps one, else 0 (first: 1 for token 0). Made again each pass (from the mask) into weights_.
  const float* weights(std::span<const Tensor> in);
  TokenPoolKernel& kernel(const Tensor& x);
  bool mean_;
  int64_t features_;  // the tokens: the input's shape[1] (length buckets)
  Backend& backend_;
  KernelCache<TokenPoolKernel> kernels_;
  Tensor weights_;
};

// Inputs side by side along the last dimension (channels): strided copies where the backend
// keeps the tensors; the gradient is sliced back.
class ConcatLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0u, false}; }
  ConcatLayer(std::string name, Backend& backend) : Layer(std::move(name)), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  Backend& backend_;  // its strided copies (VectorKernel::copy_rows), where the tensors are
};

// Elements [start, start + out's length) of one axis (the slice op); the gradient goes back to
// their place, zeros elsewhere. Strided copies where the backend keeps the tensors.
class SliceLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0u, false}; }
  // `axis` counts the batch (1: the first per-sample axis).
  SliceLayer(std::string name, int64_t axis, int64_t start, Backend& backend)
      : Layer(std::move(name)), axis_(axis), start_(start), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  struct Runs {
    int64_t rows, along, width, offset;  // rows of `along` (in) and `width` (out) floats; the slice's first
  };
  Runs runs(const Shape& in, const Shape& out) const;
  int64_t axis_, start_;
  Backend& backend_;
};

// A sample's axes permuted (the transpose op): one pass where the backend keeps the tensors
// (VectorKernel::permute); the gradient is permuted back.
class TransposeLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0u, false}; }
  // `perm` per sample (0: the first axis after the batch).
  TransposeLayer(std::string name, const std::vector<int>& perm, Backend& backend);
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  std::vector<int> perm_, inverse_;  // with the batch: perm_[0] = 0
  Backend& backend_;
};

// The sum or mean over some per-sample axes (the reduce op): the input permuted to put them
// last where they are not, then each row summed; backward spreads the gradient back. Passes
// where the backend keeps the tensors (VectorKernel::permute, sum_rows, spread_rows).
class ReduceLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return extreme() ? Reads{1u, true} : Reads{0u, false}; }
  // `axes` per sample (0: the first after the batch), sorted.
  ReduceLayer(std::string name, std::vector<int> axes, ReduceAttrs::Mode mode, Backend& backend);
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  struct Plan {
    std::vector<int> perm, inverse;  // with the batch; empty: the reduced axes are last already
    int64_t dims[kMaxRank];          // the input's, with the batch
    int rank;
    int64_t rows, width;
  };
  Plan plan(const Shape& in) const;
  bool extreme() const { return mode_ == ReduceAttrs::Mode::max || mode_ == ReduceAttrs::Mode::min; }
  std::vector<int> axes_;
  ReduceAttrs::Mode mode_;
  Backend& backend_;
  // The permuted input (forward; max and min's backward too) and gradient (backward), within
  // one call (one runs at a time).
  Tensor scratch_, routed_;
  float* scratch(Tensor& t, int64_t count);
};

// `full`, a gradient over a broadcast result of shape `out` (with the batch), summed over the
// axes where an input of `shape` repeated (its dimension 1, or missing) into `to`: that
// input's gradient. `scratch` holds the permuted gradient where those axes are not last.
void sum_to_shape(VectorKernel& v, float* to, const Shape& shape, const float* full, const Shape& out, Tensor& scratch);

// a @ b of two computed tensors (the matmul op): VectorKernel::matmul forward, and for
// backward dC B^T and A^T dC over the whole batch, each summed to its input's shape.
class MatmulLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0b11u, false}; }
  MatmulLayer(std::string name, Backend& backend) : Layer(std::move(name)), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  Backend& backend_;
  Tensor full_, permuted_;  // a gradient over the whole batch, and it permuted (one call at a time)
};

// a op b elementwise with numpy's broadcasting (the binary op), or a op scalar (scalar op a)
// for one input: VectorKernel::elementwise; backward writes each input's gradient over the
// whole output, then sums it over the axes that input was repeated on (permute and sum_rows,
// as ReduceLayer). Passes where the backend keeps the tensors.
class BinaryLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override;
  // A trained operand (field binary.operand) starts at 1 for mul and div, 0 for add and sub.
  BinaryLayer(const GraphNode& node, Backend& backend);
  std::vector<Param*> params() override {
    return operand_ ? std::vector<Param*>{operand_.get()} : std::vector<Param*>{};
  }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  // Each operand's strides against the output (with the batch); the scalar (one input) as
  // operand 1 (0 first) at stride 0, the trained operand at its own with the batch's 0.
  Broadcast broadcast(std::span<const Tensor> in, const Shape& out);
  float* scratch(Tensor& t, int64_t count);
  BinaryAttrs attrs_;
  Backend& backend_;
  Tensor scalar_;             // one float: the constant operand, where the backend keeps tensors
  std::unique_ptr<Param> operand_;  // the trained operand; null: none
  Shape operand_shape_;             // [1, operand...]: as an input of a batch of one
  Tensor full_, permuted_;   // a gradient over the whole output, and it permuted (one call at a time)
};

// A sample repeated along its axes of 1 (the expand op): forward a broadcast copy
// (VectorKernel::elementwise with one operand), backward the gradient summed over the
// repeated axes (sum_to_shape).
class ExpandLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0u, false}; }  // shapes only
  ExpandLayer(std::string name, Backend& backend) : Layer(std::move(name)), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  Backend& backend_;
  Tensor permuted_;  // sum_to_shape's scratch
};

// cond ? a : b (the where op), a or b a constant where the node gives one: forward one select
// (VectorKernel::elementwise); backward dy selected into each input's place (0 elsewhere),
// summed where it was repeated. Backward reads cond only.
class WhereLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {1u, false}; }
  WhereLayer(const GraphNode& node, Backend& backend);
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  // The strides of cond, a and b against `out` (with the batch); a given constant's are 0.
  Broadcast broadcast(std::span<const Tensor> in, const Shape& out) const;
  WhereAttrs attrs_;
  Backend& backend_;
  Tensor constants_;  // a and b where given (two floats), where the backend keeps tensors
  Tensor full_, permuted_;  // a branch's gradient over the whole output; sum_to_shape's scratch
};

// a + b (residual connections); the gradient goes to both inputs unchanged.
class AddLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0u, false}; }
  AddLayer(std::string name, Backend& backend) : Layer(std::move(name)), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  Backend& backend_;
  KernelCache<AddKernel> kernels_;
};

// a * b, b broadcast over a's leading dimensions (the mul op; MulKernel): each sample's a
// [outer, inner] and b [inner]. Backward reads both inputs, not the output.
class MulLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0b11u, false}; }
  MulLayer(std::string name, Backend& backend) : Layer(std::move(name)), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  MulKernel& kernel(std::span<const Tensor> in);
  Backend& backend_;
  KernelCache<MulKernel> kernels_;
};

// Softmax over the last dimension (probabilities as a layer; training losses take logits).
class SoftmaxLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  Reads backward_reads() const override { return {0u, true}; }
  SoftmaxLayer(std::string name, const Shape& in, Backend& backend)
      : Layer(std::move(name)), channels_(in[in.rank() - 1]), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  SoftmaxKernel& kernel(int64_t rows);
  int64_t channels_;
  Backend& backend_;
  KernelCache<SoftmaxKernel> kernels_;
};

// [N, H, W, C] -> [N, C], the mean of each channel.
class GlobalAvgPoolLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  GlobalAvgPoolLayer(std::string name, const Shape& in, Backend& backend)
      : Layer(std::move(name)), in_(in), backend_(backend) {}
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  GlobalAvgPoolKernel& kernel(int64_t batch);
  Shape in_;  // per sample [H, W, C]
  Backend& backend_;
  KernelCache<GlobalAvgPoolKernel> kernels_;
};

class MaxPool2dLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  MaxPool2dLayer(const GraphNode& node, const Shape& in, Backend& backend);
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

  // Applies a ReLU to the pooled output (and its gradient) for the ReLU that fed this pool:
  // max commutes with ReLU, and the pooled tensor is kernel_h * kernel_w times smaller.
  // Only without padding, so that every window sees at least one input.
  bool can_fuse_relu() const { return geometry_.pad_h == 0 && geometry_.pad_w == 0; }
  void fuse_relu() { relu_ = true; }

 private:
  MaxPool2dKernel& kernel(int64_t batch);
  ReluKernel& relu(int64_t elements);
  Backend& backend_;
  Pool2dGeometry geometry_;
  KernelCache<MaxPool2dKernel> kernels_;
  bool relu_ = false;
  KernelCache<ReluKernel> relus_;
  // The fused ReLU's output gradient, written and read within one backward (one runs at a
  // time), kept at the largest size seen: in the slot's stash it cost every micro-batch in
  // flight a pooled tensor.
  Tensor masked_;
};

class AvgPool2dLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  AvgPool2dLayer(const GraphNode& node, const Shape& in, Backend& backend);
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;

 private:
  AvgPool2dKernel& kernel(int64_t batch);
  Backend& backend_;
  Pool2dGeometry geometry_;
  KernelCache<AvgPool2dKernel> kernels_;
};

// A node whose output is its input seen with another shape (flatten), or a ReLU folded into
// the max pool that reads it: the network aliases the tensors.
class ViewLayer final : public Layer {
 public:
  bool touches_host() const override { return false; }  // kernels only
  explicit ViewLayer(std::string name) : Layer(std::move(name)) {}
  bool is_view() const override { return true; }
  void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) override;
  void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash& stash) override;
};

}  // namespace tandem
