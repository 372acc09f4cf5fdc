// Layer shards in a build without Gloo (the arm64 cross build: collective/ is native only).
#include "core/error.h"
#include "tools/layer_shard_party.h"

namespace tandem {

std::unique_ptr<LayerShardParty> LayerShardParty::lead(const LayerShardArgs& args) {
  fail("stage", cat("[", args.deployment.parties[args.party].name, "] has layer-shards = ",
                    args.deployment.parties[args.party].layer_shards,
                    ", and this build of tandem has no Gloo (a cross build): run a split stage on a native build"));
}

int run_layer_shard_member(const CliArgs&) {
  fail("stage", "--shard: this build of tandem has no Gloo (a cross build): run a split stage's members on a native build");
}

}  // namespace tandem
