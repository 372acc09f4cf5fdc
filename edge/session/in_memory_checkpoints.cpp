#include "edge/session/in_memory_checkpoints.h"

#include "core/checkpoint/checkpoint.h"
#include "core/error.h"

namespace tandem {

InMemoryEdgeCheckpoints::InMemoryEdgeCheckpoints(int64_t every) : every_(every) {
  if (every < 0) fail("edge", "checkpointEvery must be 0 or more (0: only at the end of each epoch)");
}

std::optional<CheckpointMeta> InMemoryEdgeCheckpoints::resume(const std::array<uint8_t, 32>& model_hash,
                                                              std::span<Network* const> model, Optimizer& optimizer) {
  if (latest_.empty()) return std::nullopt;
  const CheckpointData d = decode_checkpoint(latest_);
  if (d.meta.role != "edge" || d.meta.model_hash != model_hash)
    fail("edge", "the checkpoint in memory is of another model or cut: start a new run (tandem_create)");
  restore_checkpoint(d, model, &optimizer);
  return d.meta;
}

void InMemoryEdgeCheckpoints::save(const CheckpointMeta& position, std::span<Network* const> model, Optimizer& optimizer) {
  latest_ = encode_checkpoint(position, model, &optimizer);
  step_ = position.step;
}

}  // namespace tandem
