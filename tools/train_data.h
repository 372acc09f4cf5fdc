// The data a training command reads and the order it reads it in, shared by `tandem train`
// and the first stage of `tandem stage`, so that a pipeline across parties trains on exactly
// the batches one process would: Fashion-MNIST or a data set folder, shuffled each epoch by
// a generator seeded from --seed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cli/cli_args.h"
#include "core/backend.h"
#include "core/graph.h"
#include "core/network.h"
#include "core/random.h"
#include "pipeline/local_pipeline.h"
#include "ports/files/tensor_dataset.h"

namespace tandem {

struct TrainingSets {
  LabelledInputs train, test;
};

// --data fashion-mnist (Debian's dataset-fashion-mnist; the model must take one image of its
// size) or --data DIR (DIR/train.safetensors and DIR/test.safetensors: a tensor per model
// input and "labels"); --limit and --test-limit keep the first samples. Says what it loads.
TrainingSets load_training_sets(const CliArgs& args, const Graph& graph);

// One of `count` first parties' share of `set`: samples `first`, first + count, ..., each
// share as large as every other (the set's size / count; the rest is left out), so that the
// parties taking turns on shared stages have as many steps an epoch.
LabelledInputs every_nth(const LabelledInputs& set, uint32_t first, uint32_t count);

// The test set in order, `batch` samples at a time (never at its own size: kernels and
// activations would be built for it; spam-bert's 1202 mails at once took 9 GB), through
// `evaluate(rows, labels, begin)`; the sums of what it returns. Nothing when the set is empty.
StepStats evaluate_in_batches(
    const Graph& graph, const LabelledInputs& set, int64_t batch, uint64_t seed,
    const std::function<StepStats(std::span<const Tensor> rows, const int32_t* labels, int64_t begin)>& evaluate);

// An epoch's batches: the samples in a fresh shuffled order each epoch, copied into a step's
// rows (the last batch may be short).
class EpochBatches {
 public:
  EpochBatches(const Graph& graph, const LabelledInputs& set, int64_t batch, uint64_t seed);
  void shuffle();  // at each epoch's start
  int64_t samples() const { return static_cast<int64_t>(set_.labels.size()); }
  int64_t steps() const { return (samples() + batch_ - 1) / batch_; }
  // The rows of the batch starting at sample `begin` of the epoch's order, each input's
  // [count, ...], and their labels (valid until the next call).
  std::vector<Tensor> rows(int64_t begin, const int32_t*& labels);
  // Only the labels of that batch.
  const int32_t* labels(int64_t begin);

 private:
  const Graph& graph_;
  const LabelledInputs& set_;
  int64_t batch_;
  Rng rng_;
  std::vector<int64_t> order_;
  std::vector<Tensor> inputs_;
  std::vector<int32_t> labels_;
};

// The labels of any step of a run, from the data and the seed alone: what the loss stage of
// a pipeline whose labels stay at the first party reads on that party's machine. Steps count
// from 0 across epochs, `steps()` a epoch, as the first party leads them.
class StepLabels {
 public:
  StepLabels(const Graph& graph, const LabelledInputs& set, int64_t batch, uint64_t seed);
  std::span<const int32_t> of(uint64_t step);

 private:
  const Graph& graph_;
  const LabelledInputs& set_;
  int64_t batch_;
  uint64_t seed_;
  std::unique_ptr<EpochBatches> batches_;
  int64_t epoch_ = -1;  // the epoch batches_ is shuffled for (0-based)
  std::vector<int32_t> labels_;
};

}  // namespace tandem
