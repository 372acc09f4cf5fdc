// A folder of one shard's checkpoints, `<prefix>-<step>.tdmc`, the newest few kept. Saving is
// atomic; loading the latest falls back to an older checkpoint, with a warning naming the
// refused file and why, when the newest is truncated, corrupt or fails authentication.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "ports/crypto/aes_gcm.h"

namespace tandem {

class CheckpointStore {
 public:
  // With a key every file is sealed with AES-256-GCM (the edge's checkpoints); `keep` is how
  // many of the newest checkpoints stay on disk.
  CheckpointStore(std::string dir, std::string prefix, std::optional<AesKey> key = std::nullopt, int keep = 3);

  const std::string& dir() const { return dir_; }
  std::string path_of(uint64_t step) const;
  // Writes the checkpoint of `step`, then removes all but the newest `keep`.
  void save(uint64_t step, std::span<const uint8_t> checkpoint);
  // Steps with a file on disk, ascending (valid or not).
  std::vector<uint64_t> steps() const;
  // The newest checkpoint that decodes, or none; refusals go to stderr (and `refusals`).
  std::optional<CheckpointData> load_latest(std::vector<std::string>* refusals = nullptr) const;
  // The checkpoint of exactly `step`; throws Error saying why it cannot be had.
  CheckpointData load_step(uint64_t step) const;

 private:
  CheckpointData load_file(const std::string& path) const;
  std::string dir_, prefix_;
  std::optional<AesKey> key_;
  int keep_;
};

}  // namespace tandem
