#include "edge/agent/edge_checkpoints.h"

#include <cstdio>

#include "core/error.h"
#include "core/sha256.h"

namespace tandem {

EdgeCheckpoints::EdgeCheckpoints(const std::string& dir, const std::string& identity_dir, int64_t every)
    : store_(dir, "edge", load_key(identity_dir + "/checkpoint.key", true)), every_(every) {
  if (every < 0) fail("edge", "--checkpoint-every must be >= 0 (0: only at the end of each epoch)");
  latest_ = store_.load_latest();
}

std::optional<CheckpointMeta> EdgeCheckpoints::resume(const std::array<uint8_t, 32>& model_hash,
                                                      std::span<Network* const> model, Optimizer& optimizer) {
  // The folder as it is now: a driver made again after a dropped connection (edge_agent.cpp)
  // resumes from what was saved since this object was made.
  if (!read_since_made_) latest_ = store_.load_latest();
  read_since_made_ = false;
  if (!latest_) return std::nullopt;
  const CheckpointData& d = *latest_;
  if (d.meta.role != "edge" || d.meta.model_hash != model_hash)
    fail("edge", cat("the checkpoints in ", store_.dir(), " are of another model or cut (cut '", d.meta.cut,
                     "', model hash ", to_hex(d.meta.model_hash.data(), 8),
                     "...); give another --checkpoint-dir or remove that folder to start afresh"));
  restore_checkpoint(d, model, &optimizer);
  return d.meta;
}

void EdgeCheckpoints::save(const CheckpointMeta& position, std::span<Network* const> model, Optimizer& optimizer) {
  store_.save(position.step, encode_checkpoint(position, model, &optimizer));
}

}  // namespace tandem
