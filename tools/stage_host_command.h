// `tandem stage` for the party after the first parties when the deployment says
// later-stages = "own": it keeps the last stage for each first party, its own model, and
// serves them all at once on executor threads (pipeline/stage_host.h) behind one mutual-TLS
// WebSocket server. The two-party shape (a cloud serving many hospitals, each its own model)
// as a pipeline of two stages.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/cli_args.h"
#include "core/backend.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/optimizer.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_peer.h"
#include "ports/tls/endpoint_event.h"
#include "tools/deployment.h"

namespace tandem {

// A party's certificate, key and CA, from its identity folder.
TlsIdentity deployment_tls(const DeploymentParty& party);

// What run_party has read of the file for the host.
struct StageHostRun {
  const CliArgs& cli;
  const Deployment& deployment;
  std::size_t party;  // the host's section
  const ModelSpec& spec;
  const Graph& graph;
  std::string cut;
  const std::vector<Graph>& stages;  // the two stages
  const PipelineSchedule& schedule;
  StagePlan plan;  // stage 1 of 2
  std::function<std::unique_ptr<Backend>()> make_backend;  // one an executor
  std::size_t executors;
  uint64_t seed;
  OptimizerOptions optimizer;
  int64_t checkpoint_every;
  int silence_s;
};

// Serves every first party's session until each has ended its run; 0, or an Error.
int run_stage_host(const StageHostRun& run);

}  // namespace tandem
