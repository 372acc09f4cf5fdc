// One edge's share of a data set, for split-federated runs and their tests: `iid` deals the
// samples out like cards after a fixed shuffle; `class` sorts them by class and gives each
// edge one contiguous, equal slice (non-IID: each hospital sees only a few diagnoses, 2 or
// 3 of Fashion-MNIST's 10 with 4 edges).
#pragma once

#include <string>

#include "data/idx_dataset.h"

namespace tandem {

// index in [0, count); throws Error for a bad index, count or scheme, or an empty share.
LabelledImages partition(const LabelledImages& all, int index, int count, const std::string& scheme);

}  // namespace tandem
