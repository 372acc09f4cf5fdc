// What the tandem CLI's commands set up alike from their options: the model split at its cut
// (--model, --cut), and the edge's and the cloud's backends (--edge-backend, --cloud-backend,
// --threads).
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "cli/cli_args.h"

namespace tandem {

struct SplitModel {
  ModelSpec spec;
  Graph graph, front, back;  // a U-shaped cut: back is the middle
  std::string cut;
  bool u_shaped = false;
  Graph tail;  // a U-shaped cut's: on the edge's backend
};

// --model SPEC split at --cut (default: the spec's cut; "A,B": U-shaped, with the tail);
// throws when neither names one.
SplitModel load_split_model(const CliArgs& args);

struct ShardBackends {
  std::string edge_name, cloud_name;
  std::unique_ptr<Backend> edge, cloud;
};

// --edge-backend (default xnnpack when built), --cloud-backend (onednn), --threads (1).
ShardBackends shard_backends(const CliArgs& args);

}  // namespace tandem
