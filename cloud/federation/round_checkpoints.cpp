#include "cloud/federation/round_checkpoints.h"

#include <cstdio>

#include "core/error.h"

namespace tandem {

FolderRoundCheckpoints::FolderRoundCheckpoints(std::string dir, std::vector<Network*> edge_model,
                                               std::array<uint8_t, 32> model_hash, std::string cut)
    : edge_model_(std::move(edge_model)), model_hash_(model_hash), cut_(std::move(cut)), backs_(dir, "back"),
      fronts_(dir, "front") {}

std::vector<Param*> FolderRoundCheckpoints::params() const {
  std::vector<Param*> out;
  for (Network* net : edge_model_) out.insert(out.end(), net->params().begin(), net->params().end());
  return out;
}

CheckpointMeta FolderRoundCheckpoints::meta(const char* role, uint32_t round) const {
  CheckpointMeta m;
  m.role = role;
  m.client_id = "federation";
  m.cut = cut_;
  m.model_hash = model_hash_;
  m.step = round;  // the store numbers a federation's files by round
  return m;
}

void FolderRoundCheckpoints::save(uint32_t round, const NamedTensors& average, Network& back, Optimizer& optimizer) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto params = this->params();
  if (params.size() != average.size()) fail("federation checkpoint", "the average does not fit the front shard");
  for (std::size_t k = 0; k < params.size(); ++k) params[k]->value().copy_from(average[k].second);
  // The front first: a round counts once its back shard is on disk too (load_latest).
  fronts_.save(round, encode_checkpoint(meta("federation-front", round), edge_model_, nullptr));
  backs_.save(round, encode_checkpoint(meta("federation-back", round), back, &optimizer));
}

std::optional<std::pair<uint32_t, NamedTensors>> FolderRoundCheckpoints::load_latest(
    Network& back, Optimizer& optimizer, std::vector<std::string>* refusals) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<uint64_t> rounds = backs_.steps();
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) {
    try {
      const CheckpointData b = backs_.load_step(*it), f = fronts_.load_step(*it);
      for (const CheckpointData* d : {&b, &f})
        if (d->meta.model_hash != model_hash_ || d->meta.cut != cut_)
          fail("checkpoint", cat("round ", *it, " was written for another model or cut"));
      if (b.meta.role != "federation-back" || f.meta.role != "federation-front")
        fail("checkpoint", cat("round ", *it, "'s files are not a federation's back and front shards"));
      restore_checkpoint(f, edge_model_, nullptr);  // checks every shape before the back changes
      restore_checkpoint(b, back, &optimizer);
      NamedTensors average;
      for (Param* p : params()) average.emplace_back(p->name(), p->value().clone());
      return std::make_pair(static_cast<uint32_t>(*it), std::move(average));
    } catch (const Error& e) {
      const std::string msg = cat("refused the federation's round ", *it, " in ", dir(), ": ", e.what(),
                                  std::next(it) != rounds.rend() ? "; trying the previous one" : "; none left");
      std::fprintf(stderr, "%s\n", msg.c_str());
      if (refusals) refusals->push_back(msg);
    }
  }
  return std::nullopt;
}

}  // namespace tandem
