// Split planner: for every legal cut and micro-batch count K, the predicted step time of the
// pipelined schedule the agent runs (the edge's K forwards back to back, each sent at once;
// uplink, cloud and downlink each first come first served; the cloud sends each input
// gradient before its weight gradients, which it runs while idle; the edge backs each
// micro-batch up once its gradient is in), synchronous or asynchronous (the next step's
// forwards before this one's backwards), from per-micro-batch costs and the link's rates;
// plus the edge's peak memory, and the recommendation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/graph.h"
#include "core/network.h"
#include "core/wire/tensor_codec.h"

namespace tandem {

// What one micro-batch costs on each resource.
struct MicrobatchCost {
  double edge_forward_s = 0, edge_backward_s = 0;
  double cloud_s = 0;           // before the gradient leaves: forward, loss, input gradients
  double cloud_deferred_s = 0;  // after: the back shard's weight gradients
  double up_s = 0, down_s = 0;  // on the link
};

// One step of the schedule, simulated.
struct StepTimeline {
  // In steady state: from its first forward to the edge's last backward, or, if the cloud is
  // still busy with weight gradients when the next step's first activations arrive, until
  // the cloud can take them.
  double step_s = 0;
  // From the first Forward handed to the link to the edge taking the first gradient up (it
  // computes all K forwards first), as the edge's metrics measure it (first_grad_ms).
  double first_grad_s = 0;
  double edge_idle_s = 0, cloud_idle_s = 0;  // the step's time less each one's busy time
  double bubble() const { return step_s > 0 ? edge_idle_s / step_s : 0.0; }  // the edge's idle fraction
};

// Deferred work runs one micro-batch's at a time while no activations wait (started work is
// not interrupted), the rest before the update.
StepTimeline simulate_step(const std::vector<MicrobatchCost>& microbatches);
// The asynchronous schedule (EdgeSession::set_async) in steady state: the edge forwards step
// s+1 right after step s (F0 F1 B0 F2 B1 F3 ...), each backward once its gradient is in; the
// cloud finishes a step's deferred work before the next step's first micro-batch. Simulated
// over several steps; the step time is the mean over the middle ones.
StepTimeline simulate_async_steps(const std::vector<MicrobatchCost>& microbatches);

struct PlanRow {
  std::string cut;
  int microbatches = 1;
  double step_s = 0, samples_per_s = 0;
  double first_grad_s = 0, edge_idle_s = 0, cloud_idle_s = 0;  // StepTimeline's
  double edge_s = 0, cloud_s = 0, up_s = 0, down_s = 0;  // busy time per step on each
  int64_t bytes_up_per_step = 0;
  double edge_peak_mb = 0;
  bool fits = true;  // within the edge's memory
};

// What training `shard` takes in memory, in bytes (tensors; not the process, stashes or
// kernels' scratch): every parameter's value, a gradient and `state_per_param` floats of
// optimizer state for each trainable one (SGD with momentum 1, Adam 2), what the slots of a
// step of `batch` samples keep for backward, and a forward and backward buffers of
// `microbatch` samples. The planner's edge memory (microbatch: its largest at K) and the
// cloud's admission at Hello (--session-memory-mb; microbatch: the whole batch, which an edge
// may send as one, and which a deferred backward's K slots hold in buffers).
double training_memory_bytes(Network& shard, int64_t batch, int64_t microbatch, int state_per_param);

// The row with the most samples/s among those that fit (throws if none does).
const PlanRow& recommend(const std::vector<PlanRow>& rows);

struct PlanOptions {
  int64_t batch = 64;
  std::vector<int> microbatches = {1, 2, 4, 8, 16};
  double uplink_mbps = 0, downlink_mbps = 0;
  double edge_gflops = 0, cloud_gflops = 0;  // > 0: estimate from FLOPs instead of measuring
  double edge_memory_mb = 0;                 // > 0: rows above it do not fit
  wire::DType dtype = wire::DType::F32;
  std::vector<std::string> cuts;             // empty: every legal cut
  int iterations = 5;                        // profiling iterations per shard and size
  bool async = false;                        // predict the asynchronous schedule
};

// Every legal cut x K: measured on the backends (or estimated from the GFLOP/s given).
std::vector<PlanRow> plan_split(const Graph& graph, const PlanOptions& options, Backend& edge, Backend& cloud);

// The nodes split() accepts (crossed by one tensor), the output excluded.
std::vector<std::string> legal_cuts(const Graph& graph);

}  // namespace tandem
