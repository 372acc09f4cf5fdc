#include "cloud/service/service_metrics.h"

#include <ctime>

#include "core/error.h"

namespace tandem {
namespace {

// One metric family: HELP, TYPE and its samples (Prometheus text exposition format 0.0.4).
void family(std::string& out, const char* name, const char* type, const char* help) {
  out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void sample(std::string& out, const std::string& name, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  out += cat(name, " ", buf, "\n");
}

}  // namespace

ServiceMetrics::ServiceMetrics() : start_time_s_(static_cast<int64_t>(std::time(nullptr))) {}

void ServiceMetrics::count_error(const std::string& code) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++errors_[code];
}

void ServiceMetrics::count_refusal(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++refusals_[reason];
}

std::string ServiceMetrics::prometheus_text(const std::function<Gauges()>& gauges) const {
  const Gauges g = gauges();
  std::string out;
  auto counter = [&](const char* name, const char* help, double v) {
    family(out, name, "counter", help);
    sample(out, name, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    family(out, name, "gauge", help);
    sample(out, name, v);
  };
  gauge("tandem_up", "1 while the cloud service runs.", 1);
  gauge("tandem_start_time_seconds", "When the service started, Unix time.", static_cast<double>(start_time_s_));
  counter("tandem_sessions_opened_total", "Edge connections that became sessions.", sessions_opened.load());
  counter("tandem_sessions_closed_total", "Sessions whose connection closed.", sessions_closed.load());
  gauge("tandem_sessions_open", "Sessions open now.", static_cast<double>(g.sessions_open));
  gauge("tandem_sessions_without_hello", "Open connections that have not said Hello yet.",
        static_cast<double>(g.sessions_without_hello));
  counter("tandem_steps_total", "Training steps the back shards completed (rate(): steps per second).", steps.load());
  counter("tandem_samples_total", "Samples the back shards trained on (rate(): samples per second).", samples.load());
  counter("tandem_messages_received_total", "Messages received from edges.", messages_in.load());
  counter("tandem_received_bytes_total", "Bytes of messages received from edges.", bytes_in.load());
  counter("tandem_sent_bytes_total", "Bytes of messages sent to edges.", bytes_out.load());
  counter("tandem_compute_busy_seconds_total", "Time the sessions spent computing their steps.",
          static_cast<double>(busy_us.load()) / 1e6);
  counter("tandem_federation_rounds_total", "Federation rounds completed (0 without a federation).",
          static_cast<double>(g.federation_round));
  counter("tandem_back_shard_batches_total",
          "Batches the shared back shard ran with --batch-edges (0 otherwise).", static_cast<double>(g.shard_batches));
  counter("tandem_back_shard_batched_microbatches_total",
          "Edges' micro-batches in those batches (divided by the batches: edges a batch).",
          static_cast<double>(g.shard_batched_microbatches));
  gauge("tandem_session_memory_bytes",
        "The open sessions' back shards by their estimates at Hello (tandem-cloud serve --session-memory-mb).",
        static_cast<double>(g.session_memory_used));
  gauge("tandem_session_memory_limit_bytes", "What they may take together (0: no bound).",
        static_cast<double>(g.session_memory_limit));
  family(out, "tandem_gpu_memory_bytes", "gauge",
         "The cuda backend's device memory: held by the sessions' kernels (live) and cached by its pool for the next "
         "(cached); both count against --gpu-memory-mb (0 on other backends).");
  sample(out, "tandem_gpu_memory_bytes{state=\"live\"}", static_cast<double>(g.gpu.live));
  sample(out, "tandem_gpu_memory_bytes{state=\"cached\"}", static_cast<double>(g.gpu.cached));
  counter("tandem_gpu_allocations_total",
          "cudaMalloc calls the pool made (flat while sessions come and go: they reuse what others gave back).",
          static_cast<double>(g.gpu.allocations));
  counter("tandem_gpu_pool_reuses_total", "Device buffers the pool served from its cache.",
          static_cast<double>(g.gpu.reuses));
  gauge("tandem_transport_queue_messages", "Messages arrived that the service has not taken yet.",
        static_cast<double>(g.transport_queue));
  gauge("tandem_session_inbox_messages", "Messages taken and waiting for their session's thread.",
        static_cast<double>(g.inbox_messages));
  gauge("tandem_session_inbox_bytes", "Bytes of the messages waiting for their session's thread.",
        static_cast<double>(g.inbox_bytes));
  if (g.replica) {  // --replica-set: this replica's place in the set, and what keeping in step costs
    gauge("tandem_replica_epoch", "The replica set's membership epoch this replica is in.",
          static_cast<double>(g.replica_epoch));
    gauge("tandem_replica_members", "Replicas in that epoch.", static_cast<double>(g.replica_members));
    gauge("tandem_replica_rank", "This replica's rank in it (rank 0 lets joiners in).",
          static_cast<double>(g.replica_rank));
    counter("tandem_replica_collectives_total",
            "Collectives with the other replicas (each update's gradients, rounds, joiners' copies, and their checks).",
            static_cast<double>(g.replica_collectives));
    counter("tandem_replica_allreduce_bytes_total", "Bytes this replica handed to those collectives.",
            static_cast<double>(g.replica_bytes));
    counter("tandem_replica_allreduce_seconds_total",
            "Seconds inside them (the network, the sums, and waiting for the slowest replica).", g.replica_seconds);
    counter("tandem_replica_reforms_total", "Membership epochs formed since this replica joined.",
            static_cast<double>(g.replica_reforms));
    counter("tandem_replica_dropped_total", "Replicas dropped from the set (lost) in those epochs.",
            static_cast<double>(g.replica_dropped));
    counter("tandem_replica_joined_total", "Replicas let into the set in those epochs.",
            static_cast<double>(g.replica_joined));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  family(out, "tandem_errors_sent_total", "counter", "Error messages sent to edges, by error code.");
  for (const auto& [code, n] : errors_) sample(out, cat("tandem_errors_sent_total{code=\"", code, "\"}"), static_cast<double>(n));
  family(out, "tandem_connections_refused_total", "counter",
         "Connections turned away or closed by the service's limits and revocations, by reason.");
  std::map<std::string, uint64_t> refusals = refusals_;
  refusals["max_connections"] += g.refused_max_connections;
  refusals["queue_overflow"] += g.closed_queue_overflow;
  for (const auto& [reason, n] : refusals)
    sample(out, cat("tandem_connections_refused_total{reason=\"", reason, "\"}"), static_cast<double>(n));
  return out;
}

}  // namespace tandem
