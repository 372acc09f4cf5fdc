// tandem-cloud: the cloud side's command line: the split-training service (`serve`) and the
// PKI (`pki init`, `issue`, `token`, `revoke`, `list`).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "cloud/pki/identities.h"
#include "cloud/pki/pki.h"
#include "cloud/pki/token.h"
#include "cloud/service/cloud_service.h"
#include "collective/nccl_group.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/wire/tensor_codec.h"
#include "cli/command_line.h"
#include "pipeline/replicas.h"

namespace tandem {
namespace {

constexpr const char* kServeDetails = R"(
      Serves split training over wss:// with mutual TLS: one session per edge, the back
      shard and loss on the backend (default cuda where a GPU can be used and this build has
      the cuda backend, else onednn; on cuda every session has its own stream, and all
      sessions' device memory stays within --gpu-memory-mb, default 90% of the GPU's: a
      session that would pass it is closed with an Error that says so, the others go on),
      its kernels on T threads a session
      (default 1, for many edges at once; a big host's cores can go to a few sessions, as
      batched heads spread across them). Runs `pki init` on first start.
      --cut any serves every legal cut: each edge's Hello names its own (tandem-edge --cut auto).
      --cut A,B serves the middle of a U-shaped split (A to B): the edge keeps the front, the
      tail and the loss, so Forwards carry no labels (any that do are refused).
      B and K are the most an edge may use. LIST: the wire dtypes edges may send
      activations and receive gradients in (default f32,f16,bf16,i8; each session uses the
      first the edge offers). OPTIMIZER: --optimizer sgd|adam|adamw --lr X --momentum X
      --nesterov --weight-decay X --beta1 X --beta2 X --eps X --clip-norm X, for the back
      shard; each step's learning rate is scaled by the factor the edge's schedule sends.
      An edge run with --checkpoint-dir makes this service checkpoint its back shard at the
      same steps, in DIR/checkpoints/CLIENT/ (the newest three kept); a restarted edge
      resumes both sides from its step. --init-from starts the back shard from a
      safetensors file of the whole model (PyTorch names and layouts, e.g. `tandem export`).
      --aggregate-every S: split-federated training. One back shard trains with every edge
      (a step at a time, in turns); every S steps each edge sends its front shard, and when
      all connected edges have and they are at least M (default 1), or D seconds (default
      30) after the first with at least M or all there are, their average weighted by
      samples goes back to each of them. An edge that
      joins late or comes back starts from the newest average. --back-accumulate N sums N
      edge steps' gradients into one update of the back shard. --batch-edges runs those N
      steps together instead of in turns: micro-batches the edges hand in within W ms
      (default 5) of each other are one batch on the back shard (one forward and backward,
      each edge's rows of the cut's gradient back to it), so the cloud's throughput grows
      with the edges. The update equals the N steps run in turns (each step sees the
      window's weights, and weight gradients sum over rows either way); batch norm's batch
      statistics and dropout's masks then cover the joined batch. Give N the number of
      edges; the loss must be the cloud's (not a U-shaped cut). After each round the
      shared back shard and the round's average are checkpointed in DIR/federation/; a
      restarted cloud continues from the newest round that loads. --metrics-json: a JSON line
      per round and per closed session (client, steps, samples, loss, rounds, bytes, busy).
      --accept-tokens: an edge may connect without a client certificate if its Hello
      carries an enrolment token (`pki token`) for its client name; each token works once.
      --web DIR also serves DIR's files over https on the same port (the browser edge's
      page, docs/10-browser-edge.md) and implies --accept-tokens.
      --metrics-listen HOST:PORT serves Prometheus' text format at /metrics (sessions,
      steps, samples, bytes, errors by code, refusals by reason, rounds, busy time, queue
      depths) and "ok" at /healthz, over plain HTTP (keep it on a private interface).
      Limits: at most N connections at once (default 256) and N that have not said Hello
      (default 64), both refused beyond with a Busy Error; the TLS handshake must finish in
      S seconds (default 10) and the Hello come S seconds after it (default 10); a session
      with more than N MiB waiting in either direction (default 512) is closed. Revoked
      identities (`pki revoke`) are refused, and their live sessions closed within a second.
      --session-memory-mb N: the sessions' back shards together stay within N MiB, by an
      estimate made when a Hello is accepted, at the cloud's B (weights, gradients and
      optimizer state, what a step keeps for backward, a forward and backward of B; printed
      at start): beyond, an edge is answered Busy and says Hello again later; one that could
      never fit is refused with NoRoom. Default: no bound, on cuda --gpu-memory-mb's.
      --weight-grads deferred (default): each gradient of the cut goes back before the back
      shard's own weight gradients, which run while the session waits for the edge (the
      zero-bubble split of backward; the same sums bit for bit); inline computes them first.
      --replica-set DIR (with --aggregate-every, --back-accumulate N and --batch-edges): this
      cloud is one replica of several, each serving edges of its own (N each), that keep one
      back shard and one round average: every update all-sums the replicas' gradients,
      weighted by the rows each trained (or, --replica-mode local-sgd, the weights are
      averaged every H updates), and every round averages all their edges' fronts, so R
      replicas of N edges train as one cloud of R x N edges would. They meet in DIR (a folder
      all can write: local, or shared storage across machines) and talk over Gloo's TCP on
      --replica-address, which is neither encrypted nor authenticated: a private address
      only, unless --replica-allow-public. The first --replicas R form the set; a replica
      started later (or restarted) joins at the next update and takes rank 0's shard,
      optimizer state and round before it serves; a replica that dies is dropped within
      seconds and the others go on, its edges resuming on them (the share, R x N edges over
      the replicas alive, grows; an edge resumes at a round's boundary: give edges
      --checkpoint-every a multiple of S). A replica with no edge takes part idle. /metrics
      adds the epoch, members, collectives, bytes and seconds.
      Stops on SIGINT or SIGTERM.
)";


std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int pki_init(const CliArgs& args) {
  const auto r = pki::init(args.required("state-dir"), split_commas(args.str("hosts", "localhost,127.0.0.1")));
  std::printf("%s %s (server certificate %s)\n", r.created ? "created CA" : "CA already present:", r.ca_cert.c_str(),
              r.server_cert.c_str());
  return 0;
}

int pki_token(const CliArgs& args) {
  std::printf("%s\n", pki::issue_token(args.required("state-dir"), args.required("client"),
                                       pki::parse_ttl(args.str("ttl", "1h")))
                          .c_str());
  return 0;
}

int pki_revoke(const CliArgs& args) {
  const std::string dir = args.required("state-dir"), client = args.required("client");
  pki::check_client_name(client);
  pki::require_ca(dir);
  const pki::Revocation r = pki::revoke(dir, client);
  std::printf("revoked '%s' at %s: %zu certificate%s by serial%s, enrolment tokens issued until now, and any "
              "certificate with this name the register does not know; a running cloud closes its sessions within "
              "seconds\n",
              client.c_str(), pki::utc_text(r.revoked_at).c_str(), r.serials.size(), r.serials.size() == 1 ? "" : "s",
              r.serials.empty() ? " (none in the register)" : "");
  return 0;
}

int pki_list(const CliArgs& args) {
  const std::string dir = args.required("state-dir");
  pki::require_ca(dir);
  const auto issued = pki::issued_certificates(dir);
  const auto revoked = pki::revocations(dir);
  std::printf("%-24s %-34s %-24s %-24s %s\n", "client", "serial", "issued", "expires", "status");
  const auto now = static_cast<int64_t>(std::time(nullptr));
  for (const pki::IssuedCertificate& c : issued) {
    std::string status = c.not_after <= now ? "expired" : "valid";
    for (const pki::Revocation& r : revoked)
      if (std::find(r.serials.begin(), r.serials.end(), c.serial) != r.serials.end())
        status = "revoked " + pki::utc_text(r.revoked_at);
    std::printf("%-24s %-34s %-24s %-24s %s\n", c.client.c_str(), c.serial.c_str(),
                pki::utc_text(c.issued_at).c_str(), pki::utc_text(c.not_after).c_str(), status.c_str());
  }
  for (const pki::Revocation& r : revoked)
    std::printf("revoked client '%s' since %s: its tokens issued until then, and its certificates by serial or "
                "unknown to the register, are refused\n",
                r.client.c_str(), pki::utc_text(r.revoked_at).c_str());
  if (issued.empty()) std::printf("(no identities issued by this CA are recorded in %s/issued.tsv)\n", dir.c_str());
  return 0;
}

int pki_issue(const CliArgs& args) {
  const std::string out = args.required("out");
  pki::issue(args.required("state-dir"), args.required("client"), out,
             args.has("hosts") ? split_commas(args.str("hosts", "")) : std::vector<std::string>{});
  std::printf("issued %s/client.crt for '%s' (with client.key and ca.crt)\n", out.c_str(),
              args.required("client").c_str());
  return 0;
}

int serve_command(const CliArgs& args) {
  ServeOptions o;
  const HostPort listen = args.host_port("listen", "");
  o.host = listen.host;
  o.port = listen.port;
  o.state_dir = args.required("state-dir");
  o.model_path = args.required("model");
  o.cut = args.str("cut", "");
  o.batch_size = static_cast<uint32_t>(args.integer("batch", 64, 1));
  o.microbatches = static_cast<uint32_t>(args.integer("microbatches", 4, 1));
  o.optimizer = args.optimizer_options();
  o.seed = static_cast<uint64_t>(args.integer("seed", 1, 0));
  o.backend = args.has("backend") ? args.str("backend", "") : default_cloud_backend();
  o.gpu_memory_bytes = static_cast<std::size_t>(args.integer("gpu-memory-mb", 0, 0)) << 20;
  o.session_memory_bytes = static_cast<std::size_t>(args.integer("session-memory-mb", 0, 0)) << 20;
  o.threads = static_cast<int>(args.integer("threads", 1, 1));
  o.io_threads = static_cast<int>(args.integer("io-threads", 0, 0));
  if (o.io_threads > 64) fail("cli", cat("--io-threads ", o.io_threads, " is more than 64"));
  o.max_message_bytes = static_cast<std::size_t>(args.integer("max-message-mb", 64, 1)) << 20;
  o.init_from = args.str("init-from", "");
  o.federation.aggregate_every = static_cast<uint32_t>(args.integer("aggregate-every", 0, 0));
  o.federation.min_edges = static_cast<uint32_t>(args.integer("min-edges", 1, 1));
  o.federation.deadline_s = args.number("round-deadline-s", 30.0);
  o.federation.back_accumulate = static_cast<uint32_t>(args.integer("back-accumulate", 1, 1));
  o.federation.batch_edges = args.has("batch-edges");
  o.federation.batch_gather_s = args.number("batch-gather-ms", 5.0) / 1000.0;
  if (o.federation.batch_edges && (o.federation.aggregate_every == 0 || o.federation.back_accumulate < 2))
    fail("cli", "--batch-edges joins the edge steps one update of the shared back shard sums: give --aggregate-every S "
                "and --back-accumulate N with N at least 2 (the number of edges)");
  if (!(o.federation.batch_gather_s >= 0.0 && o.federation.batch_gather_s <= 10.0))
    fail("cli", "--batch-gather-ms must be in [0, 10000]");
  o.replicas.set_dir = args.str("replica-set", "");
  if (!o.replicas.set_dir.empty()) {
    o.replicas.id = args.required("replica-id");
    o.replicas.initial = static_cast<uint32_t>(args.integer("replicas", 1, 1));
    o.replicas.address = args.str("replica-address", "127.0.0.1");
    o.replicas.allow_public = args.has("replica-allow-public");
    o.replicas.engine = args.str("replica-engine", "gloo");
    if (o.replicas.engine != "gloo" && o.replicas.engine != "nccl")
      fail("cli", cat("--replica-engine ", o.replicas.engine, ": gloo (TCP, on CPUs) or nccl (one GPU a replica)"));
    if (o.replicas.engine == "nccl" && !nccl_built())
      fail("cli", "--replica-engine nccl: this build of tandem has no NCCL; build it where the CUDA toolkit and NCCL are "
                  "found, or use gloo");
    o.replicas.mode = args.str("replica-mode", "sync");
    replica_mode(o.replicas.mode);  // an Error naming the modes
    o.replicas.average_every = static_cast<uint32_t>(args.integer("replica-average-every", 1, 1));
    o.replicas.timeout_s = args.number("replica-timeout-s", 60.0);
    if (!(o.replicas.timeout_s >= 1.0)) fail("cli", "--replica-timeout-s must be at least 1");
  } else {
    for (const char* name : {"replica-id", "replicas", "replica-address", "replica-mode", "replica-average-every",
                             "replica-timeout-s", "replica-engine"})
      if (args.has(name)) fail("cli", cat("--", name, " configures a replica of a replica set: give --replica-set DIR too"));
  }
  o.metrics_json = args.str("metrics-json", "");
  o.web_root = args.str("web", "");
  o.accept_tokens = args.has("accept-tokens") || !o.web_root.empty();
  if (args.has("metrics-listen")) {
    const HostPort m = args.host_port("metrics-listen", "");
    o.metrics_host = m.host;
    o.metrics_port = m.port;
  }
  o.max_connections = static_cast<std::size_t>(args.integer("max-connections", 256, 1));
  o.max_pending_hello = static_cast<std::size_t>(args.integer("max-pending-hello", 64, 1));
  o.handshake_timeout_s = static_cast<int>(args.integer("handshake-timeout-s", 10, 1));
  o.hello_timeout_s = static_cast<int>(args.integer("hello-timeout-s", 10, 1));
  o.max_queued_bytes = static_cast<std::size_t>(args.integer("max-queued-mb", 512, 1)) << 20;
  const std::string weight_grads = args.str("weight-grads", "deferred");
  if (weight_grads != "deferred" && weight_grads != "inline")
    fail("cli", cat("--weight-grads: '", weight_grads, "' is neither deferred nor inline"));
  o.defer_weights = weight_grads == "deferred";
  o.wire_dtypes.clear();
  for (const std::string& name : split_commas(args.str("wire-dtypes", "f32,f16,bf16,i8"))) {
    const auto d = parse_dtype(name);
    if (!d) fail("cli", cat("--wire-dtypes: unknown dtype '", name, "' (known: f32, f16, bf16, i8)"));
    o.wire_dtypes.push_back(*d);
  }
  return serve(o);
}

void declare_commands(Program& program) {
  program.command("serve", "serve split training to edges over wss:// with mutual TLS")
      .option("listen", "HOST:PORT", "the address to serve on (required; port 0: any free port)")
      .option("state-dir", "DIR", "the CA, the server's certificate, checkpoints and federation state (required)")
      .option("model", "SPEC", "the model spec, JSON (required)")
      .option("cut", "NODE|A,B|any", "the cut served (default: the spec's); a module's name: after its last node; A,B: the middle of a U-shaped split; any: each edge's own")
      .option("batch", "B", "the largest batch an edge may use (default 64)")
      .option("microbatches", "K", "the most micro-batches a step an edge may use (default 4)")
      .optimizer_options(false)
      .option("seed", "S", "the seed of the back shard's initialisation (default 1)")
      .option("backend", "NAME", "the back shard's kernels (default cuda where a GPU can be used, else onednn)")
      .option("threads", "T", "kernel threads a session (default 1)")
      .option("io-threads", "N", "threads running the edges' TLS (default 0: one for every 8 cores this process may use, 1 to 8)")
      .option("max-message-mb", "N", "the largest message taken from an edge, MiB (default 64)")
      .option("wire-dtypes", "LIST", "the dtypes edges may use on the wire (default f32,f16,bf16,i8)")
      .option("init-from", "FILE", "start the back shard from a safetensors file of the whole model (PyTorch names)")
      .option("metrics-json", "FILE", "append a JSON line per round and per closed session to FILE")
      .flag("accept-tokens", "let an edge in without a client certificate, with an enrolment token")
      .option("web", "DIR", "also serve DIR's files over https (the browser edge's page); implies --accept-tokens")
      .option("aggregate-every", "S", "split-federated: average the edges' fronts every S steps (default 0: off)")
      .option("min-edges", "M", "federated: the fewest edges a round averages (default 1)")
      .option("round-deadline-s", "D", "federated: average what is there D seconds after the first front (default 30)")
      .option("back-accumulate", "N", "federated: sum N edge steps into one update of the back shard (default 1)")
      .flag("batch-edges", "federated: run those N steps as one batch on the back shard")
      .option("batch-gather-ms", "W", "with --batch-edges: join micro-batches handed in within W ms (default 5)")
      .option("replica-set", "DIR", "federated, batched: be one replica of several serving one shared back shard, meeting in DIR (shared by all)")
      .option("replica-id", "NAME", "with --replica-set: this replica's unique name in the set (required)")
      .option("replicas", "R", "with --replica-set: the replicas that form the set (default 1; later ones join it)")
      .option("replica-address", "IP", "with --replica-set: the private address its collectives listen on (default 127.0.0.1)")
      .option("replica-engine", "gloo|nccl", "with --replica-set: the collectives over Gloo's TCP (default) or NCCL, one GPU a replica")
      .flag("replica-allow-public", "with --replica-set: allow a public --replica-address (Gloo's TCP is neither encrypted nor authenticated)")
      .option("replica-mode", "sync|local-sgd", "with --replica-set: gradients all-summed every update (default), or weights averaged")
      .option("replica-average-every", "H", "with --replica-mode local-sgd: updates between two averages (default 1)")
      .option("replica-timeout-s", "S", "with --replica-set: the wait for the others, and for each collective (default 60)")
      .option("metrics-listen", "HOST:PORT", "serve Prometheus' /metrics and /healthz over plain HTTP here")
      .option("max-connections", "N", "connections at once, beyond which edges are answered Busy (default 256)")
      .option("max-pending-hello", "N", "connections that have not said Hello yet (default 64)")
      .option("handshake-timeout-s", "S", "the TLS handshake's deadline (default 10)")
      .option("hello-timeout-s", "S", "the Hello's deadline after the handshake (default 10)")
      .option("max-queued-mb", "N", "close a session with more than N MiB waiting either way (default 512)")
      .option("weight-grads", "deferred|inline", "the back shard's weight gradients after or before the cut's (default deferred)")
      .option("gpu-memory-mb", "N", "cuda: all sessions' device memory together (default 90% of the GPU's)")
      .option("session-memory-mb", "N", "all sessions' back shards together, by estimate (default: no bound)")
      .details(kServeDetails)
      .run(serve_command);
  Command& pki = program.command("pki", "the edges' identities: a CA, certificates, enrolment tokens, revocations");
  // Every pki command works on the cloud's state folder.
  const auto pki_command = [&pki](const char* name, const char* description) -> Command& {
    return pki.command(name, description).option("state-dir", "DIR", "the cloud's state folder (required)");
  };
  pki_command("init", "make a CA and a server certificate in DIR, unless DIR has them")
      .option("hosts", "NAME,NAME...", "the names and addresses edges reach the cloud by (default localhost,127.0.0.1)")
      .run(pki_init);
  pki_command("issue", "issue an edge identity signed by DIR's CA: IDDIR/client.key, client.crt, ca.crt")
      .option("client", "NAME", "the edge's name (required)")
      .option("out", "IDDIR", "the identity folder to write; copy it to the edge (required)")
      .option("hosts", "NAME,NAME...", "names and addresses the identity may also serve TLS under: a party of a pipeline that others connect to (tandem stage)")
      .run(pki_issue);
  pki_command("token", "print a single-use enrolment token for an edge without a client certificate (a browser)")
      .option("client", "NAME", "the edge's name (required)")
      .option("ttl", "TTL", "how long the token is valid: seconds, or with s, m, h, d (default 1h)")
      .details("The service must run with --accept-tokens (or --web) to take tokens.")
      .run(pki_token);
  pki_command("revoke", "revoke an edge: its certificates and tokens are refused, its live sessions closed")
      .option("client", "NAME", "the edge's name (required)")
      .details("Its certificates (by serial, from DIR/issued.tsv, and any certificate with that name the register\n"
               "does not know) and its enrolment tokens issued until now are refused at every connection; a running\n"
               "cloud closes its live sessions within seconds. An identity issued to NAME afterwards works.")
      .run(pki_revoke);
  pki_command("list", "list the identities DIR's CA issued, valid, expired or revoked")
      .run(pki_list);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::Program program("tandem-cloud", "tandem's cloud: serves the later stages of a model to edges, and their identities.");
  tandem::declare_commands(program);
  return program.main(argc, argv);
}
