// NoPeek (Vepakomma et al. 2019): the distance correlation between a batch's inputs and its
// cut activations, as a penalty the edge adds to its loss so the cut says less about the input.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

// Sample distance correlation (Szekely et al. 2007) between n samples of x (dx values each)
// and of z (dz values each), in [0, 1]; 0 when either side has no spread (all samples
// equal). With `grad_z` (n * dz floats), adds scale * dDCor/dz to it (nothing where DCor is
// 0: the square root has no derivative there). O(n^2 (dx + dz)); `work` is scratch, reused.
double distance_correlation(const float* x, int64_t dx, const float* z, int64_t dz, int64_t n, float* grad_z,
                            float scale, std::vector<double>& work);

}  // namespace tandem
