// Pipeline schedules as objects, for any number of stages: the order in which each stage
// runs its micro-batches' forwards and backwards within one step. GPipe (every forward, then
// every backward), 1F1B (torch.distributed.pipelining's memory-lean order: a stage keeps at
// most stages - index micro-batches in flight) and input-gradients-first (zero bubble,
// after ZB-H1: a backward split into the input gradient, which the stage upstream waits for,
// and the weight gradients, run later where the stage would otherwise idle). Every schedule
// gives the same gradients: only the order and the memory in flight differ.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace tandem {

struct PipelineAction {
  enum class Kind {
    Forward,         // forward (and, on the last stage, the loss and its gradient)
    Backward,        // the whole backward: input and weight gradients
    BackwardInput,   // the input gradient only; the weight gradients wait for BackwardWeight
    BackwardWeight,  // the weight gradients a BackwardInput left
  };
  Kind kind;
  int microbatch;
  int step = 0;  // 0: this step's; -1: the step before's (an asynchronous schedule's backwards)
  bool operator==(const PipelineAction&) const = default;
};

// "F3", "B0", "I2", "W2" (and "B0'" for the step before's): for errors and tests.
std::string action_text(const PipelineAction& a);

class PipelineSchedule {
 public:
  virtual ~PipelineSchedule() = default;
  virtual const char* name() const = 0;
  // Stage `stage` (0-based) of `stages`: its actions for one step of `microbatches`, in order.
  virtual std::vector<PipelineAction> actions(int stage, int stages, int microbatches) const = 0;
  // Whether a step's backwards run during the next step (PipelineAction::step -1) on every
  // stage but the last, each on the weights its forward used (weight stashing), the stage's
  // update after them (AsyncStashSchedule).
  virtual bool asynchronous() const { return false; }
};

class GPipeSchedule final : public PipelineSchedule {
 public:
  const char* name() const override { return "gpipe"; }
  std::vector<PipelineAction> actions(int stage, int stages, int microbatches) const override;
};

class OneFOneBSchedule final : public PipelineSchedule {
 public:
  const char* name() const override { return "1f1b"; }
  std::vector<PipelineAction> actions(int stage, int stages, int microbatches) const override;
};

class ZeroBubbleSchedule final : public PipelineSchedule {
 public:
  const char* name() const override { return "zero-bubble"; }
  std::vector<PipelineAction> actions(int stage, int stages, int microbatches) const override;
};

// Asynchronous with weight stashing: the stages before the last forward this step's
// micro-batches and back up the step before's in turn (F0 B0' F1 B1' ...), each backward on
// the weights its forward used, the update after them: their gradients are one update stale
// (PipeDream-2BW: W[t+1] = W[t] - lr g(W[t-1])). The last stage, which holds the loss, runs
// F B F B ... on its current weights, synchronous, as tandem's cloud does in a two-party run
// (whole-model staleness with SGD's momentum 0.9 failed to train Fashion-MNIST, 15% against
// 79.5%). Nobody waits for a step to drain before the next one fills the pipeline.
class AsyncStashSchedule final : public PipelineSchedule {
 public:
  const char* name() const override { return "async"; }
  std::vector<PipelineAction> actions(int stage, int stages, int microbatches) const override;
  bool asynchronous() const override { return true; }
};

// "gpipe", "1f1b", "zero-bubble" or "async"; an Error listing them for another name.
std::unique_ptr<PipelineSchedule> make_pipeline_schedule(const std::string& name);
const char* pipeline_schedule_names();

// What one micro-batch costs a stage, in seconds (or any unit): its forward (with the loss
// on the last), its backward's input half and weight half (a whole backward costs both), and
// the hop to the next stage, each way (activations down, their gradient back: each hop a
// first-come-first-served resource).
struct StageCost {
  double forward = 1, backward_input = 1, backward_weight = 1;
  double link = 0;
};

// The schedule run with the stages' costs and messages taking the links' time: the step's
// length, the bubble fraction (the share of stage-time spent idle) and each stage's peak
// micro-batches in flight. An Error names the first stage that would wait forever, or an
// action a schedule lists twice or leaves out. Without costs, every action takes one unit
// (a backward two) and messages arrive at once. An asynchronous schedule's step is simulated
// in steady state: the step before's backwards start from the last stage at once.
struct ScheduleSimulation {
  double length = 0;
  double bubble = 0;
  std::vector<int> peak_in_flight;  // per stage: the most micro-batches forwarded and not yet backed up
};
ScheduleSimulation simulate(const PipelineSchedule& schedule, const std::vector<StageCost>& stages, int microbatches);
ScheduleSimulation simulate(const PipelineSchedule& schedule, int stages, int microbatches);

}  // namespace tandem
