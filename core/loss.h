// Softmax cross-entropy on logits [N, C] with integer labels, computed stably in one pass;
// the gradient scale lets K micro-batches add up to the gradient of the mean over the batch.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem {

// Returns the summed loss over the N rows. When dlogits is given, writes
// (softmax(logits) - onehot(label)) * grad_scale into it (grad_scale = 1 / full batch size).
// Throws Error for a label outside [0, C).
double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float grad_scale, Tensor* dlogits);

// Rows whose largest logit is at the label.
int64_t count_correct(const Tensor& logits, const int32_t* labels);

}  // namespace tandem
