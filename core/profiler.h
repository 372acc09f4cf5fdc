// Per-layer timing of one shard on its backend: forward and backward wall time of every
// node at a given micro-batch size, the bytes each node's output takes per sample, and the
// node's FLOPs (the op registry's) so that times read as achieved GFLOP/s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/network.h"
#include "core/ops/op.h"

namespace tandem {

struct LayerProfile {
  std::string node, op;
  double forward_s = 0.0, backward_s = 0.0;  // median over the iterations, one micro-batch
  int64_t output_bytes_per_sample = 0;       // f32 output of the node
  OpCost cost;                               // per sample, from the op registry (core/ops)
  double weights_s = 0.0;  // of backward_s: the weight gradients, which a party in the middle defers
  // Achieved GFLOP/s of each pass at `batch` samples (0 where the pass has no FLOPs).
  double forward_gflops(int64_t batch) const;
  double backward_gflops(int64_t batch) const;
};

// Runs `warmup` then `iterations` forward + backward passes of micro-batches of `batch`
// random inputs through `net` (slot 0), with a fixed output gradient, and reports each
// node's median times. Parameter gradients accumulate in `net` and are zeroed at the end.
// input_grad: also compute the gradient of input 0 (a back shard sends it to the edge);
// without, `net` is told so (Network::set_input_gradient(false): a front) for good.
std::vector<LayerProfile> profile_layers(Network& net, int64_t batch, int iterations, int warmup = 3,
                                         bool input_grad = false);

}  // namespace tandem
