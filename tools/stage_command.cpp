#include "tools/stage_command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <limits>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <chrono>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backends/registry.h"
#include "cli/progress.h"
#include "collective/group.h"
#include "core/error.h"
#include "core/interop/hugging_face.h"
#include "core/interop/safetensors.h"
#include "core/interop/torch_layout.h"
#include "core/wire/messages.h"
#include "core/checkpoint/checkpoint.h"
#include "core/wire/egress_audit.h"
#include "core/privacy/rdp_accountant.h"
#include "core/sha256.h"
#include "edge/agent/egress_log_file.h"
#include "edge/session/event_edge.h"
#include "pipeline/stage_peer.h"
#include "ports/files/checkpoint_store.h"
#include "ports/files/atomic_file.h"
#include "ports/files/release_ledger.h"
#include "core/wire/tensor_codec.h"
#include "ports/lws/http_listener.h"
#include "ports/lws/lws_endpoint.h"
#include "ports/tls/wss_client.h"
#include "tools/deployment.h"
#include "tools/layer_shard_party.h"
#include "tools/stage_host_command.h"
#include "tools/train_data.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// The links to the parties before: this stage's TLS WebSocket server, which takes one
// connection from each identity the deployment names there (the party before, or every first
// party of a stage they share); any other is refused. member(m) is the link to the m-th: a
// frame from another member while this stage awaits the m-th waits for its turn.
class UpstreamLinks {
 public:
  std::atomic<uint64_t> sent{0}, received{0};  // bytes, for the metrics
  // `max_queued`: the most frames a member may send ahead of its turn (a step's micro-batches,
  // its weights and its Bye are what an honest one does).
  UpstreamLinks(const DeploymentParty& self, std::vector<std::string> expected, int silence_s, std::size_t max_queued)
      : expected_(std::move(expected)), silence_(silence_s), max_queued_(max_queued), connection_(expected_.size(), 0),
        pending_(expected_.size(), 0), queued_(expected_.size()), closed_(expected_.size(), false) {
    EndpointOptions options;
    options.idle_hangup_s = silence_s;
    endpoint_ = LwsEndpoint::listen(self.host, self.port, deployment_tls(self), options);
    for (std::size_t m = 0; m < expected_.size(); ++m) views_.push_back(std::make_unique<View>(*this, m));
  }
  int port() const { return endpoint_->port(); }
  StageLink* member(std::size_t m) { return views_[m].get(); }
  std::vector<StageLink*> links() {
    std::vector<StageLink*> out;
    for (auto& v : views_) out.push_back(v.get());
    return out;
  }
  std::string names() const {
    std::string out;
    for (std::size_t m = 0; m < expected_.size(); ++m) out += cat(m ? "', '" : "'", expected_[m]);
    return out + "'";
  }

  // Tells the parties before that the pipeline starts again, and closes their links: the
  // next connection from each is taken.
  void restart(const std::string& why) {
    for (std::size_t m = 0; m < expected_.size(); ++m) {
      if (connection_[m] != 0) out(m, writer_.error(wire::ErrorCode::Restart, why), true);
      connection_[m] = pending_[m];
      pending_[m] = 0;
      queued_[m].clear();
      closed_[m] = false;
    }
  }
  void end(const std::string& why) {
    for (std::size_t m = 0; m < expected_.size(); ++m) {
      if (connection_[m] == 0) continue;
      out(m, writer_.error(wire::ErrorCode::Internal, why), true);
      drain(connection_[m]);
    }
  }

  EgressAudit* audit = nullptr;  // every message to the parties before is recorded here first

 private:
  class View final : public StageLink {
   public:
    View(UpstreamLinks& links, std::size_t m) : links_(links), m_(m) {}
    void send(std::span<const uint8_t> bytes) override { links_.out(m_, bytes, false); }
    Frame receive(const char* awaiting) override { return links_.receive(m_, awaiting); }
    void refuse(const WireError& error) override { links_.refuse(m_, error); }
    void send_last(std::span<const uint8_t> bytes) override { links_.send_last(m_, bytes); }

   private:
    UpstreamLinks& links_;
    std::size_t m_;
  };

  Frame receive(std::size_t m, const char* awaiting) {
    const std::string& name = expected_[m];
    if (!queued_[m].empty()) {
      Frame f = std::move(queued_[m].front());
      queued_[m].pop_front();
      return f;
    }
    if (closed_[m])
      throw LinkLost(cat("[stage] the party before (", name, ") closed its link while this stage awaited ", awaiting));
    const auto deadline = Clock::now() + std::chrono::seconds(silence_);
    EndpointEvent ev;
    while (Clock::now() < deadline) {
      if (!endpoint_->next(ev, std::chrono::milliseconds(500))) continue;
      if (ev.kind == EndpointEvent::Kind::Connected) {
        admit(ev);
        continue;
      }
      const auto j = static_cast<std::size_t>(
          std::find(connection_.begin(), connection_.end(), ev.connection) - connection_.begin());
      if (ev.connection == 0 || j == connection_.size()) continue;  // one refused, going away
      if (ev.kind == EndpointEvent::Kind::Closed) {
        connection_[j] = 0;
        if (j != m) {  // another member's end (its Bye is queued): noticed at its turn
          closed_[j] = true;
          continue;
        }
        throw LinkLost(cat("[stage] the party before (", name, ") closed the link while this stage awaited ", awaiting,
                           ev.text.empty() ? "" : cat(" (", ev.text, ")")));
      }
      received += ev.frame.size();
      if (j == m) return std::move(ev.frame);
      queued_[j].push_back(std::move(ev.frame));
      if (queued_[j].size() > max_queued_) {
        const std::string why = cat("'", expected_[j], "' sent more than ", max_queued_, " messages ahead of its turn: "
                                    "the first parties take turns, a step each");
        refuse(j, {wire::ErrorCode::UnexpectedMessage, why});
        fail("stage", cat("refused '", expected_[j], "': ", why));
      }
    }
    if (connection_[m] == 0)
      throw LinkUnreachable(cat("[stage] nobody connected as '", name, "' (the party before) within ", silence_,
                                " s: is its tandem stage running, and does it reach this party's address?"));
    throw LinkLost(cat("[stage] no ", awaiting, " from the party before (", name, ") within ", silence_, " s"));
  }
  void refuse(std::size_t m, const WireError& error) { send_last(m, writer_.error(error.code, error.text)); }
  void send_last(std::size_t m, std::span<const uint8_t> bytes) {  // out before the link (and the process) goes
    if (connection_[m] == 0) return;
    out(m, bytes, true);
    drain(connection_[m]);
    connection_[m] = 0;
  }
  void out(std::size_t m, std::span<const uint8_t> bytes, bool close_after) {
    if (audit) audit->record(bytes);
    sent += bytes.size();
    endpoint_->send(connection_[m], bytes, close_after);
  }
  // A connection: a party the plan names, once; anyone else is answered with an Error.
  void admit(const EndpointEvent& ev) {
    const auto m = static_cast<std::size_t>(std::find(expected_.begin(), expected_.end(), ev.text) - expected_.begin());
    if (m < expected_.size() && connection_[m] == 0 && !closed_[m]) {
      connection_[m] = ev.connection;
      return;
    }
    if (m < expected_.size() && pending_[m] == 0) {  // it started again: the link this stage holds is stale
      pending_[m] = ev.connection;
      throw LinkLost(cat("[stage] the party before (", expected_[m], ") connected again"));
    }
    const std::string why = m == expected_.size()
                                ? cat("this stage takes its activations from ", names(), " only; '", ev.text, "' is not ",
                                      expected_.size() == 1 ? "it" : "one of them")
                                : cat("'", expected_[m], "' is connected already");
    std::fprintf(stderr, "refused a connection from '%s': %s\n", ev.text.c_str(), why.c_str());
    endpoint_->send(ev.connection, writer_.error(wire::ErrorCode::Unauthorized, why), true);
  }
  void drain(uint64_t connection) {  // until the Error is out and the link closed (2 s at most)
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    EndpointEvent ev;
    while (Clock::now() < deadline)
      if (endpoint_->next(ev, std::chrono::milliseconds(100)) && ev.kind == EndpointEvent::Kind::Closed &&
          ev.connection == connection)
        return;
  }

  std::vector<std::string> expected_;
  int silence_;
  std::size_t max_queued_;
  std::unique_ptr<LwsEndpoint> endpoint_;
  std::vector<uint64_t> connection_;
  std::vector<uint64_t> pending_;  // a member's new connection, taken at the next restart()
  std::vector<std::deque<Frame>> queued_;  // frames of members whose turn it is not
  std::vector<bool> closed_;               // members whose link closed while it was not their turn
  std::vector<std::unique_ptr<View>> views_;
  MessageWriter writer_;
};

// The link to the party after: a TLS WebSocket client with this party's certificate, to
// the address the deployment names, whose server must present the identity named there.
class DownstreamLink final : public StageLink {
 public:
  std::atomic<uint64_t> sent{0}, received{0};
  DownstreamLink(const DeploymentParty& self, const DeploymentParty& next, int wait_s, int silence_s)
      : self_(self), next_party_(next), next_(next.name), wait_s_(wait_s), silence_(silence_s) {}

  // Connects (again), trying each second for --wait-s: the party after may start later.
  void open() override {
    const DeploymentParty& next = next_party_;
    const auto deadline = Clock::now() + std::chrono::seconds(wait_s_);
    std::string why;
    for (;;) {
      client_ = WssClient::connect(next.host, next.port, deployment_tls(self_));
      EndpointEvent ev;
      if (client_->next(ev, std::chrono::seconds(10)) && ev.kind == EndpointEvent::Kind::Connected) {
        if (ev.text != next_)
          fail("stage", cat(next.host, ":", next.port, " presented the identity '", ev.text, "', not '", next_,
                            "' that the deployment names there"));
        return;
      }
      why = ev.text.empty() ? "no answer" : ev.text;
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    throw LinkUnreachable(cat("[stage] cannot reach the party after, '", next_, "', at wss://", next.host, ":",
                              next.port, " within ", wait_s_, " s (", why,
                              "): start its tandem stage, or check the address and its certificate"));
  }

  void send(std::span<const uint8_t> bytes) override { out(bytes, false); }

  Frame receive(const char* awaiting) override {
    EndpointEvent ev;
    for (;;) {
      if (!client_->next(ev, std::chrono::seconds(silence_)))
        throw LinkLost(cat("[stage] no ", awaiting, " from the party after (", next_, ") within ", silence_, " s"));
      if (ev.kind == EndpointEvent::Kind::Message) {
        received += ev.frame.size();
        return std::move(ev.frame);
      }
      if (ev.kind == EndpointEvent::Kind::Closed)
        throw LinkLost(cat("[stage] the party after (", next_, ") closed the link while this stage awaited ", awaiting,
                           ev.text.empty() ? "" : cat(" (", ev.text, ")")));
    }
  }

  void restart(const std::string& why) {
    if (!client_) return;
    out(writer_.error(wire::ErrorCode::Restart, why), true);
    drain();  // out before the connection is replaced
  }
  void send_last(std::span<const uint8_t> bytes) override {
    out(bytes, true);
    drain();  // out before the client goes
  }
  void end(const std::string& why) {
    if (!client_) return;
    out(writer_.error(wire::ErrorCode::Internal, why), true);
    drain();
  }

  void refuse(const WireError& error) override {
    out(writer_.error(error.code, error.text), true);
    drain();
    client_.reset();
  }
  EgressAudit* audit = nullptr;  // every message to the party after is recorded here first

 private:
  void out(std::span<const uint8_t> bytes, bool close_after) {
    if (audit) audit->record(bytes);
    sent += bytes.size();
    client_->send(0, bytes, close_after);
  }
  void drain() {  // until the Error is out and the link closed (2 s at most)
    EndpointEvent ev;
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (Clock::now() < deadline)
      if (client_->next(ev, std::chrono::milliseconds(100)) && ev.kind == EndpointEvent::Kind::Closed) return;
  }

  const DeploymentParty &self_, &next_party_;
  std::string next_;
  int wait_s_, silence_;
  std::unique_ptr<WssClient> client_;
  MessageWriter writer_;
};

// What a party counts for Prometheus (/metrics): written by the training thread after each
// step, read by the listener's.
struct StageMetrics {
  std::atomic<uint64_t> steps{0}, restarts{0}, busy_us{0}, idle_us{0}, averages{0};
  std::string labels;  // party="...",stage="..."
  bool averaging = false;  // a first party, or the stage they share, whose first stages are averaged
  // More, in Prometheus's text, set by the training thread after each step (a split stage's
  // layer shards).
  mutable std::mutex extra_mu;
  std::string extra;
  std::string text(const UpstreamLinks* up, const DownstreamLink* down, double wall_s) const {
    std::string out;
    const auto metric = [&](const char* name, const char* type, const char* help, const std::string& sample) {
      out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", sample);
    };
    const auto one = [&](const char* name, const std::string& value) { return cat(name, "{", labels, "} ", value, "\n"); };
    metric("tandem_stage_steps_total", "counter", "Steps this party's stage has trained (again after a restart).",
           one("tandem_stage_steps_total", cat(steps.load())));
    if (averaging)
      metric("tandem_stage_first_stage_averages", "gauge",
             "The first parties' first stages averaged so far (FedAvg; counted again from a checkpoint after a restart).",
             one("tandem_stage_first_stage_averages", cat(averages.load())));
    metric("tandem_stage_restarts_total", "counter", "Times the pipeline started again from a checkpoint after a lost link.",
           one("tandem_stage_restarts_total", cat(restarts.load())));
    metric("tandem_stage_busy_seconds_total", "counter", "Seconds computing: forward, backward, update.",
           one("tandem_stage_busy_seconds_total", cat(static_cast<double>(busy_us.load()) / 1e6)));
    metric("tandem_stage_idle_seconds_total", "counter", "Seconds waiting on a link for what an action needed.",
           one("tandem_stage_idle_seconds_total", cat(static_cast<double>(idle_us.load()) / 1e6)));
    metric("tandem_stage_bubble", "gauge", "The share of this party's time since it started not spent computing.",
           one("tandem_stage_bubble", cat(wall_s > 0 ? 1.0 - static_cast<double>(busy_us.load()) / 1e6 / wall_s : 0.0)));
    std::string sent, received;
    if (up) {
      sent += cat("tandem_stage_sent_bytes_total{", labels, ",link=\"up\"} ", up->sent.load(), "\n");
      received += cat("tandem_stage_received_bytes_total{", labels, ",link=\"up\"} ", up->received.load(), "\n");
    }
    if (down) {
      sent += cat("tandem_stage_sent_bytes_total{", labels, ",link=\"down\"} ", down->sent.load(), "\n");
      received += cat("tandem_stage_received_bytes_total{", labels, ",link=\"down\"} ", down->received.load(), "\n");
    }
    metric("tandem_stage_sent_bytes_total", "counter", "Bytes sent on each link (up: to the party before).", sent);
    metric("tandem_stage_received_bytes_total", "counter", "Bytes received on each link.", received);
    std::lock_guard<std::mutex> lock(extra_mu);
    return out + extra;
  }
};

constexpr const char* kStageDetails = R"(
      Runs one party's stage of the pipeline FILE describes (tools/deployment.h, docs/09): the
      model cut at the file's cut list, one stage a party in the order of its [sections].
      Every party runs this command with the same file and its own --party. A party listens
      at its address for the party before it (mutual TLS: the connection must present the
      certificate of the name the file gives that party), and connects to the party after
      it, trying again each second for --wait-s. The first party reads the data and leads
      the steps; its metrics are the run's (JSON lines as tandem train's); the last holds the
      loss. Each party prints, and appends to --metrics-json, a summary line of its stage:
      steps, busy and idle seconds. With export = FILE in a party's section (or --export),
      it writes its stage's weights with PyTorch's names; `tandem export --stages` merges them.
      With layer-shards = S in a party's section its stage is split over S processes
      (tensor parallel): the party's own, and `--party NAME --shard R` for R = 1..S-1, which
      meet in the section's shard-set folder (docs/09).
      With first-parties = U in the file, its first U sections are first parties (several
      hospitals) that share the later stages: each trains its own first stage on its share of
      the data (every U-th sample), and they take turns, a step each.
)";

int run_party(const CliArgs& cli) {
  const Deployment deployment = read_deployment(cli.required("deployment"));
  const CliArgs args = deployment.args();
  const std::string party_name = cli.required("party");
  const std::size_t party = deployment.index_of(party_name);
  const DeploymentParty& self = deployment.parties[party];
  // first-parties = U: the first U parties each hold a first stage and take turns on the
  // later ones (StagePlan::members); party i >= U holds stage i - U + 1.
  const auto members = static_cast<uint32_t>(args.integer("first-parties", 1, 1));
  if (members >= deployment.parties.size())
    fail("cli", cat(deployment.path, ": first-parties = ", members, " leaves no party for the later stages (it has ",
                    deployment.parties.size(), " parties)"));
  const std::size_t index = party < members ? 0 : party - members + 1;  // this party's stage
  const std::size_t n = deployment.parties.size() - members + 1;        // stages
  const auto share = static_cast<uint32_t>(party < members ? party : 0);  // a first party's share of the data
  // average-every = S: the first parties' first stages averaged (FedAvg) after every S-th round.
  const auto average_every = static_cast<uint32_t>(args.integer("average-every", 0, 0));
  if (average_every > 0 && members < 2)
    fail("cli", cat(deployment.path, ": average-every = ", average_every, " averages several first parties' first "
                    "stages; add first-parties = N (N >= 2)"));
  // later-stages = "own": the party after the first parties keeps a last stage for each of
  // them, their own models (a session each, pipeline/stage_host.h), instead of one they share.
  const std::string later = args.str("later-stages", "shared");
  if (later != "shared" && later != "own")
    fail("cli", cat(deployment.path, ": later-stages = '", later, "': \"shared\" (the first parties take turns on one "
                    "model's later stages) or \"own\" (the party after them keeps each one's own last stage)"));
  const bool own = later == "own";
  if (own && deployment.parties.size() != members + 1)
    fail("cli", cat(deployment.path, ": later-stages = \"own\": one party after the first parties keeps each one's "
                    "last stage; the file has ", deployment.parties.size() - members, " parties after them"));
  if (own && average_every > 0)
    fail("cli", cat(deployment.path, ": average-every averages first stages that share later ones; with later-stages "
                    "= \"own\" each first party trains a model of its own"));
  const auto member = static_cast<uint32_t>(own ? 0 : share);  // its place among first parties taking turns
  const uint32_t taking_turns = own ? 1 : members;              // StagePlan::members
  const int wait_s = static_cast<int>(cli.integer("wait-s", 120, 1));
  const int silence_s = static_cast<int>(cli.integer("silence-s", 300, 5));

  const ModelSpec spec = load_model_spec(args.required("model"));
  const Graph graph = Graph::build(spec);
  const std::string cut = graph.cut_nodes(args.str("cut", graph.default_cut()));
  if (cut.empty()) fail("cli", cat(deployment.path, ": the spec names no default cut; add cut = \"NODE,NODE,...\""));
  const std::vector<Graph> stage_graphs = graph.partition(cut_list(cut));
  if (stage_graphs.size() != n)
    fail("cli", cat(deployment.path, ": the cut list '", cut, "' makes ", stage_graphs.size(), " stages for ",
                    deployment.parties.size(), " parties",
                    members > 1 ? cat(" (", members, " of them first parties: ", n, " stages)") : std::string(),
                    ": give one cut fewer than stages"));
  const std::unique_ptr<PipelineSchedule> schedule = make_pipeline_schedule(args.str("pipeline-schedule", "gpipe"));
  StagePeer::check_schedule(*schedule);  // before any link is made
  if (taking_turns > 1 && schedule->asynchronous())
    fail("cli", cat(deployment.path, ": pipeline-schedule = \"async\" keeps a step in flight, and the ", members,
                    " first parties' turns would cross it: use gpipe, 1f1b or zero-bubble"));
  if ((members > 1 || own) && args.str("labels", "travel") != "travel")
    fail("cli", cat(deployment.path, ": labels = \"first-party\" runs the loss stage on the first party's machine; ",
                    own ? std::string("with later-stages = \"own\" the party after it holds the loss")
                        : cat("with ", members, " first parties there is no one such machine"),
                    ": let the labels travel"));
  // A hospital of later-stages = "own" may give its own batch, micro-batches and wire dtype in
  // its section; the run's are then the most the later party takes from any of them.
  const auto run_batch = static_cast<uint32_t>(args.integer("batch", 64, 1));
  const auto run_microbatches = static_cast<uint32_t>(args.integer("microbatches", 4, 1));
  const CliArgs own_terms({{"batch", self.batch}, {"microbatches", self.microbatches}});
  const auto own_or_run = [&](const char* key, uint32_t run) {
    if (own_terms.str(key, "").empty()) return run;
    const auto value = static_cast<uint32_t>(own_terms.integer(key, 1, 1));
    if (value > run)
      fail("cli", cat(deployment.path, ": [", party_name, "] ", key, " = ", value, " is more than the run's ", key,
                      " = ", run, ", the most the later party takes: the top's batch and microbatches bound every "
                      "first party's"));
    return value;
  };
  const uint32_t batch = own_or_run("batch", run_batch), microbatches = own_or_run("microbatches", run_microbatches);
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed", 1, 0));
  const int64_t epochs = args.integer("epochs", 1, 1);

  const std::string dtype_text = self.wire_dtype.empty() ? args.str("wire-dtype", "f32") : self.wire_dtype;
  const std::optional<wire::DType> dtype = parse_dtype(dtype_text);
  if (!dtype) fail("cli", cat(deployment.path, ": wire-dtype = '", dtype_text, "' is not one of f32, f16, bf16, i8"));
  // labels = "first-party": the labels never leave the first party; the last party, on its
  // machine, reads them from the same data.
  const std::string labels_at = args.str("labels", "travel");
  if (labels_at != "travel" && labels_at != "first-party")
    fail("cli", cat(deployment.path, ": labels = '", labels_at, "': \"travel\" (with the activations, to the last "
                    "party) or \"first-party\" (the last party runs on the first party's machine and reads them there)"));
  for (std::size_t p = 0; p < members && labels_at == "first-party"; ++p)
    if (!deployment.parties[p].data.empty() || !deployment.parties[p].limit.empty())
      fail("cli", cat(deployment.path, ": [", deployment.parties[p].name, "] names its own data, and with labels = "
                      "\"first-party\" the loss stage reads the labels from the run's: give the data at the top"));
  // The run's other terms every party must share, as parsed (the optimizer's, the seed, the
  // data's extent, the checkpoints'): another lr at one party would train something else.
  const OptimizerOptions opt = args.optimizer_options();
  const std::string run_terms =
      cat("optimizer=", opt.kind, " lr=", opt.lr, " momentum=", opt.momentum, " dampening=", opt.dampening,
          " weight_decay=", opt.weight_decay, " nesterov=", opt.nesterov, " betas=", opt.beta1, ",", opt.beta2,
          " eps=", opt.eps, " clip_norm=", opt.clip_norm, " seed=", seed, " epochs=", epochs,
          " limit=", args.integer("limit", 0, 0), " test_limit=", args.integer("test-limit", 0, 0),
          // what the parties do to what they send, and so where the loss is reported
          " dp_clip=", args.number("dp-clip", 0.0), " dp_noise=", args.number("dp-noise", 0.0),
          " nopeek=", args.number("nopeek", 0.0), " grad_clip=", args.number("grad-clip", 0.0),
          " grad_noise=", args.number("grad-noise", 0.0), " label_noise=", args.number("label-noise", 0.0),
          " checkpoint_every=", args.integer("checkpoint-every", 0, 0));
  StagePlan plan = make_stage_plan(spec.binary, graph, cut, stage_graphs, index, *schedule, batch, microbatches,
                                   *dtype, labels_at == "travel", run_terms, FirstParties{taking_turns, average_every});
  plan.member = member;
  if (own && index > 0) {  // each first party's own terms, up to the run's; any dtype
    plan.own_terms = true;
    plan.accepts = {wire::DType::F32, wire::DType::F16, wire::DType::BF16, wire::DType::I8};
  }

  BackendOptions backend_options;
  backend_options.threads = self.threads;
  const std::string backend_name =
      !self.backend.empty() ? self.backend : preferred_backend(index == 0 ? "xnnpack" : "onednn");
  const int64_t checkpoint_every = args.integer("checkpoint-every", 0, 0);
  check_layer_shards(deployment, party);
  if (own && index > 0) {
    // Executors: the section's, else one a session. One executor taking its sessions in turn
    // answers each later than a thread a session does, and the first parties wait on those
    // answers: 4 sessions on one core served 0.65x of tandem-cloud's samples/s on one
    // executor and 0.99x on four (bench/results/2026-11-28-stage_host_vs_cloud*.md).
    const std::size_t executors =
        std::min<std::size_t>(members, self.executors > 0 ? static_cast<std::size_t>(self.executors) : members);
    std::fprintf(stderr, "party %s: stage 1 of stages 0..1 for each of %u first parties (%s), %s schedule, K = %u\n",
                 party_name.c_str(), members, backend_name.c_str(), schedule->name(), microbatches);
    return run_stage_host({cli, deployment, party, spec, graph, cut, stage_graphs, *schedule, plan,
                           [&] { return make_backend(backend_name, backend_options); }, executors, seed,
                           args.optimizer_options(), checkpoint_every, silence_s});
  }
  std::unique_ptr<Backend> backend = make_backend(backend_name, backend_options);
  // A stage split into layer shards (layer-shards = S in the section): this process is member
  // 0, holding its slices, and tells the others every call of the stage.
  std::unique_ptr<LayerShardParty> shards;
  std::unique_ptr<Network> unsplit;
  if (self.layer_shards > 1) {
    if (index + 1 == n && args.number("label-noise", 0.0) > 0.0)
      fail("cli", cat(deployment.path, ": label-noise backs the loss stage up twice and keeps one pass's weight "
                      "gradients, which [", party_name, "]'s layer shards would not: split another stage"));
    shards = LayerShardParty::lead({deployment, party, spec, graph, cut_list(cut), index, *backend, seed, opt,
                                    wait_s, silence_s});
  } else {
    unsplit = std::make_unique<Network>(stage_graphs[index], *backend, seed);
    init_from_whole_model(graph, seed, *unsplit, *make_backend("reference"));  // as every party draws them
  }
  Network& net = shards ? shards->network() : *unsplit;
  std::unique_ptr<Optimizer> optimizer = make_optimizer(net.params(), args.optimizer_options());
  Stage stage(net, optimizer.get());
  if (shards) stage.set_mirror(shards->mirror());

  std::fprintf(stderr, "party %s: stage %zu of stages 0..%zu%s (%zu nodes, %lld parameters, %s), %s schedule, K = %u\n",
               party_name.c_str(), index, n - 1,
               own ? cat(", first party ", share + 1, " of ", members, ", its own model").c_str()
               : members > 1 ? cat(index == 0 ? ", first party " : ", shared by ", index == 0 ? member + 1 : members,
                                   index == 0 ? cat(" of ", members) : std::string(" first parties")).c_str()
                             : "", net.graph().nodes().size(), static_cast<long long>(net.param_count()),
               std::string(backend->name()).c_str(), schedule->name(), microbatches);
  // Checkpoints: the first party asks for one every checkpoint-every steps; each party keeps
  // its newest few in its checkpoint-dir, and the state at step 0 in memory.
  std::unique_ptr<CheckpointStore> store;
  if (!self.checkpoint_dir.empty())
    store = std::make_unique<CheckpointStore>(
        self.checkpoint_dir, shards ? cat("stage", index, ".shard0-of-", self.layer_shards) : cat("stage", index));
  if (checkpoint_every > 0 && !store)
    fail("cli", cat(deployment.path, ": checkpoint-every = ", checkpoint_every, " but [", party_name,
                    "] has no checkpoint-dir = \"DIR\""));
  CheckpointMeta meta;
  meta.role = "stage";
  meta.client_id = party_name;
  meta.cut = cut;
  meta.model_hash = plan.run;
  const std::vector<uint8_t> initial = encode_checkpoint(meta, net, optimizer.get());

  // Listen first: the party before may connect at once. This party links to the one after
  // once the one before has linked to it (StagePeer::connect).
  std::unique_ptr<UpstreamLinks> up;
  if (index > 0) {
    std::vector<std::string> before;  // the party before, or every first party of a shared stage
    for (std::size_t p = index == 1 ? 0 : party - 1; p < party; ++p) before.push_back(deployment.parties[p].name);
    up = std::make_unique<UpstreamLinks>(self, before, silence_s, 2 * static_cast<std::size_t>(microbatches) + 4);
    std::fprintf(stderr, "listening on wss://%s:%d for %s\n", self.host.c_str(), up->port(), up->names().c_str());
  }
  const std::size_t party_after = party < members ? members : party + 1;
  std::unique_ptr<DownstreamLink> down;
  if (index + 1 < n) down = std::make_unique<DownstreamLink>(self, deployment.parties[party_after], wait_s, silence_s);
  // The egress audit: every message this party sends, recorded (hash-chained) before it leaves.
  std::unique_ptr<EgressLogFile> egress;
  if (!self.egress_log.empty()) {
    egress = std::make_unique<EgressLogFile>(self.egress_log);
    egress->audit().begin_run(party_name, spec.name, cut, plan.run);
    if (up) up->audit = &egress->audit();
    if (down) down->audit = &egress->audit();
  }
  const std::vector<StageLink*> up_links = up ? up->links() : std::vector<StageLink*>{};
  StagePeer peer(stage, *schedule, plan, std::span<StageLink* const>(up_links), down.get());
  if (index == 1 && average_every > 0) {  // the members' weights are checked against the first stage's
    Network front(stage_graphs[0], *backend, seed);
    NamedTensors params;
    for (Param* p : front.params()) params.emplace_back(p->name(), p->value());
    peer.set_first_stage(params);
  }
  // Privacy filters on the links (pipeline/link_filter.h, docs/04): the first party's on the
  // activations it sends down; the loss stage's on the gradient it sends up, where the labels
  // stay at the first party.
  EdgePrivacy privacy;
  privacy.dp_clip = static_cast<float>(args.number("dp-clip", 0.0));
  privacy.dp_noise = static_cast<float>(args.number("dp-noise", 0.0));
  privacy.dp_delta = args.number("dp-delta", 1e-5);
  privacy.dp_epsilon_budget = args.number("dp-epsilon-budget", 0.0);
  privacy.dp_seed = static_cast<uint64_t>(args.integer("dp-seed", 0, 0));
  privacy.nopeek = static_cast<float>(args.number("nopeek", 0.0));
  privacy.grad_clip = static_cast<float>(args.number("grad-clip", 0.0));
  privacy.grad_noise = static_cast<float>(args.number("grad-noise", 0.0));
  privacy.label_noise = static_cast<float>(args.number("label-noise", 0.0));
  if (const std::string problem = privacy.problem(); !problem.empty())
    fail("cli", cat(deployment.path, ": ", problem, " (keys without the dashes in the file)"));
  if ((privacy.grad_clip > 0.0f || privacy.label_noise > 0.0f) && plan.labels_travel)
    fail("cli", cat(deployment.path, ": ", privacy.grad_clip > 0.0f ? "grad-clip" : "label-noise",
                    " hides the labels from the gradient the loss stage sends up; with labels = \"travel\" they reach "
                    "the last party anyway: set labels = \"first-party\""));
  if (privacy.label_noise > 0.0f && graph.loss() != "softmax_cross_entropy")
    fail("cli", cat(deployment.path, ": label-noise needs a softmax cross-entropy model (its loss gradient's bound), "
                    "not '", graph.loss(), "'"));
  std::unique_ptr<NoPeekFilter> nopeek;
  std::unique_ptr<CutNoiseFilter> cut_noise;
  std::unique_ptr<GradNoiseFilter> grad_noise;
  std::vector<LinkFilter*> down_filters, up_filters;
  if (index == 0 && privacy.nopeek > 0.0f) down_filters.push_back((nopeek = std::make_unique<NoPeekFilter>(privacy.nopeek)).get());
  if (index == 0 && privacy.dp_clip > 0.0f)
    down_filters.push_back(
        (cut_noise = std::make_unique<CutNoiseFilter>(privacy.dp_clip, privacy.dp_noise, privacy.dp_seed)).get());
  if (index + 1 == n && privacy.grad_clip > 0.0f)
    up_filters.push_back(
        (grad_noise = std::make_unique<GradNoiseFilter>(privacy.grad_clip, privacy.grad_noise, privacy.dp_seed)).get());
  std::unique_ptr<LabelNoiseFilter> label_noise;
  if (index + 1 == n && privacy.label_noise > 0.0f)
    up_filters.push_back((label_noise = std::make_unique<LabelNoiseFilter>(
                              privacy.label_noise, static_cast<int>(graph.output_groups()), privacy.dp_seed))
                             .get());
  peer.set_filters(down_filters, up_filters);
  for (const LinkFilter* f : down_filters) std::fprintf(stderr, "on the link down: %s\n", f->name().c_str());
  for (const LinkFilter* f : up_filters) std::fprintf(stderr, "on the link up: %s\n", f->name().c_str());
  // The loss stage reports the loss; nobody else sees it.
  const bool loss_here_only = privacy.grad_clip > 0.0f || privacy.label_noise > 0.0f;
  StageMetrics counters;
  counters.labels = cat("party=\"", party_name, "\",stage=\"", index, "\"");
  const auto started = Clock::now();
  std::unique_ptr<HttpListener> http;
  const std::string metrics_at = cli.str("metrics-listen", self.metrics_listen);
  if (!metrics_at.empty()) {
    const HostPort hp = CliArgs({{"metrics-listen", metrics_at}}).host_port("metrics-listen", "");
    http = HttpListener::listen(hp.host, hp.port, [&](const std::string& path) -> HttpResponse {
      if (path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
      if (path != "/metrics") return {404, "text/plain; charset=utf-8", "not found: try /metrics or /healthz\n"};
      return {200, "text/plain; version=0.0.4; charset=utf-8",
              counters.text(up.get(), down.get(), std::chrono::duration<double>(Clock::now() - started).count())};
    });
    std::fprintf(stderr, "metrics for Prometheus on http://%s:%d/metrics\n", hp.host.c_str(), http->port());
  }
  counters.averaging = plan.average_every > 0 && index < 2;
  const auto count_step = [&] {
    counters.steps += 1;
    counters.busy_us = static_cast<uint64_t>(stage.busy_s() * 1e6);
    counters.idle_us = static_cast<uint64_t>(peer.idle_s() * 1e6);
    if (counters.averaging && peer.averages() > counters.averages)
      std::fprintf(stderr, "the first stages averaged (average %u, after round %llu)\n", peer.averages(),
                   static_cast<unsigned long long>(peer.averages()) * plan.average_every);
    counters.averages = peer.averages();
    if (shards) {
      std::string text = shards->metrics(counters.labels);
      std::lock_guard<std::mutex> lock(counters.extra_mu);
      counters.extra = std::move(text);
    }
  };
  if (store)
    peer.on_checkpoint([&](uint64_t step) {
      meta.step = step;
      store->save(step, encode_checkpoint(meta, net, optimizer.get()));
      if (shards) shards->save(step);
    });
  // The stage's export, written before Bye goes on down the chain (a later stage: on_end; the
  // first: before finish), so a stage lost after it loses nothing, and one lost before it has
  // the stage before train the last steps again (its Bye does not come back).
  const std::string out = cli.str("export", self.export_file);
  const auto write_export = [&] {
    if (out.empty()) return;
    const auto steps = static_cast<int64_t>(peer.own_steps());
    std::unique_ptr<Network> gathered;  // a split stage's whole weights, from its members' slices
    if (shards) {
      static const std::unique_ptr<Backend> reference = make_backend("reference");
      gathered = std::make_unique<Network>(stage_graphs[index], *reference, seed);
      shards->gather(*gathered);
    }
    std::vector<SafeTensor> tensors = shard_to_torch(graph, gathered ? *gathered : net, steps);
    if (index == 0)
      for (SafeTensor& t : hugging_face_export_extras(graph)) tensors.push_back(std::move(t));
    write_file_atomic(out, write_safetensors(tensors, {{"format", "pt"}, {"tandem_model", spec.name},
                                                       {"tandem_cut", cut}, {"tandem_stage", cat(index)},
                                                       {"tandem_step", cat(steps)},
                                                       {"tandem_layout", "pytorch (OIHW, NCHW flatten order)"}}));
    std::fprintf(stderr, "wrote %s: stage %zu's %zu tensors\n", out.c_str(), index, tensors.size());
  };
  // The end record (checkpoint-dir/stageN.ended: the step, the plan's hash, and once the
  // Bye came back "acknowledged"), after the export: a process started again after it finds
  // out from the stages after whether the run ended there too (StagePeer::set_ended), rather
  // than train again or wait for parties gone.
  const std::string plan_hex = to_hex(plan.run.data(), plan.run.size());
  const std::string end_record = store ? cat(self.checkpoint_dir, "/stage", index, ".ended") : std::string();
  std::optional<uint64_t> end_step;  // this party's end, recorded (in this process or one before)
  bool end_acknowledged = false;
  const auto record_end = [&](bool acknowledged) {
    if (!acknowledged) write_export();
    end_step = peer.next_step();
    end_acknowledged = acknowledged;
    if (!end_record.empty()) {
      const std::string text = cat(*end_step, " ", plan_hex, acknowledged ? " acknowledged" : "", "\n");
      write_file_atomic(end_record, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    }
    // This process too: a link lost while the parties after end, relinked, may find them ended.
    peer.set_ended(*end_step, acknowledged);
  };
  if (index > 0) peer.on_end([&](uint64_t, bool acknowledged) { record_end(acknowledged); });
  peer.on_resume([&] {  // the run goes on: its record goes before the party before hears so
    end_step.reset();
    if (!end_record.empty()) std::filesystem::remove(end_record);
  });
  if (!end_record.empty()) {
    std::ifstream in(end_record);
    uint64_t step = 0;
    std::string hash, word;
    if (in >> step >> hash) {
      if (hash != plan_hex)
        fail("stage", cat(end_record, " records the end of another plan's run: move it away, or start this "
                                      "deployment in an empty checkpoint-dir"));
      end_step = step;
      end_acknowledged = (in >> word) && word == "acknowledged";
      peer.set_ended(step, end_acknowledged);
      std::fprintf(stderr, "this party ended its run at step %llu before this process (%s%s)\n",
                   static_cast<unsigned long long>(step), end_record.c_str(),
                   end_acknowledged ? "" : "; the parties after had not answered it");
    }
  }

  std::ofstream metrics;
  if (cli.has("metrics-json")) {
    metrics.open(cli.str("metrics-json", ""), std::ios::app);
    if (!metrics) fail("cli", cat("cannot write --metrics-json ", cli.str("metrics-json", "")));
  }
  const auto emit = [&](const std::string& json) {
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
    if (metrics) metrics << json << "\n" << std::flush;
  };
  const auto t0 = Clock::now();
  TrainingSets sets;
  std::unique_ptr<StepLabels> step_labels;
  const bool own_data = !self.data.empty() || !self.limit.empty();  // a first party's section names its data
  if (own_data) {
    std::map<std::string, std::string> mine = deployment.run;
    if (!self.data.empty()) mine["data"] = self.data;
    if (!self.limit.empty()) mine["limit"] = self.limit;
    sets = load_training_sets(CliArgs(mine), graph);
  } else if (index == 0 || (index + 1 == n && !plan.labels_travel)) {
    sets = load_training_sets(args, graph);
  }
  if (index == 0 && members > 1 && !own_data) {  // this first party's share of the run's data: every members-th sample
    sets.train = every_nth(sets.train, share, members);
    std::fprintf(stderr, "first party %u of %u: %zu training samples (every %u-th from sample %u)\n", share + 1, members,
                 sets.train.labels.size(), members, share);
  }
  if (index == 0) peer.set_epoch_steps((sets.train.labels.size() + batch - 1) / batch);  // checked against the others'
  if (index + 1 == n && !plan.labels_travel) {
    step_labels = std::make_unique<StepLabels>(graph, sets.train, batch, seed);
    peer.labels_from([&](uint64_t step) { return step_labels->of(step); });
    peer.evaluation_labels_from([&](uint64_t begin, uint32_t count) {
      const std::span<const int32_t> all(sets.test.labels);
      return begin <= all.size() && count <= all.size() - begin ? all.subspan(begin, count) : std::span<const int32_t>();
    });
  }
  const int max_restarts = static_cast<int>(cli.integer("restarts", 10, 0));
  // Releases of the training set's activations under noise, replays after a lost link
  // included: what the accountant counts (a replay is a fresh release of the same samples).
  // With a checkpoint-dir the count is durable (ReleaseLedger): a restarted process goes on.
  std::optional<ReleaseLedger> ledger;
  if (index == 0 && cut_noise && store) {
    // The plan, and a first party's own data: another limit is another sampling rate.
    Sha256 terms;
    terms.update(plan.run.data(), plan.run.size());
    const std::string own = own_data ? cat(" data=", self.data, " limit=", self.limit) : std::string();
    terms.update(own.data(), own.size());
    const std::array<uint8_t, 32> key = own_data ? terms.finish() : plan.run;
    ledger.emplace(self.checkpoint_dir, to_hex(key.data(), key.size()));
    if (ledger->releases() > 0)
      std::fprintf(stderr, "%s: %llu noised releases of the training set before this process\n",
                   ledger->path().c_str(), static_cast<unsigned long long>(ledger->releases()));
  }
  uint64_t releases = ledger ? ledger->releases() : 0;
  int restarts = 0;
  for (;;) {  // a round: the chain linked, from the newest checkpoint all stages have
    try {
      try {
      std::vector<uint64_t> have = store ? store->steps() : std::vector<uint64_t>{};
      if (shards) have = shards->common_steps(have);  // a member started afresh holds none
      uint64_t start = 0;
      try {
        start = peer.connect(have);
      } catch (const LinkUnreachable& e) {  // nobody linked from before, or the party after is gone
        if (!end_step) throw;
        if (!end_acknowledged)  // the parties after may be down before recording theirs
          fail("stage", cat(e.what(), "; this party recorded the run's end at step ", *end_step,
                            ", but the parties after it never answered it: start them again (they train the last "
                            "steps again, or say the run ended)"));
        std::fprintf(stderr, "%s; this party recorded the run's end before, and the parties after it theirs: the run is "
                             "over\n", e.what());
        break;
      }
      if (peer.ended()) {  // every stage from here on ended the run in an earlier process
        if (!end_acknowledged) record_end(true);  // the stages after answered it now
        std::fprintf(stderr, "the run ended at step %llu at this party and every one after it: nothing is left to "
                             "train (to train again, start from an empty checkpoint-dir)\n",
                     static_cast<unsigned long long>(start));
        break;
      }
      const uint64_t own_start = start / taking_turns;  // this party's steps before `start` (a member's: its turns)
      if (ledger && ledger->releases() < own_start) {  // checkpoints older than the ledger: at least their steps
        ledger->at_least(own_start);
        releases = std::max(releases, own_start);
      }
      const CheckpointData state = start == 0 ? decode_checkpoint(initial) : store->load_step(start);
      if (state.meta.model_hash != plan.run || state.meta.step != start || state.meta.role != "stage")
        fail("stage", cat(self.checkpoint_dir, " holds a checkpoint of step ", state.meta.step,
                          " from another plan or party: move it away, or start this deployment in an empty checkpoint-dir"));
      restore_checkpoint(state, net, optimizer.get());
      if (shards) shards->restore(start);
      const std::string before = up ? cat(" from ", up->names()) : "";
      const std::string after = down ? cat(" to '", deployment.parties[party_after].name, "'") : "";
      std::fprintf(stderr, "linked%s%s, starting at step %llu\n", before.c_str(), after.c_str(),
                   static_cast<unsigned long long>(start));
      if (index == 0) {  // the steps' order, batches and learning-rate schedule are the first party's
        EpochBatches batches(graph, sets.train, batch, seed);
        if (batches.samples() == 0) fail("stage", "the training set is empty: check data and limit");
        const auto per_epoch = static_cast<uint64_t>(batches.steps());
        ScheduleOptions lr = args.schedule_options(epochs * batches.steps());
        validate(lr);
        // Epsilon after `steps` releases of the training set's activations (as tandem-edge's):
        // the sampled Gaussian mechanism at rate batch / training samples; -1 without noise.
        const auto epsilon_after = [&](uint64_t steps) {  // steps: releases
          if (!cut_noise) return -1.0;
          if (privacy.dp_noise <= 0.0f) return std::numeric_limits<double>::infinity();  // clipping alone proves nothing
          const double q = std::min(1.0, static_cast<double>(batch) / static_cast<double>(batches.samples()));
          return steps == 0 ? 0.0 : dp_epsilon(q, privacy.dp_noise, steps, privacy.dp_delta).epsilon;
        };
        bool budget_spent = false;
        const int64_t first_epoch = static_cast<int64_t>(own_start / per_epoch) + 1;
        for (int64_t e = 1; e < first_epoch; ++e) batches.shuffle();  // the orders of the epochs done
        for (int64_t epoch = first_epoch; epoch <= epochs; ++epoch) {
          if (privacy.dp_epsilon_budget > 0.0 && epsilon_after(releases + 1) > privacy.dp_epsilon_budget) {
            budget_spent = true;  // spent at the epoch's end: no empty epoch follows
            break;
          }
          batches.shuffle();
          ProgressBar bar(cat("epoch ", epoch, "/", epochs), batches.samples());
          StepStats total;
          const double busy0 = stage.busy_s(), idle0 = peer.idle_s();
          const auto e0 = Clock::now();
          const int64_t skip = epoch == first_epoch ? static_cast<int64_t>(own_start % per_epoch) * batch : 0;
          double dcor_sum = 0;
          uint64_t dcor_samples = 0;
          int64_t trained = 0;  // samples of the steps sent
          for (int64_t begin = skip; begin < batches.samples(); begin += batch) {
            if (privacy.dp_epsilon_budget > 0.0 && epsilon_after(releases + 1) > privacy.dp_epsilon_budget) {
              budget_spent = true;
              break;
            }
            const int32_t* labels = nullptr;
            const std::vector<Tensor> x = batches.rows(begin, labels);
            const auto count = static_cast<uint32_t>(x[0].shape()[0]);
            // A member's own count sets its schedule and checkpoints: at its k-th turn every
            // member asks for the same (the round's), whichever global step it leads.
            const uint64_t own = peer.own_steps();
            const bool checkpoint = checkpoint_every > 0 && (own + 1) % static_cast<uint64_t>(checkpoint_every) == 0;
            const StepHeader header{peer.next_step(), count, std::min(microbatches, count),
                                    lr_factor(lr, static_cast<int64_t>(own)), checkpoint};
            ++releases;  // counted before it leaves: a step lost half-way released its activations too
            if (ledger) ledger->count_one();
            const StepStats st = peer.train_step(header, x, labels);
            count_step();
            if (nopeek) {  // weighted by samples, as the edge's
              dcor_sum += nopeek->dcor() * static_cast<double>(st.samples);
              dcor_samples += st.samples;
            }
            total.loss_sum += st.loss_sum;
            total.correct += st.correct;
            total.samples += st.samples;
            trained += count;  // under the async schedule a step's loss comes a step later
            bar.update(trained, loss_here_only || total.samples == 0
                                    ? std::string()
                                    : cat("loss ", fixed(total.loss_sum / static_cast<double>(total.samples), 4)));
          }
          {  // the asynchronous schedule's step in flight: an epoch's steps are all in at its end
            const StepStats st = peer.drain();
            total.loss_sum += st.loss_sum;
            total.correct += st.correct;
            total.samples += st.samples;
          }
          // The first parties end on one average of their first stages (the last rounds since
          // the last average), evaluated as such.
          if (plan.average_every > 0 && (epoch == epochs || budget_spent) && peer.average())
            std::fprintf(stderr, "the first stages averaged at the run's end (average %u)\n", peer.averages());
          const double seconds = std::chrono::duration<double>(Clock::now() - e0).count();
          const auto samples = static_cast<double>(std::max<uint64_t>(total.samples, 1));
          bar.finish(loss_here_only ? "the loss is the loss stage's" : cat("loss ", fixed(total.loss_sum / samples, 4)),
                     budget_spent ? skip + static_cast<int64_t>(total.samples) : -1);
          // The test set, in order, through every stage in evaluation mode.
          const StepStats test = evaluate_in_batches(
              graph, sets.test, batch, seed, [&](std::span<const Tensor> rows, const int32_t* labels, int64_t begin) {
                return peer.evaluate(rows, labels, static_cast<uint64_t>(begin));
              });
          const auto test_samples = static_cast<double>(std::max<uint64_t>(test.samples, 1));
          const double epsilon = epsilon_after(releases);
          emit(cat("{\"epoch\":", epoch, ",\"samples\":", total.samples, ",\"seconds\":", fixed(seconds, 3),
                   ",\"samples_per_s\":", fixed(static_cast<double>(total.samples) / seconds, 1),
                   loss_here_only ? ",\"train_loss\":null,\"train_accuracy\":null"
                                  : cat(",\"train_loss\":", fixed(total.loss_sum / samples, 5), ",\"train_accuracy\":",
                                        fixed(static_cast<double>(total.correct) / samples, 5)),
                   test.samples == 0 ? std::string()
                   : loss_here_only  ? std::string(",\"test_loss\":null,\"test_accuracy\":null")
                                     : cat(",\"test_loss\":", fixed(test.loss_sum / test_samples, 5),
                                           ",\"test_accuracy\":", fixed(static_cast<double>(test.correct) / test_samples, 5)),
                   epsilon < 0 ? "" : std::isinf(epsilon) ? ",\"dp_epsilon\":null" : cat(",\"dp_epsilon\":", fixed(epsilon, 4)),
                   dcor_samples > 0 ? cat(",\"dcor\":", fixed(dcor_sum / static_cast<double>(dcor_samples), 5)) : "",
                   ",\"stage_busy_s\":", fixed(stage.busy_s() - busy0, 3), ",\"stage_idle_s\":",
                   fixed(peer.idle_s() - idle0, 3), ",\"restarts\":", restarts, "}"));
          if (budget_spent) break;
        }
        if (budget_spent)
          std::fprintf(stderr, "stopped before step %llu: it would pass the privacy budget (epsilon %g at delta %g)\n",
                       static_cast<unsigned long long>(peer.next_step()), privacy.dp_epsilon_budget, privacy.dp_delta);
        // The run's last average, when the epochs above did not take it (a restart from the
        // last checkpoint, or a budget spent before an epoch).
        if (plan.average_every > 0 && peer.average())
          std::fprintf(stderr, "the first stages averaged at the run's end (average %u)\n", peer.averages());
        record_end(false);
        peer.finish(budget_spent ? "the first party's privacy budget is spent" : "the first party's epochs are done");
        record_end(true);
      } else {
        // The loss stage that alone sees the loss (labels and loss at the first party) reports
        // each epoch's, as the first party would.
        const int64_t per_epoch =
            (static_cast<int64_t>(sets.train.labels.size()) + static_cast<int64_t>(batch) - 1) / static_cast<int64_t>(batch);
        // After a restart a line covers the steps since (its samples say how many), as the
        // first party's does: a replayed step is not counted twice.
        StepStats st, total, test;
        int64_t test_epoch = 0;
        const auto epoch_line = [&](StepStats& t, int64_t per) {
          const auto samples = static_cast<double>(std::max<uint64_t>(t.samples, 1));
          emit(cat("{\"epoch\":", (static_cast<int64_t>(peer.next_step()) + per - 1) / per, ",\"party\":\"",
                   party_name, "\",\"samples\":", t.samples, ",\"train_loss\":", fixed(t.loss_sum / samples, 5),
                   ",\"train_accuracy\":", fixed(static_cast<double>(t.correct) / samples, 5), "}"));
          t = StepStats{};
        };
        const auto test_line = [&] {  // an evaluation pass is over
          const auto samples = static_cast<double>(std::max<uint64_t>(test.samples, 1));
          emit(cat("{\"epoch\":", test_epoch, ",\"party\":\"", party_name, "\",\"test_samples\":", test.samples, ",\"test_loss\":", fixed(test.loss_sum / samples, 5),
                   ",\"test_accuracy\":", fixed(static_cast<double>(test.correct) / samples, 5), "}"));
          test = StepStats{};
        };
        const bool reports = loss_here_only && index + 1 == n;
        while (peer.follow_step(st)) {
          if (reports && !peer.evaluated() && test.samples > 0) test_line();
          if (peer.evaluated()) {
            if (!reports) continue;
            test_epoch = (static_cast<int64_t>(peer.next_step()) + per_epoch - 1) / per_epoch;
            test.loss_sum += st.loss_sum;
            test.correct += st.correct;
            test.samples += st.samples;
            continue;
          }
          count_step();
          if (!reports) continue;
          total.loss_sum += st.loss_sum;
          total.correct += st.correct;
          total.samples += st.samples;
          if (static_cast<int64_t>(peer.next_step()) % per_epoch == 0) epoch_line(total, per_epoch);
        }
        if (reports && total.samples > 0) epoch_line(total, per_epoch);  // the run ended within an epoch
        if (reports && test.samples > 0) test_line();
      }
      } catch (const LinkLost&) {
        throw;
      } catch (const GroupLost&) {
        throw;
      } catch (const std::exception& e) {  // the run ends here: the neighbours are told why, and tell theirs
        const std::string why = cat(party_name, ": ", e.what());
        if (up) up->end(why);
        if (down) down->end(why);
        if (shards) try {
            shards->end(true);
          } catch (const GroupLost&) {  // a member gone too: it finds out by itself
          }
        throw;
      }
      break;
    } catch (const Error& e) {
      // A lost link, or a lost layer shard (GroupLost): every party goes back to its newest
      // checkpoint; the neighbours are told, and tell theirs.
      const bool group_lost = dynamic_cast<const GroupLost*>(&e) != nullptr;
      if (!group_lost && dynamic_cast<const LinkLost*>(&e) == nullptr) throw;
      const uint64_t at = peer.next_step();
      bool members_lost = group_lost;
      bool reset = false;
      if (!members_lost) try {
          peer.reset();  // told to the members, if any
          reset = true;
        } catch (const GroupLost&) {
          members_lost = true;
        }
      if (members_lost) stage.set_mirror(nullptr);  // the members reset when their group is lost
      if (!reset) peer.reset();
      const std::string why = cat(party_name, group_lost ? " lost a layer shard at step " : " lost a link at step ", at, ": ", e.what());
      if (up) up->restart(why);
      if (down) down->restart(why);
      counters.restarts += 1;
      if (++restarts > max_restarts) {
        if (shards && !members_lost) try {
            shards->end(true);  // the members stop too, rather than wait for this party again
          } catch (const GroupLost&) {
          }
        fail("stage", cat(e.what(), " (", max_restarts, " restarts in this run; --restarts N allows more)"));
      }
      if (members_lost) {  // the members again first: the neighbours wait for this party to link
        std::fprintf(stderr, "%s: waiting up to %d s for the layer shards to meet again\n", e.what(), wait_s);
        shards->reform();
        stage.set_mirror(shards->mirror());
      }
      if (dynamic_cast<const LinkBusy*>(&e) != nullptr) {  // a cloud at its bound: after a while, as an edge does
        const double wait = busy_backoff_s(restarts);
        std::fprintf(stderr, "%s: linking again in %.1f s (restart %d of at most %d)\n", e.what(), wait, restarts,
                     max_restarts);
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      } else {
        std::fprintf(stderr, "%s: linking again (restart %d of at most %d)\n", e.what(), restarts, max_restarts);
      }
      if (!store)
        std::fprintf(stderr, "this party keeps no checkpoints (no checkpoint-dir): every stage starts again from step 0\n");
    }
  }
  const int64_t steps = static_cast<int64_t>(peer.own_steps());
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const uint64_t sent = (up ? up->sent.load() : 0) + (down ? down->sent.load() : 0);
  const uint64_t received = (up ? up->received.load() : 0) + (down ? down->received.load() : 0);
  emit(cat("{\"party\":\"", party_name, "\",\"stage\":", index, ",\"steps\":", steps, ",\"restarts\":", restarts,
           plan.average_every > 0 && index < 2 ? cat(",\"averages\":", peer.averages()) : std::string(),
           ",\"sent_bytes\":", sent, ",\"received_bytes\":", received,
           ",\"busy_s\":",
           fixed(stage.busy_s(), 3), ",\"idle_s\":", fixed(peer.idle_s(), 3), ",\"wall_s\":", fixed(wall, 3),
           ",\"idle_share\":", fixed(wall > 0 ? 1.0 - stage.busy_s() / wall : 0.0, 4), "}"));
  if (egress) std::fprintf(stderr, "egress log %s: last hash %s\n", egress->path().c_str(), egress->finish("completed").c_str());
  if (shards) shards->end(false);
  return 0;
}

// --all: every party of the file as a child process here (`tandem stage --party NAME`), each
// one's output in LOGDIR/NAME.log; the first that fails stops the others.
int run_all(const CliArgs& cli) {
  const std::string file = cli.required("deployment");
  const Deployment deployment = read_deployment(file);
  const std::string logs = cli.str("log-dir", ".");
  std::filesystem::create_directories(logs);
  std::vector<std::string> passed;  // the options each child gets as they were given
  for (const char* name : {"wait-s", "silence-s", "restarts"})
    if (cli.has(name)) passed.insert(passed.end(), {cat("--", name), cli.str(name, "")});
  std::map<pid_t, std::string> running;
  // Every party, the last first (it listens soonest), and each member of a party's layer
  // shards beside it ("NAME.shardR").
  std::vector<std::pair<std::string, int>> processes;
  for (std::size_t i = deployment.parties.size(); i-- > 0;)
    for (int r = deployment.parties[i].layer_shards - 1; r >= 0; --r) processes.emplace_back(deployment.parties[i].name, r);
  for (const auto& [party, shard] : processes) {
    const std::string name = shard == 0 ? party : cat(party, ".shard", shard);
    const std::string log = cat(logs, "/", name, ".log");
    std::vector<std::string> argv{"/proc/self/exe", "stage", "--deployment", file, "--party", party};
    if (shard > 0) argv.insert(argv.end(), {"--shard", cat(shard)});
    argv.insert(argv.end(), passed.begin(), passed.end());
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (const auto& [other, _] : running) ::kill(other, SIGTERM);
      for (const auto& [other, _] : running) ::waitpid(other, nullptr, 0);
      fail("stage", cat("cannot start party ", name, ": ", why));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher gone, its parties go too
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) _exit(127);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      _exit(127);
    }
    running[pid] = name;
    std::fprintf(stderr, "started party %s (pid %d), its output in %s\n", name.c_str(), static_cast<int>(pid), log.c_str());
  }
  std::string failed;
  while (!running.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    const std::string name = it->second;
    running.erase(it);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::fprintf(stderr, "party %s %s\n", name.c_str(),
                 ok ? "finished" : WIFEXITED(status) ? cat("exited with ", WEXITSTATUS(status)).c_str()
                                                     : cat("was killed by signal ", WTERMSIG(status)).c_str());
    if (!ok && failed.empty()) {
      failed = name;
      for (const auto& [other, _] : running) ::kill(other, SIGTERM);  // the rest cannot finish without it
    }
  }
  if (!failed.empty()) fail("stage", cat("party ", failed, " failed: see ", logs, "/", failed, ".log"));
  const std::size_t members = processes.size() - deployment.parties.size();
  std::printf("all %zu parties finished%s\n", deployment.parties.size(),
              members ? cat(" (and ", members, " layer-shard members)").c_str() : "");
  return 0;
}

int stage_command(const CliArgs& cli) {
  if (cli.has("all")) {
    if (cli.has("party")) fail("cli", "--all starts every party: give it without --party");
    return run_all(cli);
  }
  if (cli.has("shard")) return run_layer_shard_member(cli);
  return run_party(cli);
}

}  // namespace

void declare_stage(Command& command) {
  command.option("deployment", "FILE", "the pipeline: the run's options and a [NAME] section a party (required)")
      .option("party", "NAME", "which party of FILE this is (required, unless --all)")
      .flag("all", "start every party of FILE here, each as its own process (a whole pipeline on one machine, to try it)")
      .option("shard", "R", "run member R (1 or more) of the party's layer shards (its section's layer-shards = S), not the party itself")
      .option("log-dir", "DIR", "with --all: each party's output goes to DIR/NAME.log (default .)")
      .option("export", "FILE", "at the end, this stage's weights with PyTorch's names (default: the party's export)")
      .option("metrics-json", "FILE", "append the metrics (the first party's epochs; every party's summary) to FILE")
      .option("wait-s", "S", "how long to keep trying to reach the party after (default 120)")
      .option("metrics-listen", "HOST:PORT", "serve this party's metrics for Prometheus at /metrics (default: the party's metrics-listen)")
      .option("restarts", "N", "how many times a lost link may start the pipeline again from its newest checkpoint (default 10)")
      .option("silence-s", "S", "how long a neighbour may stay silent before the run ends (default 300)")
      .details(kStageDetails)
      .run(stage_command);
}

}  // namespace tandem
