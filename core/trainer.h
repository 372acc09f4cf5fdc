// Local training over a chain of stages (one Network, or the front and back shards of a
// split): each step cuts the batch into K micro-batches, runs them through every stage with
// the loss on the last, accumulates gradients and applies each stage's optimizer once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/length_buckets.h"
#include "core/network.h"
#include "core/optimizer.h"

namespace tandem {

struct StepStats {
  double loss_sum = 0.0;  // summed over samples
  int64_t correct = 0;
  int64_t samples = 0;
};

// Seconds each stage spent computing (forward and backward), since construction.
struct StageTimes {
  std::vector<double> busy_s;
};

class ChainTrainer {
 public:
  // Stages run in order; stage i's output is stage i+1's input. One optimizer per stage.
  ChainTrainer(std::vector<Network*> stages, std::vector<Optimizer*> optimizers);

  // One optimizer step on the first stage's inputs (each [B, ...]: images, or ids, mask...)
  // with `labels` [B], in K micro-batches. A later stage that reads the mask (Graph::split's
  // second input) gets the micro-batch's rows of it. The result equals one unpipelined step
  // on the whole batch (the gradient of the batch mean).
  StepStats train_step(std::span<const Tensor> inputs, const int32_t* labels, int microbatches);
  StepStats train_step(const Tensor& images, const int32_t* labels, int microbatches) {
    return train_step(std::span<const Tensor>(&images, 1), labels, microbatches);
  }
  // Forward only, in chunks of at most `chunk` samples; no gradients.
  StepStats evaluate(std::span<const Tensor> inputs, const int32_t* labels, int64_t chunk);
  StepStats evaluate(const Tensor& images, const int32_t* labels, int64_t chunk) {
    return evaluate(std::span<const Tensor>(&images, 1), labels, chunk);
  }
  const StageTimes& times() const { return times_; }

 private:
  std::vector<Network*> stages_;
  std::vector<Optimizer*> optimizers_;
  std::vector<Tensor> dlogits_;  // per micro-batch, so unequal sizes keep their buffers
  StageTimes times_;
  std::vector<int> mask_of_;  // per stage: the first stage's input it reads as its mask, or -1
  // Stage i's inputs for the rows [begin, begin + count) in network slot `slot`: all of them
  // for the first, cut to their length bucket, else the previous output and the mask's rows
  // (at the same length) when it reads one.
  std::span<const Tensor> stage_inputs(std::size_t i, std::span<const Tensor> inputs, const Tensor& x, int64_t begin,
                                       int64_t count, int slot);
  std::vector<Tensor> in_;
  std::vector<LengthCut> cuts_;  // per slot: the first stage's inputs as it ran them
};

}  // namespace tandem
