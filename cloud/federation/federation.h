// Split-federated rounds on the cloud: every `aggregate_every` steps each edge sends its front
// shard; when every connected edge has sent and they are at least `min_edges` (or the
// deadline passed with at least `min_edges`, or all there are), the shards are averaged
// weighted by their samples and the result goes to every edge that took part. An edge that misses a deadline is a straggler:
// later rounds do not wait for it until it sends again. Late or returning edges get the
// newest average. Thread-safe;
// transport-free (messages leave through `send`), so it is tested in-process.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/wire/messages.h"

namespace tandem {

struct FederationOptions {
  uint32_t aggregate_every = 0;  // steps between rounds; 0: no federation
  uint32_t min_edges = 1;        // a round past its deadline closes with at least this many
  double deadline_s = 30.0;      // seconds after a round's first FrontWeights
  uint32_t back_accumulate = 1;  // edge steps summed into one update of the shared back shard
  // Those steps together, their micro-batches handed in within batch_gather_s of each other
  // joined into one batch on the shard (BackShardBatches), instead of in turns.
  bool batch_edges = false;
  double batch_gather_s = 0.005;
};

// One connected edge's part in the federation, for metrics.
struct FederatedEdge {
  std::string client;
  uint32_t rounds_joined = 0;
  uint64_t samples = 0;  // reported in its FrontWeights
};

class Federation {
 public:
  using Send = std::function<void(uint64_t connection, std::span<const uint8_t> bytes)>;
  using Clock = std::chrono::steady_clock;
  // `front`: the front shard's parameter names, shapes and the weights every edge starts from.
  Federation(NamedTensors front, const FederationOptions& options, Send send);

  const FederationOptions& options() const { return options_; }
  uint32_t round();
  // An edge's session started: returns the newest Aggregated for it (empty before round 1).
  std::vector<uint8_t> join(uint64_t connection, const std::string& client);
  // Its connection closed: the round may now be complete without it.
  void leave(uint64_t connection);
  // Records an edge's front shard (checked: names, shapes, finite values, samples at most
  // `max_samples`, one submission per round); false with `error` set.
  bool submit(uint64_t connection, const Frame& frame, const wire::FrontWeights& weights, uint64_t max_samples,
              WireError& error);
  // Closes a round whose deadline has passed (the service calls it a few times a second).
  void tick(Clock::time_point now = Clock::now());
  std::vector<FederatedEdge> edges();
  std::optional<FederatedEdge> edge(uint64_t connection);
  // A restarted cloud continues from its last saved round (RoundCheckpoints).
  void restore(uint32_t round, NamedTensors average);
  // The newest round's number and average once per closed round, for its checkpoint;
  // nothing while that round has been taken already (or none closed).
  std::optional<std::pair<uint32_t, NamedTensors>> take_unsaved_round();
  // Replicas of the cloud (pipeline/replicas.h), each with edges of its own: a round is
  // averaged over all their edges, and the replica's driver makes it with the set (every
  // collective from one thread, in the set's order). A round is ready when every edge of this
  // replica has sent, one of them not its last front (no deadline: a straggler holds the set,
  // as a slow rank holds torch's synchronous data parallel); `on_ready` is then called (the
  // federation's lock held: it may only wake the driver), and the driver closes it with
  // replica_round_values, the set's all-sum and replica_round.
  void set_replica_rounds(std::function<void()> on_ready) { on_ready_ = std::move(on_ready); }
  bool round_ready();
  // Called as each round closes (the federation's lock held; replicas admit waiting edges then).
  void set_on_close(std::function<void()> on_close) { on_close_ = std::move(on_close); }
  // A round the replica's driver makes with the set (and, idle, one the others make): whether
  // fronts wait in it (its edges' final ones, say), this replica's part of its all-sum
  // (round_values() of them), and the set's sums, which close round `round` here: the average
  // becomes the set's and the waiting edges get it. An Error when the set is at another round
  // or the front another size.
  bool round_pending();
  std::vector<float> replica_round_values();
  void replica_round(std::span<const float> sums, uint64_t round);
  std::size_t round_values() const;  // a round's all-sum: the front's values and the weight
  // The round and its average as floats, for a replica that joins (set_state takes them).
  std::vector<float> state();
  void set_state(std::span<const float> values);
  // One JSON line a closed round, for the cloud's metrics file (empty: none).
  void set_metrics_sink(std::function<void(const std::string&)> sink) { metrics_ = std::move(sink); }

 private:
  struct Edge {
    FederatedEdge info;
    bool submitted = false;
    bool final = false;  // its submission is its run's last (after its last step, mid-round maybe)
    bool straggler = false;  // missed a round's deadline and has not sent since
    uint64_t round_samples = 0;
    std::vector<Tensor> weights;  // copies of the submitted tensors
  };
  void close_round(const char* why);  // with mutex_ held
  // With mutex_ held: the round's end once its average is in current_ (the edges in it get it).
  void finish_round(const std::vector<Edge*>& in, const char* why);
  std::vector<Edge*> submitted();
  std::vector<float> round_sums(const std::vector<Edge*>& in) const;  // a replica's part of the round's all-sum
  void take_sums(std::span<const float> sums);  // the set's sums: the average
  bool at_boundary() const;  // a round may close now (replicas: one of its fronts is not a final one)
  bool all_sent() const;              // every edge that is not a straggler, and at least min_edges

  std::mutex mutex_;
  NamedTensors current_;  // the newest average (the initial weights before round 1)
  FederationOptions options_;
  Send send_;
  std::function<void(const std::string&)> metrics_;
  std::function<void()> on_ready_, on_close_;
  bool ready_ = false;  // replicas: this round's fronts are in, for the driver to close
  std::vector<float> state_locked() const;
  void set_state_locked(std::span<const float> values);
  std::map<uint64_t, Edge> edges_;
  uint32_t round_ = 0, saved_round_ = 0;
  std::optional<Clock::time_point> first_submission_;
  MessageWriter writer_;
};

}  // namespace tandem
