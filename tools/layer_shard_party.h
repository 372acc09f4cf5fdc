// A party's stage split into layer shards (tensor parallel over Gloo, pipeline/layer_shards.h):
// `layer-shards = S` in the party's section of the deployment file. Member 0 is the party's
// own `tandem stage --party NAME` process: it holds the links and tells the others each call
// of the stage. Members 1..S-1 are `tandem stage --party NAME --shard R`, on the same machine
// or others that reach the section's shard-set folder and each other's shard-addresses; each
// keeps checkpoints of its own slices in the party's checkpoint-dir. When a member is lost
// (killed, its machine gone), member 0 tells its neighbours to start again from the newest
// checkpoint, waits --wait-s for the member to be started again, and the run goes on; when
// member 0 is lost, the others wait for it likewise.
//
// A build without Gloo (the arm64 cross build) has no layer shards: lead() and
// run_layer_shard_member() say so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/cli_args.h"
#include "core/graph.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "pipeline/stage.h"
#include "tools/deployment.h"

namespace tandem {

struct LayerShardArgs {
  const Deployment& deployment;
  std::size_t party;  // its index in the deployment
  const ModelSpec& spec;
  const Graph& graph;  // the whole model
  std::vector<std::string> cuts;
  std::size_t index;  // the party's stage
  Backend& backend;
  uint64_t seed;
  OptimizerOptions optimizer;
  int wait_s, silence_s;
};

// Member 0's side.
class LayerShardParty {
 public:
  virtual ~LayerShardParty() = default;
  // Its network (its slices, initialised as the whole model's), the group formed: waits up
  // to wait_s for the others to start.
  static std::unique_ptr<LayerShardParty> lead(const LayerShardArgs& args);

  virtual Network& network() = 0;
  virtual StageMirror* mirror() = 0;  // Stage::set_mirror
  // Of `mine` (this member's checkpoints' steps), those every member holds.
  virtual std::vector<uint64_t> common_steps(const std::vector<uint64_t>& mine) = 0;
  virtual void save(uint64_t step) = 0;     // the others save theirs of `step`
  virtual void restore(uint64_t step) = 0;  // and restore it (0: the initial state)
  // The unsplit stage's weights, from every member's slices, into `whole`.
  virtual void gather(Network& whole) = 0;
  virtual void end(bool failed) = 0;  // the others return (failed: with an Error)
  // After a lost member: a new session of the group once it is back (an Error naming the
  // member and what to start when it is not within wait_s).
  virtual void reform() = 0;
  // The group's collectives so far: count, bytes, seconds; and its session (generation).
  virtual std::string metrics(const std::string& labels) const = 0;
};

// `tandem stage --party NAME --shard R`: member R of the party's layer shards, until member 0
// ends the run.
int run_layer_shard_member(const CliArgs& cli);

}  // namespace tandem
