// Softmax cross-entropy on logits [N, C] with integer labels, computed stably in one pass;
// the gradient scale lets K micro-batches add up to the gradient of the mean over the batch.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem {

// Returns the summed loss over the N rows. When dlogits is given, writes
// (softmax(logits) - onehot(label)) * grad_scale into it (grad_scale = 1 / full batch size).
// Throws Error for a label outside [0, C). With `groups` > 1 the logits are G heads' side by
// side ([N, G*C], heads.h): each head's loss against the same label, averaged over the heads.
double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float grad_scale, Tensor* dlogits,
                             int64_t groups = 1);

// Rows whose largest logit is at the label; with groups, of the heads' mean logits (the
// ensemble's prediction).
int64_t count_correct(const Tensor& logits, const int32_t* labels, int64_t groups = 1);

}  // namespace tandem
