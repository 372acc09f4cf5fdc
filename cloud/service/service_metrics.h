// What the cloud service counts for its operators, in Prometheus' text format (/metrics):
// sessions, steps, samples, bytes, refusals by error code and reason, rounds, busy time, queues.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "backends/registry.h"

namespace tandem {

class ServiceMetrics {
 public:
  ServiceMetrics();
  // Counters (monotonic: Prometheus' rate() gives steps and samples per second).
  std::atomic<uint64_t> sessions_opened{0}, sessions_closed{0};
  std::atomic<uint64_t> steps{0}, samples{0}, bytes_in{0}, bytes_out{0}, messages_in{0};
  std::atomic<uint64_t> busy_us{0};  // compute time of the sessions' steps, microseconds
  // Errors sent to edges, by wire::ErrorCode name; connections turned away before a session,
  // by reason (revoked, max_connections, pending_hello, hello_timeout, queue_overflow).
  void count_error(const std::string& code);
  void count_refusal(const std::string& reason);

  // Gauges read when scraped: filled in by the service (sessions open, queue depths, round).
  struct Gauges {
    uint64_t sessions_open = 0, sessions_without_hello = 0;
    uint64_t transport_queue = 0;                  // arrived messages the service has not taken
    uint64_t inbox_messages = 0, inbox_bytes = 0;  // taken, waiting for their session's thread
    uint64_t federation_round = 0;
    uint64_t shard_batches = 0, shard_batched_microbatches = 0;  // --batch-edges: BackShardBatches::Stats
    uint64_t refused_max_connections = 0, closed_queue_overflow = 0;  // the transport's own counts
    GpuMemoryUse gpu;  // the cuda backend's pool (all 0 on the others)
    std::size_t session_memory_used = 0, session_memory_limit = 0;  // estimates held at Hello; 0: no bound
    // --replica-set: this replica's place in the set and its collectives (ReplicaSync::Totals).
    bool replica = false;
    uint64_t replica_epoch = 0, replica_members = 0, replica_rank = 0;
    uint64_t replica_collectives = 0, replica_bytes = 0, replica_reforms = 0, replica_dropped = 0, replica_joined = 0;
    double replica_seconds = 0;
  };
  // The text of one scrape; `gauges` is called once for it.
  std::string prometheus_text(const std::function<Gauges()>& gauges) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t> errors_, refusals_;
  const int64_t start_time_s_;
};

}  // namespace tandem
