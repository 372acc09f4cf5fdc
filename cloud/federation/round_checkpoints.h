// A federation's checkpoints, one pair a round in a folder (the service: STATE/federation/):
// the shared back shard with its optimizer, and the round's average of the front shards,
// each in its own checksummed file (the newest three rounds kept), so a restarted cloud
// continues from its last round. A torn or altered pair is refused and the previous used.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "cloud/session/cloud_session.h"
#include "ports/files/checkpoint_store.h"

namespace tandem {

class FolderRoundCheckpoints final : public RoundCheckpoints {
 public:
  // `edge_model`: networks of what the edges average (the front shard, and a U-shaped
  // split's tail after it), used to encode and check the averages.
  FolderRoundCheckpoints(std::string dir, std::vector<Network*> edge_model, std::array<uint8_t, 32> model_hash,
                         std::string cut);
  FolderRoundCheckpoints(std::string dir, Network& front, std::array<uint8_t, 32> model_hash, std::string cut)
      : FolderRoundCheckpoints(std::move(dir), std::vector<Network*>{&front}, model_hash, std::move(cut)) {}

  void save(uint32_t round, const NamedTensors& average, Network& back, Optimizer& optimizer) override;
  // Restores the back shard and its optimizer from the newest round whose two files load
  // and fit this model, and returns that round and its average; none when the folder has
  // none. Refused rounds are reported on stderr (and in `refusals`).
  std::optional<std::pair<uint32_t, NamedTensors>> load_latest(Network& back, Optimizer& optimizer,
                                                               std::vector<std::string>* refusals = nullptr);
  const std::string& dir() const { return backs_.dir(); }
  std::string back_path(uint32_t round) const { return backs_.path_of(round); }
  std::string front_path(uint32_t round) const { return fronts_.path_of(round); }

 private:
  CheckpointMeta meta(const char* role, uint32_t round) const;
  std::mutex mutex_;
  std::vector<Network*> edge_model_;
  std::vector<Param*> params() const;  // edge_model_'s, in order
  std::array<uint8_t, 32> model_hash_;
  std::string cut_;
  CheckpointStore backs_, fronts_;
};

}  // namespace tandem
