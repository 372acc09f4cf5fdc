// The in-process pipeline: N stages joined by local links, run under a schedule, for tests,
// `tandem train` and benchmarks. Each step cuts the batch into K micro-batches, runs every
// stage's actions in the schedule's order (the loss on the last stage), and applies each
// stage's optimizer once: the result equals one step of whole-model training on the batch,
// under every synchronous schedule. With threads, each stage runs on its own thread and waits
// only for its links, as the stages of a pipeline across machines do; without, one thread
// runs the actions in an order the links allow. Under the asynchronous schedule a step's
// backwards and update run during the next train_step (flush() runs the last one's).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/length_buckets.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"

namespace tandem {

struct StepStats {
  double loss_sum = 0.0;  // summed over samples
  int64_t correct = 0;
  int64_t samples = 0;
};

// Per stage, seconds computing (forward, backward, step) and, with threads, waiting on a
// link within a step; and the steps' wall time. Since construction.
struct StageTimes {
  std::vector<double> busy_s, idle_s;
  double wall_s = 0;
  // The share of stage-time spent idle: 1 - sum(busy) / (stages * wall). Threads only.
  double bubble() const;
};

class LocalPipeline {
 public:
  struct Options {
    std::string schedule = "gpipe";  // make_pipeline_schedule's names (and "async")
    bool threads = false;            // a thread a stage (their backends must not be shared)
  };
  // Stages run in order; stage i's output is stage i+1's input. One optimizer per stage.
  LocalPipeline(std::vector<Network*> stages, std::vector<Optimizer*> optimizers, Options options);
  LocalPipeline(std::vector<Network*> stages, std::vector<Optimizer*> optimizers)
      : LocalPipeline(std::move(stages), std::move(optimizers), Options{}) {}
  ~LocalPipeline();

  // One optimizer step on the first stage's inputs (each [B, ...]: images, or ids, mask...)
  // with `labels` [B], in K micro-batches. A later stage that reads the mask (Graph::split's
  // second input) gets the micro-batch's rows of it, at the length the first stage ran.
  StepStats train_step(std::span<const Tensor> inputs, const int32_t* labels, int microbatches);
  StepStats train_step(const Tensor& images, const int32_t* labels, int microbatches) {
    return train_step(std::span<const Tensor>(&images, 1), labels, microbatches);
  }
  // Asynchronous: the last step's backwards and update, now (a no-op when none is pending).
  void flush();
  // Forward only, in chunks of at most `chunk` samples; no gradients. Flushes first.
  StepStats evaluate(std::span<const Tensor> inputs, const int32_t* labels, int64_t chunk);
  StepStats evaluate(const Tensor& images, const int32_t* labels, int64_t chunk) {
    return evaluate(std::span<const Tensor>(&images, 1), labels, chunk);
  }
  const StageTimes& times() const { return times_; }
  const PipelineSchedule& schedule() const { return *schedule_; }
  std::size_t size() const { return stages_.size(); }
  Stage& stage(std::size_t i) { return stages_[i]; }

 private:
  struct Step;
  // The network slot of an action's micro-batch: asynchronous steps alternate between two
  // sets of K, so a step's stashes live while the next one forwards.
  int slot_of(const Step& step, const PipelineAction& a) const;
  bool ready(const Step& step, std::size_t s, const PipelineAction& a) const;
  void run(Step& step, std::size_t s, const PipelineAction& a);
  void run_sequential(Step& step);
  void run_threads(Step& step);
  // After a stage's actions: its update (when it backed a step up) and, asynchronous, its
  // stash of the weights this step's forwards used.
  void finish_stage(Step& step, std::size_t s);
  void begin_step(Step& step, std::span<const Tensor> inputs, const int32_t* labels, int microbatches);
  // After a step that threw (a stage's Error): the current weights back in every stage, no
  // weight pass or asynchronous backward pending, gradients zeroed; the step is lost (and,
  // asynchronous, the step before's pending backwards), and the next one starts clean. (A
  // stage that had already applied its update keeps it.)
  void abandon();
  void run_step(Step& step);
  // Stage i's inputs for micro-batch `mb` in `slot`: all of the step's rows [begin, begin +
  // count) for the first, cut to their length bucket (copied when asynchronous: the caller
  // refills its batch before the backward), else the previous stage's output and the mask.
  std::span<const Tensor> stage_inputs(Step& step, std::size_t i, int mb, int slot);

  std::vector<Stage> stages_;
  std::unique_ptr<PipelineSchedule> schedule_;
  bool threads_ = false;
  std::vector<int> mask_of_;  // per stage: the first stage's input it reads as its mask, or -1
  std::vector<std::vector<Tensor>> in_;  // per stage: its inputs' scratch
  std::vector<LengthCut> cuts_;           // per slot: the first stage's inputs as it ran them
  std::vector<std::vector<Tensor>> grads_;  // per stage > 0, per slot: the input gradient sent up
  StageTimes times_;
  std::unique_ptr<Step> step_;
  bool async_ = false;
  int64_t steps_ = 0;           // train_step calls so far (an asynchronous slot set's parity)
  int pending_ = 0;             // asynchronous: the K of the step whose backwards are pending (0: none)
  std::vector<std::vector<Tensor>> owned_inputs_;  // asynchronous, per slot: the first stage's inputs, copied
};

}  // namespace tandem
