#include "cloud/service/cloud_service.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "backends/registry.h"
#include "cloud/federation/round_checkpoints.h"
#include "cloud/pki/pki.h"
#include "cloud/pki/token.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/planner.h"
#include "core/interop/torch_layout.h"
#include "ports/files/checkpoint_store.h"
#include "ports/files/safetensors_file.h"
#include "ports/lws/lws_endpoint.h"

namespace tandem {
namespace {

std::atomic<bool> g_stop{false};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
extern "C" void on_signal(int) { g_stop = true; }

// What a session starts from: a cut's back shard, its initial weights and the model hash an
// edge training with that cut sends.
struct BackShard {
  std::string cut;
  std::array<uint8_t, 32> hash{};
  Graph graph;
  std::vector<Tensor> initial;  // in the order of Network::params()
  std::vector<Tensor> initial_buffers;  // in the order of Network::buffers(); empty: fresh
};

// Back-shard checkpoints in STATE_DIR/checkpoints/CLIENT_ID/ (the session has checked the
// id's characters), the newest three kept. One lock: sessions of one client may overlap
// while a dropped connection is noticed.
class FolderCheckpoints final : public SessionCheckpoints {
 public:
  explicit FolderCheckpoints(std::string root) : root_(std::move(root)) {}
  void save(const std::string& client_id, uint64_t step, std::span<const uint8_t> checkpoint) override {
    std::lock_guard<std::mutex> lock(mutex_);
    CheckpointStore(cat(root_, "/", client_id), "cloud").save(step, checkpoint);
  }
  CheckpointData load(const std::string& client_id, uint64_t step) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return CheckpointStore(cat(root_, "/", client_id), "cloud").load_step(step);
  }

 private:
  std::string root_;
  std::mutex mutex_;
};

// Split-federated: the one back shard every session trains, in turns, and the rounds.
struct SharedBack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Network> net;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<BackShardTrainer> trainer;  // net and optimizer, in turns
  std::unique_ptr<Federation> federation;
  std::unique_ptr<Backend> front_backend;
  std::unique_ptr<Network> front;  // encodes the rounds' averages
  std::unique_ptr<FolderRoundCheckpoints> rounds;
};

// One edge's session on its own thread, fed frames by the service loop.
class Worker {
 public:
  // The session is made on the first message, for the shard whose cut the Hello names (one
  // shard, or every legal cut's with --cut any).
  // `peer`: the client certificate's CN; empty: none, and `tokens` checks the Hello's token.
  Worker(uint64_t id, std::string peer, const std::vector<BackShard>& shards, const ServeOptions& o,
         LwsEndpoint& endpoint, SessionCheckpoints& checkpoints, SharedBack* shared, pki::TokenVerifier* tokens)
      : id_(id), peer_(std::move(peer)), endpoint_(endpoint), shards_(shards), options_(o), checkpoints_(checkpoints),
        shared_(shared), tokens_(tokens),
        backend_(make_backend(o.backend, BackendOptions{o.threads})) {
    thread_ = std::thread([this] { run(); });
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      if (session_) session_->cancel();  // it may be waiting for its turn on a shared back shard
    }
    wake_.notify_one();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void push(Frame frame) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inbox_.push_back(std::move(frame));
    }
    wake_.notify_one();
  }
  std::string summary() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!session_) return cat("session ", id_, " (", peer_, "): no Hello");
    std::string rounds;
    if (shared_)
      if (const auto e = shared_->federation->edge(id_)) rounds = cat(", ", e->rounds_joined, " rounds joined");
    return cat("session ", id_, " (", peer_, "), cut '", cut_, "': ", session_->step(), " steps, ",
               session_->trained_samples(), " samples, ", bytes_in_, " bytes in, ", bytes_out_, " bytes out, busy ",
               session_->busy_seconds(), " s", rounds);
  }
  // The session's figures as one JSON line, for the metrics file.
  std::string metrics_line() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!session_) return {};
    uint32_t rounds = 0;
    if (shared_)
      if (const auto e = shared_->federation->edge(id_)) rounds = e->rounds_joined;
    const double samples = static_cast<double>(session_->trained_samples());
    return cat("{\"session\":", id_, ",\"client\":\"", session_->client_id(), "\",\"steps\":", session_->step(),
               ",\"samples\":", session_->trained_samples(), ",\"train_loss\":",
               fixed(samples > 0 ? session_->train_loss_sum() / samples : 0.0, 5), ",\"rounds_joined\":", rounds,
               ",\"bytes_in\":", bytes_in_.load(), ",\"bytes_out\":", bytes_out_.load(),
               ",\"busy_s\":", fixed(session_->busy_seconds(), 3), "}");
  }

 private:
  // The shard whose model hash a Hello carries; otherwise the first, whose session then
  // refuses the message with the exact reason.
  const BackShard& shard_for(const Frame& frame) const {
    WireError err;
    const wire::Message* m = verify_frame(frame, options_.max_message_bytes, err);
    const auto* hello = m ? m->payload_as_Hello() : nullptr;
    if (hello && hello->model_hash() && hello->model_hash()->size() == 32)
      for (const BackShard& s : shards_)
        if (std::equal(s.hash.begin(), s.hash.end(), hello->model_hash()->begin())) return s;
    return shards_.front();
  }

  void start_session(const BackShard& shard) {
    const ServeOptions& o = options_;
    // Labels range over the model's classes (its output's size per head).
    const auto classes = static_cast<int32_t>(shard.graph.classes());
    CloudSessionConfig config{shard.hash,          o.batch_size,  o.microbatches, classes, id_,
                              o.max_message_bytes, o.wire_dtypes, shard.cut,      &checkpoints_};
    config.peer_identity = peer_;
    if (peer_.empty()) {  // no client certificate: the Hello's enrolment token must vouch for the edge
      pki::TokenVerifier* tokens = tokens_;
      config.authorize = [tokens](const std::string& token, const std::string& client) {
        return tokens ? tokens->accept(token, client) : std::string("this cloud takes only client certificates");
      };
    }
    std::unique_ptr<Network> back;
    std::unique_ptr<Optimizer> optimizer;
    std::unique_ptr<BackShardTrainer> trainer;
    std::unique_ptr<CloudSession> session;
    if (shared_) {  // one back shard for every edge, in turns
      config.federation = shared_->federation.get();
      config.rounds = shared_->rounds.get();
      session = std::make_unique<CloudSession>(*shared_->trainer, config);
    } else {
      back = std::make_unique<Network>(shard.graph, *backend_, o.seed);
      for (std::size_t i = 0; i < shard.initial.size(); ++i) {
        back->params()[i]->value().copy_from(shard.initial[i]);
        back->params()[i]->bump_version();
      }
      for (std::size_t i = 0; i < shard.initial_buffers.size(); ++i)
        back->buffers()[i].second->copy_from(shard.initial_buffers[i]);
      optimizer = make_optimizer(back->params(), o.optimizer);
      trainer = std::make_unique<BackShardTrainer>(*back, *optimizer);
      session = std::make_unique<CloudSession>(*trainer, config);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    back_ = std::move(back);
    optimizer_ = std::move(optimizer);
    trainer_ = std::move(trainer);
    session_ = std::move(session);
    cut_ = shard.cut;
  }

  void run() {
    for (;;) {
      Frame frame;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !inbox_.empty(); });
        if (stop_) return;
        frame = std::move(inbox_.front());
        inbox_.pop_front();
      }
      if (!session_) start_session(shard_for(frame));
      CloudSession& session = *session_;
      if (session.closed()) continue;  // the connection is closing: drop the rest
      bytes_in_ += frame.size();
      CloudReply reply = session.handle(frame);
      bytes_out_ += reply.bytes.size();
      if (reply.close && !session.closed()) continue;
      if (reply.close) {
        // Log refusals: the operator sees why an edge was turned away.
        WireError err;
        Frame f = Frame::copy_of(reply.bytes.data(), reply.bytes.size());
        const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
        if (m && m->payload_type() == wire::Payload::Error)
          std::fprintf(stderr, "session %llu (%s): refused: %s\n", static_cast<unsigned long long>(id_), peer_.c_str(),
                       m->payload_as_Error()->text()->c_str());
      }
      if (!reply.bytes.empty()) endpoint_.send(id_, reply.bytes, reply.close);
      if (!reply.then.empty()) endpoint_.send(id_, reply.then);
      session.finish_step();
    }
  }

  uint64_t id_;
  std::string peer_;
  LwsEndpoint& endpoint_;
  const std::vector<BackShard>& shards_;
  const ServeOptions& options_;
  SessionCheckpoints& checkpoints_;
  SharedBack* shared_;
  pki::TokenVerifier* tokens_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Network> back_;  // these four: made on the first message (start_session)
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<BackShardTrainer> trainer_;
  std::unique_ptr<CloudSession> session_;
  std::string cut_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Frame> inbox_;
  bool stop_ = false;
  std::atomic<uint64_t> bytes_in_{0}, bytes_out_{0};
  std::thread thread_;
};

}  // namespace

int serve(const ServeOptions& o) {
  const auto ids = pki::init(o.state_dir);
  const ModelSpec spec = load_model_spec(o.model_path);
  const Graph graph = Graph::build(spec);
  const std::string cut = o.cut.empty() ? graph.default_cut() : o.cut;
  if (cut.empty()) fail("serve", "the spec names no default cut; pass --cut NODE (or --cut any)");
  // --cut any: every legal cut, the spec's default (if any) first; an edge picks with its Hello.
  std::vector<std::string> cuts = {cut};
  if (cut == "any") {
    cuts = legal_cuts(graph);
    const auto d = std::find(cuts.begin(), cuts.end(), graph.default_cut());
    if (d != cuts.end()) std::rotate(cuts.begin(), d, d + 1);
  }

  // Back shards start from the same weights the whole model would (one seeded draw in graph
  // order), so a run does not depend on where the cut is.
  std::vector<BackShard> shards;
  {
    auto reference = make_backend("reference");
    Network whole(graph, *reference, o.seed);
    std::vector<SafeTensor> init;
    if (!o.init_from.empty()) init = read_safetensors_file(o.init_from, {});
    for (const std::string& c : cuts) {
      BackShard s{c, model_hash(spec, c), graph.split(c).second, {}, {}};
      Network back(s.graph, *reference, o.seed);
      if (!o.init_from.empty()) {
        shard_from_torch(graph, init, back);
        for (Param* p : back.params()) s.initial.push_back(p->value().clone());
        for (auto& [name, t] : back.buffers()) s.initial_buffers.push_back(t->clone());
      } else {
        for (Param* p : back.params()) s.initial.push_back(whole.param(p->name()).value().clone());
      }
      shards.push_back(std::move(s));
    }
    if (!o.init_from.empty()) std::printf("back shards initialised from %s\n", o.init_from.c_str());
  }

  EndpointOptions eo;
  eo.max_message_bytes = o.max_message_bytes;
  eo.client_certificate_optional = o.accept_tokens;
  eo.web_root = o.web_root;
  if (!o.web_root.empty() && !std::filesystem::is_regular_file(o.web_root + "/index.html"))
    fail("serve", cat("--web ", o.web_root, " has no index.html (build the browser edge: wasm/README.md)"));
  std::unique_ptr<pki::TokenVerifier> tokens;
  if (o.accept_tokens) tokens = std::make_unique<pki::TokenVerifier>(o.state_dir);
  auto endpoint = LwsEndpoint::listen(o.host, o.port, {ids.server_cert, ids.server_key, ids.ca_cert}, eo);

  std::ofstream metrics;
  if (!o.metrics_json.empty()) {
    metrics.open(o.metrics_json, std::ios::app);
    if (!metrics) fail("serve", cat("cannot write --metrics-json ", o.metrics_json));
  }
  std::mutex metrics_mutex;
  auto write_metrics = [&](const std::string& line) {
    if (line.empty() || !metrics) return;
    std::lock_guard<std::mutex> lock(metrics_mutex);
    metrics << line << "\n" << std::flush;
  };
  std::unique_ptr<SharedBack> shared;
  if (o.federation.aggregate_every > 0) {
    if (shards.size() != 1) fail("serve", "a federation trains one cut: give --cut NODE (not any)");
    shared = std::make_unique<SharedBack>();
    shared->backend = make_backend(o.backend, BackendOptions{o.threads});
    const BackShard& s = shards.front();
    shared->net = std::make_unique<Network>(s.graph, *shared->backend, o.seed);
    for (std::size_t i = 0; i < s.initial.size(); ++i) {
      shared->net->params()[i]->value().copy_from(s.initial[i]);
      shared->net->params()[i]->bump_version();
    }
    for (std::size_t i = 0; i < s.initial_buffers.size(); ++i)
      shared->net->buffers()[i].second->copy_from(s.initial_buffers[i]);
    shared->optimizer = make_optimizer(shared->net->params(), o.optimizer);
    // Steps whose gradients the shared shard sums before one update (the edges' steps
    // interleave, so with N edges an update sees every edge's data, as IID training would).
    shared->trainer = std::make_unique<BackShardTrainer>(*shared->net, *shared->optimizer, o.federation.deadline_s,
                                                         o.federation.back_accumulate);
    // The front every edge starts from: the whole model's initial weights (or --init-from's).
    shared->front_backend = make_backend("reference");
    shared->front = std::make_unique<Network>(graph.split(s.cut).first, *shared->front_backend, o.seed);
    Network& front = *shared->front;
    if (!o.init_from.empty()) {
      shard_from_torch(graph, read_safetensors_file(o.init_from, tensor_names(front)), front);
    } else {
      init_from_whole_model(graph, o.seed, front, *shared->front_backend);
    }
    NamedTensors initial;
    for (Param* p : front.params()) initial.emplace_back(p->name(), p->value().clone());
    LwsEndpoint* ep = endpoint.get();
    shared->federation = std::make_unique<Federation>(
        std::move(initial), o.federation, [ep](uint64_t c, std::span<const uint8_t> b) { ep->send(c, b); });
    shared->federation->set_metrics_sink(write_metrics);
    // Each round's back shard and average are kept; a restarted cloud goes on from the last.
    shared->rounds = std::make_unique<FolderRoundCheckpoints>(cat(o.state_dir, "/federation"), front, s.hash, s.cut);
    if (auto last = shared->rounds->load_latest(*shared->net, *shared->optimizer)) {
      shared->federation->restore(last->first, std::move(last->second));
      std::printf("tandem-cloud: continuing the federation from round %u (%s)\n", last->first,
                  shared->rounds->dir().c_str());
    }
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::printf("tandem-cloud: listening on wss://%s:%d (model %s, cut '%s', back shard on %s, %d kernel thread%s a "
              "session, CA %s)\n",
              o.host.c_str(), endpoint->port(), spec.name.c_str(),
              cut == "any" ? cat("any of ", cuts.size()).c_str() : cut.c_str(), o.backend.c_str(), o.threads,
              o.threads == 1 ? "" : "s", ids.ca_cert.c_str());
  if (shared)
    std::printf("split-federated: one back shard for every edge, front shards averaged every %u steps (a round "
                "waits at most %.1f s once one edge has sent, for at least %u edges)\n",
                o.federation.aggregate_every, o.federation.deadline_s, o.federation.min_edges);
  if (tokens)
    std::printf("edges without a client certificate are taken with an enrolment token (tandem-cloud pki token)%s\n",
                o.web_root.empty() ? "" : cat("; web page: https://", o.host, ":", endpoint->port(), "/").c_str());
  std::fflush(stdout);

  FolderCheckpoints checkpoints(o.state_dir + "/checkpoints");
  std::map<uint64_t, std::unique_ptr<Worker>> workers;
  while (!g_stop) {
    EndpointEvent ev;
    if (shared) shared->federation->tick();
    if (!endpoint->next(ev, std::chrono::milliseconds(100))) continue;
    switch (ev.kind) {
      case EndpointEvent::Kind::Connected:
        std::printf("session %llu: edge '%s' connected\n", static_cast<unsigned long long>(ev.connection),
                    ev.text.c_str());
        workers[ev.connection] = std::make_unique<Worker>(ev.connection, ev.text, shards, o, *endpoint, checkpoints,
                                                           shared.get(), tokens.get());
        break;
      case EndpointEvent::Kind::Message:
        if (auto it = workers.find(ev.connection); it != workers.end()) it->second->push(std::move(ev.frame));
        break;
      case EndpointEvent::Kind::Closed:
        if (auto it = workers.find(ev.connection); it != workers.end()) {
          const std::string summary = it->second->summary();
          write_metrics(it->second->metrics_line());
          workers.erase(it);
          std::printf("%s; closed\n", summary.c_str());
        }
        break;
    }
    std::fflush(stdout);
  }
  workers.clear();
  std::printf("tandem-cloud: stopped\n");
  return 0;
}

}  // namespace tandem
