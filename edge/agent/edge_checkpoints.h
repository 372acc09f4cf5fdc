// The edge's checkpoints of its front shard: sealed with AES-256-GCM under the identity
// folder's checkpoint.key (made on first use), written every N steps and at each epoch's
// end; on start the newest usable one is restored (older ones when it is torn or tampered).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "core/checkpoint/checkpoint.h"
#include "edge/session/event_edge.h"
#include "ports/files/checkpoint_store.h"

namespace tandem {

class EdgeCheckpoints final : public EdgeCheckpointer {
 public:
  EdgeCheckpoints(const std::string& dir, const std::string& identity_dir, int64_t every);

  // The newest checkpoint that decodes, if any (for the cut it was trained with).
  const std::optional<CheckpointData>& latest() const { return latest_; }
  // Restores the newest checkpoint (latest(), read again when a resume came before) into the
  // edge's networks after checking it is for this model and cut; returns its position, or
  // none when the folder holds no checkpoint.
  std::optional<CheckpointMeta> resume(const std::array<uint8_t, 32>& model_hash, std::span<Network* const> model,
                                       Optimizer& optimizer) override;
  // Whether the step that ends at `step_after` (an epoch's last when `epoch_end`) is saved.
  bool due(uint64_t step_after, bool epoch_end) const override {
    return epoch_end || (every_ > 0 && step_after % static_cast<uint64_t>(every_) == 0);
  }
  void save(const CheckpointMeta& position, std::span<Network* const> model, Optimizer& optimizer) override;

 private:
  CheckpointStore store_;
  int64_t every_;
  std::optional<CheckpointData> latest_;
  bool read_since_made_ = true;  // latest_ is the constructor's reading, not yet used
};

}  // namespace tandem
