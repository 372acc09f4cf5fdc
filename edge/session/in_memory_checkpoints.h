// Checkpoints of the front shard kept in memory (the newest only): the browser edge's, which
// has no folder of its own. A run that loses its link makes its driver again from the newest
// (the cloud holds its own checkpoint of that step on disk) and goes on, as tandem-edge does
// from its encrypted folder (edge/agent/edge_checkpoints.h).
#pragma once

#include <cstdint>
#include <vector>

#include "edge/session/event_edge.h"

namespace tandem {

class InMemoryEdgeCheckpoints final : public EdgeCheckpointer {
 public:
  // Every `every` steps and at each epoch's end (every 0: only at epochs' ends).
  explicit InMemoryEdgeCheckpoints(int64_t every);

  std::optional<CheckpointMeta> resume(const std::array<uint8_t, 32>& model_hash, std::span<Network* const> model,
                                       Optimizer& optimizer) override;
  bool due(uint64_t step_after, bool epoch_end) const override {
    return epoch_end || (every_ > 0 && step_after % static_cast<uint64_t>(every_) == 0);
  }
  void save(const CheckpointMeta& position, std::span<Network* const> model, Optimizer& optimizer) override;

  bool empty() const { return latest_.empty(); }
  // The newest checkpoint's step (0: none). EventEdgeConfig::steps counts a driver's own steps:
  // one made again from a checkpoint of step S, for a run of N steps, is given N - S.
  uint64_t step() const { return latest_.empty() ? 0 : step_; }

 private:
  int64_t every_;
  std::vector<uint8_t> latest_;  // encode_checkpoint's bytes
  uint64_t step_ = 0;
};

}  // namespace tandem
