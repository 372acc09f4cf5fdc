#include "core/param.h"

#include "core/host_vectors.h"

namespace tandem {

Param::Param(std::string name, const Shape& shape)
    : name_(std::move(name)), value_(Tensor::zeros(shape)), grad_(Tensor::zeros(shape)),
      scratch_(Tensor::empty(shape)), vectors_(&host_vectors()) {}

void Param::commit_grad() {
  if (accumulating_) vectors_->accumulate(grad_.data(), scratch_.data(), grad_.numel());
  accumulating_ = true;
}

void Param::zero_grad() {
  if (trainable_) vectors_->fill(grad_.data(), 0.0f, grad_.numel());
  accumulating_ = false;
}

void Param::freeze() {
  trainable_ = false;
  grad_ = Tensor();
  scratch_ = Tensor();
}

}  // namespace tandem
