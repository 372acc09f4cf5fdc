#include "core/param.h"

namespace tandem {

Param::Param(std::string name, const Shape& shape)
    : name_(std::move(name)), value_(Tensor::zeros(shape)), grad_(Tensor::zeros(shape)),
      scratch_(Tensor::empty(shape)) {}

void Param::commit_grad() {
  if (accumulating_) {
    float* g = grad_.data();
    const float* s = scratch_.data();
    for (int64_t i = 0, n = grad_.numel(); i < n; ++i) g[i] += s[i];
  }
  accumulating_ = true;
}

void Param::zero_grad() {
  if (trainable_) grad_.fill(0.0f);
  accumulating_ = false;
}

void Param::freeze() {
  trainable_ = false;
  grad_ = Tensor();
  scratch_ = Tensor();
}

}  // namespace tandem
