// tandem-edge: the edge agent's command line (`train`).
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "edge/agent/edge_agent.h"
#include "core/wire/tensor_codec.h"
#include "backends/registry.h"
#include "cli/command_line.h"
#include "ports/crypto/certificate_name.h"

namespace tandem {
namespace {



int train_command(const CliArgs& args) {
  EdgeTrainOptions o;
  // TLS is always on; several addresses: the replicas of one cloud, tried in turn.
  const std::string clouds = args.required("cloud");
  for (std::size_t at = 0; at <= clouds.size();) {
    const std::size_t comma = std::min(clouds.find(',', at), clouds.size());
    const HostPort cloud = CliArgs({{"cloud", clouds.substr(at, comma - at)}}).host_port("cloud", "wss://");
    if (at == 0) {
      o.host = cloud.host;
      o.port = cloud.port;
    } else {
      o.more_clouds.emplace_back(cloud.host, cloud.port);
    }
    at = comma + 1;
  }
  o.identity_dir = args.required("identity");
  o.model_path = args.required("model");
  o.cut = args.str("cut", "");
  o.data = args.str("data", "fashion-mnist");
  o.epochs = args.integer("epochs", 1, 0);  // 0: only evaluate the starting weights
  o.limit = args.integer("limit", 0, 0);
  o.test_limit = args.integer("test-limit", 0, 0);
  o.batch = static_cast<uint32_t>(args.integer("batch", 64, 1));
  o.microbatches = static_cast<uint32_t>(args.integer("microbatches", 4, 1));
  o.optimizer = args.optimizer_options();
  o.schedule = args.schedule_options(0);  // cosine's length: the run's steps, known once the data is
  o.seed = static_cast<uint64_t>(args.integer("seed", 1, 0));
  o.backend = args.str("backend", "xnnpack");
  o.threads = static_cast<int>(args.integer("threads", 1, 1));
  o.uplink_mbps = args.number("uplink-mbps", 0.0);
  o.downlink_mbps = args.number("downlink-mbps", 0.0);
  o.cloud_gflops = args.number("cloud-gflops", 0.0);
  const std::string dtype = args.str("wire-dtype", "f32");
  const auto wanted = parse_dtype(dtype);
  if (!wanted) fail("cli", cat("--wire-dtype: unknown dtype '", dtype, "' (known: f32, f16, bf16, i8)"));
  o.wire_dtypes = {*wanted};
  if (*wanted != wire::DType::F32) o.wire_dtypes.push_back(wire::DType::F32);
  o.metrics_json = args.str("metrics-json", "");
  o.audit_log = args.str("audit-log", "");
  o.privacy.dp_clip = static_cast<float>(args.number("dp-clip", 0.0));
  o.privacy.dp_noise = static_cast<float>(args.number("dp-noise", 0.0));
  o.privacy.dp_delta = args.number("dp-delta", 1e-5);
  o.privacy.dp_epsilon_budget = args.number("dp-epsilon-budget", 0.0);
  const std::string dp_eval = args.str("dp-eval", "noised");
  if (dp_eval != "noised" && dp_eval != "clean") fail("cli", cat("--dp-eval: '", dp_eval, "' is neither noised nor clean"));
  o.privacy.dp_noise_evaluation = dp_eval == "noised";
  o.privacy.nopeek = static_cast<float>(args.number("nopeek", 0.0));
  o.privacy.grad_clip = static_cast<float>(args.number("grad-clip", 0.0));
  o.privacy.grad_noise = static_cast<float>(args.number("grad-noise", 0.0));
  o.privacy.label_noise = static_cast<float>(args.number("label-noise", 0.0));
  if (const std::string why = o.privacy.problem(); !why.empty()) fail("cli", why);
  o.token = args.str("token", "");
  // The client id the cloud binds this edge to: its certificate's name (a token's edge: the
  // identity folder's name, which the token must be for).
  std::string base = o.identity_dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = base.substr(base.rfind('/') == std::string::npos ? 0 : base.rfind('/') + 1);
  const std::string certificate = o.identity_dir + "/client.crt";
  if (o.token.empty() && std::filesystem::exists(certificate)) base = certificate_common_name(certificate);
  o.client_id = args.str("client-id", base.empty() || base[0] == '.' ? "edge" : base);
  o.checkpoint_dir = args.str("checkpoint-dir", "");
  o.checkpoint_every = args.integer("checkpoint-every", 100, 0);
  o.connect_retries = static_cast<int>(args.integer("connect-retries", 8, 0));
  o.reconnects = static_cast<int>(args.integer("reconnects", 10, 0));
  o.record_sent = args.str("record-sent", "");
  o.record_sent_limit = args.integer("record-sent-limit", 1000, 1);
  o.init_from = args.str("init-from", "");
  if (args.has("shard")) {
    const std::string shard = args.str("shard", "");
    const auto slash = shard.find('/');
    try {
      if (slash == std::string::npos) throw std::invalid_argument("no slash");
      o.shard_index = std::stoi(shard.substr(0, slash));
      o.shard_count = std::stoi(shard.substr(slash + 1));
    } catch (const std::exception&) {
      fail("cli", cat("--shard wants I/N (edge I of N, from 0), got '", shard, "'"));
    }
    if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count)
      fail("cli", cat("--shard ", shard, ": I must be in [0, N)"));
  }
  o.split = args.str("split", "iid");
  o.proximal_mu = static_cast<float>(args.number("proximal-mu", 0.0));
  const std::string front_updates = args.str("front-updates", "step");
  if (front_updates != "step" && front_updates != "round")
    fail("cli", cat("--front-updates: '", front_updates, "' is neither step nor round"));
  o.front_updates_per_round = front_updates == "round";
  o.group_by_length = args.has("group-by-length");
  o.recompute = !args.has("stash-attention");
  const std::string pipeline = args.str("pipeline", "sync");
  if (pipeline != "sync" && pipeline != "async") fail("cli", cat("--pipeline: '", pipeline, "' is neither sync nor async"));
  o.async = pipeline == "async";
  return train_over_wss(o);
}

constexpr const char* kTrainDetails = R"(
      Trains the front shard on local Fashion-MNIST (or DIR/train.safetensors and
      DIR/test.safetensors: a tensor per model input, named as in the spec, and "labels";
      models with token ids, masks or boxes) against the cloud (mutual TLS with
      IDDIR/client.crt, client.key, ca.crt from `tandem-cloud pki issue`); raw data never
      leaves this machine, only cut-layer activations. Evaluates through the cloud after
      each epoch; prints progress and metrics (also JSON lines in FILE). --wire-dtype asks
      for activations and gradients in f16 (scaled per tensor), bf16 or int8 (scale per
      tensor) on the wire, falling back to f32 if the cloud does not take it.
      With the spec's length_buckets, each micro-batch runs at the smallest bucket that
      holds its longest sequence; --group-by-length also orders each epoch so a batch holds
      sequences of like length (megabatches of 50 batches sorted by length, their batches
      shuffled): fewer tokens a step, at some cost in accuracy when length and class go
      together (bench/length_buckets.sh). Attention layers compute their probabilities again
      in backward rather than keep them (a tokens x tokens table a head and micro-batch in
      flight); --stash-attention keeps them: faster, more memory.
      --pipeline async starts each step's forwards before the gradients of the step before it
      are in (weight stashing: each micro-batch backs up on the weights its forward used, and
      its gradient is applied one update late), so the edge computes instead of waiting;
      a step that ends an epoch, saves a checkpoint or ends the run waits for the one
      before it. Plain split training only (not with a U-shaped cut, --dp-clip, --nopeek or
      --front-updates round; the cloud refuses nothing: it sees steps in order). sync (the
      default) applies each step's update before the next step's forwards.
      OPTIMIZER: --optimizer sgd|adam|adamw --lr X --momentum X --nesterov --weight-decay X
      --beta1 X --beta2 X --eps X --clip-norm X (the cloud has its own; --clip-norm clips
      this shard's gradients). SCHEDULE: --schedule constant|step|cosine --warmup-steps N
      --step-size N --gamma X --min-lr-factor X [--total-steps N]; the edge sends each
      step's factor to the cloud, which scales its own learning rate by it. --cut auto runs
      the planner (`tandem plan`) here first and trains with its cut and K (K up to
      --microbatches); the cloud must serve that cut (tandem-cloud serve --cut any).
      A cloud at its bound on connections answers Busy: the edge says Hello again after 1,
      2, 4 ... up to 30 s (jittered), at most --connect-retries times (default 8; 0: none).
      A connection that drops mid-run (a restarted cloud, a link down, a cloud silent for
      120 s) is made again after the same backoff, and the run resumes from the newest
      checkpoint both sides hold (so give --checkpoint-dir), up to --reconnects times in a
      row without progress (default 10; 0: the run ends at the first drop); the metrics
      count reconnects and steps_redone.
      --audit-log FILE (default IDDIR/egress.jsonl): every message this edge sends is
      appended there before it leaves, as a hash-chained JSON line (type, step, tensor
      names, shapes, dtypes, bytes, SHA-256 of each payload), with a summary at the run's
      end; `tandem audit verify FILE` checks the chain and says what left.
      --dp-clip C --dp-noise SIGMA: differential privacy on the cut: each sample's
      activations are clipped to L2 norm C and get Gaussian noise of SIGMA * C before they
      leave (training and evaluation); epsilon at D (default 1e-5) for the training set is
      accounted (RDP, sampling rate batch / samples) and printed with each epoch
      (dp_epsilon); --dp-epsilon-budget E stops the run before a step would pass E.
      --dp-eval clean sends the evaluation set's activations without noise (default
      noised): epsilon covers the training set only, and the cloud sees the others as they are.
      --nopeek ALPHA: NoPeek, ALPHA times the distance correlation between each
      micro-batch's images and its cut activations joins the front's loss (the cloud never
      sees it), so the activations say less about the images; each epoch reports the
      correlation (dcor). Try 0.1 to 1; it costs accuracy as it rises.
      --cut A,B trains U-shaped (the cloud serves the same cut): this edge runs the front up
      to A and the tail from B with the loss, the cloud the middle; no label leaves. The
      gradient this edge then sends up is computed from the labels: --grad-clip C
      --grad-noise SIGMA clips each sample's gradient (of its own loss) to L2 norm C and adds
      Gaussian noise of SIGMA * C before it leaves (bench/privacy/label_leakage.sh).
      --label-noise SIGMA (U-shaped): Gaussian noise of SIGMA on each sample's loss gradient
      at the logits, for the gradient sent up only (the tail trains on the exact one): where
      the labels enter, so it hides them at less cost than --grad-noise. Try 0.25 to 0.5
      (bench/privacy/label_leakage.sh). Neither claims an epsilon.
      --checkpoint-dir keeps checkpoints of the front shard there, encrypted with
      IDDIR/checkpoint.key (made on first use), every STEPS steps (default 100; 0: only at
      each epoch's end); the cloud checkpoints its back shard at the same steps. Run the
      same command again after a crash of either side and training resumes from the last
      checkpoint, exactly. --client-id names this edge to the cloud (default: the name
      IDDIR/client.crt was issued to, the only one the cloud accepts from that certificate;
      with --token, the name of IDDIR); the cloud keeps its checkpoints under that name.
      --init-from starts the front
      shard from a safetensors file of the whole model (PyTorch names and layouts, e.g. from
      `tandem export`); only the front's tensors are read. --shard I/N trains on this edge's
      share of the data only (edge I of N, from 0): dealt evenly (iid, the default) or by
      class (sorted by class, edge I takes the I-th of N equal slices: 2 or 3 classes each
      with N = 4); for split-federated runs against
      tandem-cloud serve --aggregate-every S, which this edge then follows. --front-updates
      round keeps the round's average through each round and takes one optimizer step on
      the sum of the round's gradients before sending the front (every edge's front stays
      the same within a round: the choice for non-IID data, with a per-step-sized --lr such
      as 0.005 and --momentum 0); step (the default) updates after every step (FedAvg's
      local SGD). --proximal-mu adds FedProx's MU * (w - w_round) to the front's gradients. --token: connect without
      a client certificate, with an enrolment token from `tandem-cloud pki token` (single
      use, for the client id; IDDIR needs only ca.crt); the cloud must run --accept-tokens.
)";

void declare_train(Command& c) {
  c.option("cloud", "wss://HOST:PORT[,...]", "the cloud service (required; TLS is always on); several: a replica set's replicas, tried in turn")
   .option("identity", "IDDIR", "this edge's identity folder from `tandem-cloud pki issue`: client.crt, client.key, ca.crt (required)")
   .option("model", "SPEC", "the model spec, JSON (required)")
   .option("cut", "NODE|A,B|auto", "where the model splits (default: the spec's cut); a module's name: after its last node; A,B: U-shaped; auto: planned here")
   .option("data", "fashion-mnist|DIR", "the training data: Debian's Fashion-MNIST, or DIR/train.safetensors and DIR/test.safetensors (default fashion-mnist)")
   .option("epochs", "N", "epochs to train (default 1; 0: only evaluate)")
   .option("limit", "SAMPLES", "train on the first SAMPLES samples (default 0: all)")
   .option("test-limit", "SAMPLES", "evaluate on the first SAMPLES test samples (default 0: all)")
   .option("batch", "B", "samples a step (default 64)")
   .option("microbatches", "K", "micro-batches a step, in flight together (default 4)")
   .option("pipeline", "sync|async", "async starts a step's forwards before the last step's gradients are in (default sync)")
   .flag("group-by-length", "order each epoch so a batch holds sequences of like length")
   .flag("stash-attention", "keep attention's probabilities for backward (faster, more memory)")
   .optimizer_options(true)
   .option("seed", "S", "the seed of initialisation and shuffling (default 1)")
   .option("backend", "NAME", "the front shard's kernels (default xnnpack; `tandem backends` lists them)")
   .option("threads", "T", "kernel threads (default 1)")
   .option("wire-dtype", "f32|f16|bf16|i8", "the dtype of activations and gradients on the wire (default f32)")
   .option("metrics-json", "FILE", "append each epoch's metrics to FILE as JSON lines")
   .option("client-id", "NAME", "this edge's name to the cloud (default: the name its certificate was issued to)")
   .option("token", "TOKEN", "connect with an enrolment token (`tandem-cloud pki token`) instead of a client certificate")
   .option("audit-log", "FILE", "the egress log: every message sent, hash-chained (default IDDIR/egress.jsonl)")
   .option("connect-retries", "N", "Hello again this many times while the cloud is busy (default 8; 0: none)")
   .option("reconnects", "N", "after a dropped connection, reconnect and resume up to N times in a row (default 10)")
   .option("record-sent", "FILE", "for studies of what leaves: the last epoch's activations as sent, in a safetensors file")
   .option("record-sent-limit", "N", "with --record-sent: the last N samples sent (default 1000)")
   .option("uplink-mbps", "U", "with --cut auto: the uplink's Mbit/s")
   .option("downlink-mbps", "D", "with --cut auto: the downlink's Mbit/s (default: the uplink's)")
   .option("cloud-gflops", "G", "with --cut auto: the cloud's GFLOP/s (default: measured here)")
   .option("dp-clip", "C", "differential privacy: clip each sample's activations to L2 norm C")
   .option("dp-noise", "SIGMA", "differential privacy: Gaussian noise of SIGMA * C on the clipped activations")
   .option("dp-delta", "D", "the delta epsilon is accounted at (default 1e-5)")
   .option("dp-epsilon-budget", "E", "stop before a step would spend more than epsilon E")
   .option("dp-eval", "noised|clean", "noise on the evaluation set's activations too (default noised)")
   .option("nopeek", "ALPHA", "NoPeek: ALPHA times the distance correlation of inputs and activations joins the loss")
   .option("grad-clip", "C", "U-shaped: clip each sample's gradient sent up to L2 norm C")
   .option("grad-noise", "SIGMA", "U-shaped: Gaussian noise of SIGMA * C on the gradient sent up")
   .option("label-noise", "SIGMA", "U-shaped: Gaussian noise of SIGMA on the loss gradient sent up")
   .option("checkpoint-dir", "DIR", "keep encrypted checkpoints of the front shard here; a rerun resumes from them")
   .option("checkpoint-every", "STEPS", "checkpoint every STEPS steps (default 100; 0: at each epoch's end)")
   .option("init-from", "FILE", "start the front from a safetensors file of the whole model (PyTorch names)")
   .option("shard", "I/N", "train on this edge's share of the data: edge I of N, from 0")
   .option("split", "iid|class", "how --shard deals the data (default iid)")
   .option("front-updates", "step|round", "federated: update the front every step, or once a round (default step)")
   .option("proximal-mu", "MU", "federated: FedProx's MU * (w - w_round) on the front's gradients")
   .details(kTrainDetails)
   .run(train_command);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::Program program("tandem-edge", "tandem's edge: trains the front of a model on data that never leaves this machine.");
  tandem::declare_train(program.command("train", "train the front shard against a tandem cloud"));
  return program.main(argc, argv);
}
