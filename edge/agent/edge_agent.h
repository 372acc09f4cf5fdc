// The edge agent: trains the front shard on local Fashion-MNIST against a tandem cloud over
// wss:// (mutual TLS with the identity folder), K micro-batches in flight per step, with a
// progress bar, per-epoch evaluation through the cloud and JSON-lines metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/optimizer.h"
#include "core/schedule.h"
#include "core/wire/tensor_codec.h"
#include "edge/session/event_edge.h"

namespace tandem {

struct EdgeTrainOptions {
  std::string host = "localhost";
  int port = 0;
  // More addresses of the same cloud (the replicas of a replica set, after host:port): a
  // connection that fails or drops, or a Busy answer, moves to the next one.
  std::vector<std::pair<std::string, int>> more_clouds;
  std::string identity_dir;  // client.crt, client.key, ca.crt (only ca.crt with a token)
  std::string token;         // an enrolment token (`tandem-cloud pki token`) instead of client.crt
  std::string model_path;
  std::string cut;
  std::string backend = "xnnpack";
  int threads = 1;  // the backend's compute threads
  std::vector<wire::DType> wire_dtypes = {wire::DType::F32};  // offered, most wanted first
  // --cut auto: the link the planner plans for, and the cloud's speed (0: as this machine's).
  double uplink_mbps = 0, downlink_mbps = 0, cloud_gflops = 0;
  int64_t epochs = 1, limit = 0, test_limit = 0;
  // "fashion-mnist", or a folder with train.safetensors and test.safetensors
  // (ports/files/tensor_dataset.h).
  std::string data = "fashion-mnist";
  uint32_t batch = 64, microbatches = 4;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;  // total_steps 0: the whole run
  uint64_t seed = 1;
  std::string metrics_json;
  std::string audit_log;  // the egress log; empty: IDDIR/egress.jsonl
  EdgePrivacy privacy;  // noise on the cut and NoPeek (none by default)
  // Checkpoints (sealed with IDDIR/checkpoint.key): every N steps and each epoch's end; a
  // restart with the same folder resumes from the newest. Empty: none.
  std::string checkpoint_dir;
  // A safetensors file of the whole model (PyTorch names and layouts) to start from; only
  // the front shard's tensors are read.
  std::string init_from;
  // This edge's share of the training set (split-federated runs): shard_index of
  // shard_count, dealt "iid" or by "class".
  int shard_index = 0, shard_count = 1;
  std::string split = "iid";
  float proximal_mu = 0.0f;  // FedProx (split-federated runs)
  bool front_updates_per_round = false;  // EdgeSession::FrontUpdates (split-federated runs)
  bool group_by_length = false;          // EventEdgeConfig::group_by_length
  bool recompute = true;                 // EventEdgeConfig::recompute (--stash-attention: off)
  bool async = false;                    // EventEdgeConfig::async (--pipeline async)
  int64_t checkpoint_every = 100;
  // How often to say Hello again when the cloud answers Busy (at its bound on connections),
  // after 1, 2, 4 ... up to 30 s (jittered); 0: give up at the first Busy.
  int connect_retries = 8;
  // After a dropped connection (or one that cannot be made), connect again after 1, 2, 4 ...
  // up to 30 s (jittered) and resume from the newest checkpoint both sides hold, up to this
  // many times in a row without progress; 0: the run ends at the first drop.
  int reconnects = 10;
  // The last epoch's training activations as sent, with their samples' indices, written here
  // at the run's end (edge/agent/sent_record.h): its last record_sent_limit samples. Empty: none.
  std::string record_sent;
  int64_t record_sent_limit = 1000;
  std::string client_id = "edge";
};

// Runs the training; returns the process exit code (1 with a message on a refusal).
int train_over_wss(const EdgeTrainOptions& options);

}  // namespace tandem
