// The partitioner: where to cut a model into a pipeline over a chain of machines, from each
// machine's speed and memory and each link's bandwidth (Ravnest's node configs, PipeDream's
// partitioner). Every choice of cuts among the legal ones, one stage a machine, and every K
// is predicted by simulating the schedule with the stages' costs (pipeline/schedule.h); the
// chosen plan has the most samples/s among those that fit every machine's memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/network.h"

namespace tandem {

// One machine of the chain, in the order the data flows (the first holds the data).
struct PipelineNode {
  std::string name;
  double gflops = 0;     // what it sustains in training (measure it: `tandem profile`), > 0
  double memory_mb = 0;  // what training may take there; 0: no bound
  double link_mbps = 0;  // the link to the next machine (each way); the last's is unused
};

struct PlannedStage {  // one stage of a PipelinePlan (not pipeline/stage_peer.h's StagePlan)
  std::string node;
  std::string first, last;  // the stage's first and last graph node
  double forward_s = 0, backward_s = 0;  // a micro-batch's
  double link_s = 0;                      // its activations to the next stage (and their gradient back)
  double memory_mb = 0;                   // parameters, gradients, optimizer state, what its slots keep
  bool fits = true;
};

struct PipelinePlan {
  std::vector<std::string> cuts;
  int microbatches = 1;
  double step_s = 0, samples_per_s = 0, bubble = 0;
  std::vector<PlannedStage> stages;
  bool fits = true;  // every stage within its machine's memory
};

struct PartitionOptions {
  int64_t batch = 64;
  std::vector<int> microbatches = {1, 2, 4, 8, 16};
  std::string schedule = "1f1b";
  int state_per_param = 1;  // optimizer state floats a trainable parameter: SGD with momentum 1, Adam 2
  // Per graph node (graph order), seconds a sample's forward and backward took on a machine
  // that sustains `measured_gflops` (`tandem plan --profile`, core/profiler.h): the stages'
  // costs then come from these, scaled by each machine's speed, not from FLOPs alone.
  std::vector<double> measured_forward_s, measured_backward_s;
  double measured_gflops = 0;
};

// Every choice of cuts x K, best first (those that fit first, then by samples/s). `whole` is
// the model as the first stage trains it (no input gradient), for which nodes back up. An
// Error when the chain is longer than the model has legal cuts plus one, or a node's numbers
// are not usable (names it).
std::vector<PipelinePlan> plan_pipeline(const Network& whole, const std::vector<PipelineNode>& nodes,
                                        const PartitionOptions& options);

// The plan for given cuts and K (what plan_pipeline predicts for them).
PipelinePlan predict_pipeline(const Network& whole, const std::vector<PipelineNode>& nodes,
                              const std::vector<std::string>& cuts, int microbatches, const PartitionOptions& options);

}  // namespace tandem
