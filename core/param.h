// A trainable parameter: values, accumulated gradient and a version the optimizer bumps, so
// kernels that pack weights know when to repack. Gradients accumulate over micro-batches, by
// the backend's VectorKernel (bound by the network; the host loops until then).
#pragma once

#include <string>

#include "core/backend.h"
#include "core/tensor.h"

namespace tandem {

class Param {
 public:
  Param(std::string name, const Shape& shape);

  const std::string& name() const { return name_; }
  Tensor& value() { return value_; }
  const Tensor& value() const { return value_; }
  const Tensor& grad() const { return grad_; }
  Tensor& grad() { return grad_; }
  uint64_t version() const { return version_; }
  // Call after changing value() in place.
  void bump_version() { ++version_; }
  // A frozen parameter keeps its value and has no gradient (grad() and grad_target() are
  // empty): its layer skips its gradient, and no optimizer, checkpoint or round holds it.
  void freeze();
  bool trainable() const { return trainable_; }

  // Where a kernel should write this micro-batch's gradient (it overwrites), then
  // commit_grad() adds it to the accumulated gradient. After zero_grad() the first write
  // lands directly in grad(), so K = 1 costs no extra pass.
  float* grad_target() { return !trainable_ ? nullptr : accumulating_ ? scratch_.data() : grad_.data(); }
  void commit_grad();
  void zero_grad();

  // The passes over its values and gradients (the backend of the network it belongs to, whose
  // memory its tensors are in); the optimizers use it too.
  void bind(VectorKernel& vectors) { vectors_ = &vectors; }
  VectorKernel& vectors() const { return *vectors_; }

 private:
  std::string name_;
  Tensor value_, grad_, scratch_;
  uint64_t version_ = 1;
  bool accumulating_ = false;  // grad() already holds a contribution
  bool trainable_ = true;
  VectorKernel* vectors_;
};

// What a kernel sees of a layer's weight and optional bias. Versions only grow, so their sum
// changes whenever either parameter changes.
inline WeightsView view_of(const Param& weight, const Param* bias) {
  return {weight.value().data(), bias ? bias->value().data() : nullptr,
          weight.version() + (bias ? bias->version() : 0)};
}

}  // namespace tandem
