// Losses on outputs [N, C] with integer labels: softmax cross-entropy (computed stably in one
// pass) and mean squared error against the labels' one-hot vectors. The gradient scale lets K
// micro-batches add up to the gradient of the mean over the batch.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace tandem {

// Returns the summed loss over the N rows. When dlogits is given, writes
// (softmax(logits) - onehot(label)) * grad_scale into it (grad_scale = 1 / full batch size).
// Throws Error for a label outside [0, C). With `groups` > 1 the logits are G heads' side by
// side ([N, G*C], heads.h): each head's loss against the same label, averaged over the heads.
double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float grad_scale, Tensor* dlogits,
                             int64_t groups = 1);

// torch.nn.MSELoss(reduction='mean') of the outputs against one-hot(label) (the wire carries
// class labels, so the target of a classification model is the label's one-hot): returns the
// sum over rows of each row's mean squared error, so that dividing by N gives torch's mean
// over N * C; dlogits = 2 (y - onehot) / C * grad_scale. Groups as above.
double mse_onehot(const Tensor& outputs, const int32_t* labels, float grad_scale, Tensor* dlogits, int64_t groups = 1);

// The loss a spec names ("softmax_cross_entropy" or "mse"); throws Error for another name.
double compute_loss(const std::string& loss, const Tensor& outputs, const int32_t* labels, float grad_scale,
                    Tensor* doutputs, int64_t groups = 1);

// Rows whose largest logit is at the label; with groups, of the heads' mean logits (the
// ensemble's prediction).
int64_t count_correct(const Tensor& logits, const int32_t* labels, int64_t groups = 1);

}  // namespace tandem
