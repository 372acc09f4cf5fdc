// FedAvg's step, in one place for the two-party federation (cloud/federation) and the
// first parties sharing a pipeline's later stages (pipeline/stage_peer): several parties'
// copies of the same tensors averaged, each weighted by the samples it trained on.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace tandem {

// `out[k]` becomes the average of parts[p][k] over the parts, part p weighted by
// samples[p] / (the sum of samples), or equally when every part reports 0; summed in double.
// Every part holds tensors shaped as `out`'s (the caller has checked them).
void federated_average(std::span<const std::vector<Tensor>* const> parts, std::span<const uint64_t> samples,
                       std::span<Tensor> out);

}  // namespace tandem
