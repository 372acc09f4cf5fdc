#include "cloud/service/cloud_service.h"

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "cloud/pki/pki.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "ports/lws/lws_endpoint.h"

namespace tandem {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }

// What every session starts from: the back shard's graph and initial weights.
struct BackShard {
  Graph graph;
  std::vector<Tensor> initial;  // in the order of Network::params()
};

// One edge's session on its own thread, fed frames by the service loop.
class Worker {
 public:
  Worker(uint64_t id, std::string peer, const BackShard& shard, const ServeOptions& o,
         const std::array<uint8_t, 32>& hash, LwsEndpoint& endpoint)
      : id_(id), peer_(std::move(peer)), endpoint_(endpoint), backend_(make_backend(o.backend, BackendOptions{1})),
        back_(shard.graph, *backend_, o.seed), optimizer_(make_optimizer(back_.params(), o.optimizer)),
        session_(back_, *optimizer_,
                 {hash, o.batch_size, o.microbatches, 10, id, o.max_message_bytes, o.wire_dtypes}) {
    for (std::size_t i = 0; i < shard.initial.size(); ++i) {
      back_.params()[i]->value().copy_from(shard.initial[i]);
      back_.params()[i]->bump_version();
    }
    thread_ = std::thread([this] { run(); });
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
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
  std::string summary() const {
    return cat("session ", id_, " (", peer_, "): ", session_.step(), " steps, ", bytes_in_, " bytes in, ", bytes_out_,
               " bytes out, busy ", session_.busy_seconds(), " s");
  }

 private:
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
      if (session_.closed()) continue;  // the connection is closing: drop the rest
      bytes_in_ += frame.size();
      CloudReply reply = session_.handle(frame);
      bytes_out_ += reply.bytes.size();
      if (reply.close && !session_.closed()) continue;
      if (reply.close) {
        // Log refusals: the operator sees why an edge was turned away.
        WireError err;
        Frame f = Frame::copy_of(reply.bytes.data(), reply.bytes.size());
        const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
        if (m && m->payload_type() == wire::Payload::Error)
          std::fprintf(stderr, "session %llu (%s): refused: %s\n", static_cast<unsigned long long>(id_), peer_.c_str(),
                       m->payload_as_Error()->text()->c_str());
      }
      endpoint_.send(id_, reply.bytes, reply.close);
      session_.finish_step();
    }
  }

  uint64_t id_;
  std::string peer_;
  LwsEndpoint& endpoint_;
  std::unique_ptr<Backend> backend_;
  Network back_;
  std::unique_ptr<Optimizer> optimizer_;
  CloudSession session_;
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
  if (cut.empty()) fail("serve", "the spec names no default cut; pass --cut NODE");
  auto [front_graph, back_graph] = graph.split(cut);
  const auto hash = model_hash(spec, cut);

  // The back shard starts from the same weights the whole model would (one seeded draw in
  // graph order), so a run does not depend on where the cut is.
  BackShard shard{back_graph, {}};
  {
    auto reference = make_backend("reference");
    Network whole(graph, *reference, o.seed);
    Network back(back_graph, *reference, o.seed);
    for (Param* p : back.params()) shard.initial.push_back(whole.param(p->name()).value().clone());
  }

  EndpointOptions eo;
  eo.max_message_bytes = o.max_message_bytes;
  auto endpoint = LwsEndpoint::listen(o.host, o.port, {ids.server_cert, ids.server_key, ids.ca_cert}, eo);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::printf("tandem-cloud: listening on wss://%s:%d (model %s, cut '%s', back shard on %s, CA %s)\n",
              o.host.c_str(), endpoint->port(), spec.name.c_str(), cut.c_str(), o.backend.c_str(), ids.ca_cert.c_str());
  std::fflush(stdout);

  std::map<uint64_t, std::unique_ptr<Worker>> workers;
  while (!g_stop) {
    EndpointEvent ev;
    if (!endpoint->next(ev, std::chrono::milliseconds(200))) continue;
    switch (ev.kind) {
      case EndpointEvent::Kind::Connected:
        std::printf("session %llu: edge '%s' connected\n", static_cast<unsigned long long>(ev.connection),
                    ev.text.c_str());
        workers[ev.connection] = std::make_unique<Worker>(ev.connection, ev.text, shard, o, hash, *endpoint);
        break;
      case EndpointEvent::Kind::Message:
        if (auto it = workers.find(ev.connection); it != workers.end()) it->second->push(std::move(ev.frame));
        break;
      case EndpointEvent::Kind::Closed:
        if (auto it = workers.find(ev.connection); it != workers.end()) {
          const std::string summary = it->second->summary();
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
