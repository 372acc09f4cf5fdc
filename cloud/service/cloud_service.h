// The cloud service: listens on wss:// with mutual TLS, runs one CloudSession per connected
// edge on a worker thread of its own (so one edge never blocks another), until SIGINT/SIGTERM.
#pragma once

#include <cstdint>
#include <string>

#include "core/optimizer.h"
#include "core/wire/frame.h"

#include "cloud/federation/federation.h"
#include "cloud/session/cloud_session.h"

namespace tandem {

// Replicas of a federation's cloud (--replica-set): several tandem-cloud processes, each with
// edges of its own, keep one shared back shard and one round average (pipeline/replicas.h),
// meeting in a folder over Gloo (collective/).
struct ServeReplicas {
  std::string set_dir;  // the replica set's folder (shared by every replica); empty: no replicas
  std::string id;       // this replica's name in the set
  uint32_t initial = 1;  // replicas that form the set
  std::string address = "127.0.0.1";  // the private address its collectives listen on
  bool allow_public = false;
  std::string engine = "gloo";  // or nccl: the collectives on the GPUs (one a replica)
  std::string mode = "sync";  // or local-sgd
  uint32_t average_every = 1;
  double timeout_s = 60.0;  // the others' arrival, and each collective
  double settle_s = 2.0;    // survivors' window to say they are alive after a member is lost
};

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (printed)
  std::string state_dir;
  std::string model_path;
  std::string cut;  // empty: the spec's default cut
  std::string backend = "onednn";
  int threads = 1;  // each session's kernel threads (BackendOptions.threads)
  // The threads that run the edges' TLS (LwsEndpoint): 0, one for every 8 cores this process may use (1 to 8).
  int io_threads = 0;
  uint32_t batch_size = 64, microbatches = 4;
  // What the sessions' back shards may take together, estimated at Hello (training_memory_bytes
  // at batch_size and microbatches); 0: no bound (on cuda: the GPU's budget, gpu_memory_bytes).
  // A session that does not fit now is answered Busy, one that never could NoRoom.
  std::size_t session_memory_bytes = 0;
  OptimizerOptions optimizer;
  uint64_t seed = 1;
  std::size_t max_message_bytes = kDefaultMaxMessageBytes;
  std::vector<wire::DType> wire_dtypes = CloudSessionConfig{}.dtypes;  // what edges may send
  std::string init_from;  // safetensors of the whole model (PyTorch layout) to start from
  // Split-federated (aggregate_every > 0): one back shard for every edge, front shards
  // averaged every aggregate_every steps.
  FederationOptions federation;
  ServeReplicas replicas;
  std::string metrics_json;  // per round and per closed session, JSON lines
  // Edges without a client certificate (browsers) may connect and must then carry a signed,
  // single-use enrolment token in Hello (cloud/pki/token.h).
  bool accept_tokens = false;
  std::string web_root;  // non-empty: these files are served over https on the same port
  // Operators: Prometheus' text at http://metrics_host:metrics_port/metrics and a health check
  // at /healthz, over plain HTTP on a separate listener (metrics_port < 0: none; 0: any).
  std::string metrics_host = "127.0.0.1";
  int metrics_port = -1;
  // Limits under load: connections at once, connections that have not said Hello, how long
  // the TLS handshake and then the Hello may take, and the bytes queued for one session in
  // either direction (a peer that sends past its window, or stops reading its replies).
  std::size_t max_connections = 256, max_pending_hello = 64;
  int handshake_timeout_s = 10, hello_timeout_s = 10;
  std::size_t max_queued_bytes = std::size_t{512} << 20;
  // On cuda: the device memory all sessions' kernels may take together (0: 90% of the GPU's).
  std::size_t gpu_memory_bytes = 0;
  // The cut's gradient before the back shard's weight gradients (CloudSessionConfig).
  bool defer_weights = true;
};

// Runs the service; returns the process exit code.
int serve(const ServeOptions& options);

}  // namespace tandem
