#include "cloud/service/cloud_service.h"

#include <sched.h>

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
#include <set>
#include <optional>
#include <thread>
#include <ctime>
#include <chrono>

#include "backends/registry.h"
#include "cloud/federation/round_checkpoints.h"
#include "cloud/pki/identities.h"
#include "cloud/pki/pki.h"
#include "cloud/pki/token.h"
#include "cloud/service/service_metrics.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/planner.h"
#include "core/interop/torch_layout.h"
#include "pipeline/replicas.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"
#include "pipeline/stage_peer.h"
#include "core/sha256.h"
#include "ports/files/atomic_file.h"
#include "ports/files/checkpoint_store.h"
#include "ports/files/safetensors_file.h"
#include "ports/lws/http_listener.h"
#include "ports/lws/lws_endpoint.h"

namespace tandem {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) { g_stop = true; }

// What a session starts from: a cut's back shard, its initial weights and the model hash an
// edge training with that cut sends.
struct BackShard {
  std::string cut;
  std::array<uint8_t, 32> hash{};
  Graph graph;
  std::vector<Tensor> initial;  // in the order of Network::params()
  std::vector<Tensor> initial_buffers;  // in the order of Network::buffers(); empty: fresh
  std::size_t session_bytes = 0;  // a session's estimate (training_memory_bytes at the cloud's limits)
  // For a pipeline's first party (StageHello): the last of two stages cut here, at the cloud's
  // limits, taking the party's own terms within them (StagePlan::own_terms). Unset for a
  // U-shaped cut ("A,B"), which a pipeline's first party cannot ask for yet.
  std::optional<StagePlan> stage_plan;
  // A session's (or a federation's) back shard at its initial weights, on `backend`.
  std::unique_ptr<Network> make_network(Backend& backend, uint64_t seed) const {
    auto net = std::make_unique<Network>(graph, backend, seed);
    for (std::size_t i = 0; i < initial.size(); ++i) {
      net->all_params()[i]->value().copy_from(initial[i]);
      net->all_params()[i]->bump_version();
    }
    for (std::size_t i = 0; i < initial_buffers.size(); ++i) net->buffers()[i].second->copy_from(initial_buffers[i]);
    return net;
  }
};

// What the sessions' back shards take together, by their estimates at Hello
// (ServeOptions::session_memory_bytes): a session holds its share while it lives.
class SessionMemory {
 public:
  explicit SessionMemory(std::size_t limit) : limit_(limit) {}
  std::size_t limit() const { return limit_; }
  std::size_t used() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return used_;
  }
  // Takes `bytes` if they fit beside what the others hold; else nothing, and what is left.
  bool take(std::size_t bytes, std::size_t& left) {
    std::lock_guard<std::mutex> lock(mutex_);
    left = limit_ - std::min(used_, limit_);
    if (limit_ != 0 && bytes > left) return false;
    used_ += bytes;
    return true;
  }
  void give(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    used_ -= std::min(bytes, used_);
  }

 private:
  mutable std::mutex mutex_;
  const std::size_t limit_;
  std::size_t used_ = 0;
};

long long mib_up(std::size_t bytes) { return static_cast<long long>((bytes + (std::size_t{1} << 20) - 1) >> 20); }

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
  // A pipeline first party's session (StageHello): its last stage's checkpoints, beside.
  std::vector<uint64_t> stage_steps(const std::string& client_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return CheckpointStore(cat(root_, "/", client_id), "stage1").steps();
  }
  void save_stage(const std::string& client_id, uint64_t step, std::span<const uint8_t> checkpoint) {
    std::lock_guard<std::mutex> lock(mutex_);
    CheckpointStore(cat(root_, "/", client_id), "stage1").save(step, checkpoint);
  }
  CheckpointData load_stage(const std::string& client_id, uint64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    return CheckpointStore(cat(root_, "/", client_id), "stage1").load_step(step);
  }
  // The record of a pipeline session's end (STATE/checkpoints/NAME/stage1.ended): its step and
  // the session's key.
  std::optional<std::pair<uint64_t, std::string>> stage_end(const std::string& client_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::ifstream in(cat(root_, "/", client_id, "/stage1.ended"));
    std::pair<uint64_t, std::string> end;
    if (!(in >> end.first >> end.second)) return std::nullopt;
    return end;
  }
  void set_stage_end(const std::string& client_id, uint64_t step, const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::filesystem::create_directories(cat(root_, "/", client_id));
    const std::string text = cat(step, " ", key, "\n");
    write_file_atomic(cat(root_, "/", client_id, "/stage1.ended"),
                      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }
  // Removes the pipeline session's checkpoints but those of `keep`: another run's, or a future
  // this run has not reached (which would otherwise be taken for its own, or outrank its new
  // ones when the newest few are kept).
  void keep_stage_steps(const std::string& client_id, const std::vector<uint64_t>& keep) {
    std::lock_guard<std::mutex> lock(mutex_);
    const CheckpointStore store(cat(root_, "/", client_id), "stage1");
    for (uint64_t step : store.steps())
      if (std::find(keep.begin(), keep.end(), step) == keep.end()) std::filesystem::remove(store.path_of(step));
  }
  void drop_stage_end(const std::string& client_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::filesystem::remove(cat(root_, "/", client_id, "/stage1.ended"));
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
  std::unique_ptr<Network> tail;   // a U-shaped split's: the edges average it with the front
  std::unique_ptr<FolderRoundCheckpoints> rounds;
  // --replica-set: this cloud is one replica of several keeping the shard and the rounds in step.
  std::unique_ptr<Membership> membership;
  std::unique_ptr<ReplicaSync> replicas;
  // A replica serves its share of the set's edges (--back-accumulate N x --replicas R over the
  // members alive); one more is answered Busy, and its list of the set's addresses takes it to
  // another replica.
  uint64_t set_edges = 0;
  std::atomic<uint32_t> sessions{0};
  // The replica's driver (BackShardBatches::drive): its updates, and its idle part in the set's.
  std::atomic<bool> stop{false};
  std::thread driver;
  ~SharedBack() {
    stop = true;
    if (replicas) replicas->stop();  // a collective its peers broke is not made again
    if (driver.joinable()) driver.join();
  }
};

// The names with an open pipeline session (Worker::serve_stage): one session a name.
class StageNames {
 public:
  bool take(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    return names_.insert(name).second;
  }
  void give(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    names_.erase(name);
  }

 private:
  std::mutex mutex_;
  std::set<std::string> names_;
};

// One edge's session on its own thread, fed frames by the service loop.
class Worker {
 public:
  // The session is made on the first message, for the shard whose cut the Hello names (one
  // shard, or every legal cut's with --cut any).
  // `peer`: the client certificate's CN and serial; empty: none, and `tokens` checks the
  // Hello's token.
  Worker(uint64_t id, std::string peer, std::string serial, const std::vector<BackShard>& shards,
         const ServeOptions& o, LwsEndpoint& endpoint, FolderCheckpoints& checkpoints, SharedBack* shared,
         pki::TokenVerifier* tokens, ServiceMetrics& metrics, SessionMemory& memory, StageNames& stage_names)
      : id_(id), peer_(std::move(peer)), serial_(std::move(serial)), endpoint_(endpoint), shards_(shards), options_(o),
        checkpoints_(checkpoints), shared_(shared), tokens_(tokens), metrics_(metrics), memory_(memory),
        stage_names_(stage_names) {
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
    // The session's memory goes before its reservation does, so the next session admitted
    // does not meet it still held.
    session_.reset();
    trainer_.reset();
    optimizer_.reset();
    back_.reset();
    backend_.reset();
    memory_.give(reserved_);
    if (holds_share_) shared_->sessions.fetch_sub(1);
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // False (and nothing queued) when the session's inbox would pass max_queued_bytes.
  bool push(Frame frame) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (inbox_bytes_ + frame.size() > options_.max_queued_bytes) return false;
      inbox_bytes_ += frame.size();
      inbox_.push_back(std::move(frame));
    }
    wake_.notify_one();
    return true;
  }
  // Sends the Error as the connection's last word and drops whatever else arrives. From the
  // service's thread (a revocation, a deadline) while the session's thread may be working.
  void close_with(wire::ErrorCode code, const std::string& why) {
    if (closing_.exchange(true)) return;
    std::string who;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (session_) session_->cancel();
      inbox_.clear();
      inbox_bytes_ = 0;
      who = identity();
    }
    wake_.notify_one();  // a pipeline session waiting for its next frame: the link is gone
    std::fprintf(stderr, "session %llu (%s): closed: %s\n", static_cast<unsigned long long>(id_), who.c_str(),
                 why.c_str());
    MessageWriter writer;
    const auto bytes = writer.error(code, why);
    metrics_.count_error(wire::EnumNameErrorCode(code));
    metrics_.bytes_out += bytes.size();
    endpoint_.send(id_, bytes, /*close_after=*/true);
  }
  bool greeted() const { return greeted_; }
  std::chrono::steady_clock::time_point connected_at() const { return connected_at_; }
  // Why the revocation list now refuses this session's identity; "" when it does not.
  std::string revoked_by(pki::RevocationList& revoked) {
    if (!peer_.empty()) return revoked.refuses_certificate(peer_, serial_);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stage_client_.empty()) return revoked.refuses_session(stage_client_, connected_unix_);
    if (!session_ || session_->client_id().empty()) return "";
    return revoked.refuses_session(session_->client_id(), connected_unix_);
  }
  std::pair<uint64_t, uint64_t> inbox() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {inbox_.size(), inbox_bytes_};
  }
  std::string summary() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stage_)
      return cat("session ", id_, " (", identity(), "), a pipeline's last stage cut at '", cut_, "': ", stage_->steps,
                 " steps, ", stage_->samples, " samples, ", bytes_in_, " bytes in, ", bytes_out_, " bytes out, busy ",
                 stage_->busy_s, " s");
    if (!session_) return cat("session ", id_, " (", identity(), "): no Hello");
    std::string rounds;
    if (shared_)
      if (const auto e = shared_->federation->edge(id_)) rounds = cat(", ", e->rounds_joined, " rounds joined");
    return cat("session ", id_, " (", identity(), "), cut '", cut_, "': ", session_->step(), " steps, ",
               session_->trained_samples(), " samples, ", bytes_in_, " bytes in, ", bytes_out_, " bytes out, busy ",
               session_->busy_seconds(), " s", rounds);
  }
  // The session's figures as one JSON line, for the metrics file.
  std::string metrics_line() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stage_)
      return cat("{\"session\":", id_, ",\"client\":\"", stage_client_, "\",\"stage\":1,\"steps\":", stage_->steps,
                 ",\"samples\":", stage_->samples, ",\"train_loss\":",
                 fixed(stage_->samples > 0 ? stage_->loss_sum / static_cast<double>(stage_->samples) : 0.0, 5),
                 ",\"bytes_in\":", bytes_in_.load(), ",\"bytes_out\":", bytes_out_.load(),
                 ",\"busy_s\":", fixed(stage_->busy_s, 3), "}");
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

  // A replica serves its share of the set's edges: --back-accumulate N of each of the --replicas
  // R, spread over the members alive now (a replica lost, its edges find room on the others).
  // "" when this session takes a place; else why not, for Busy.
  std::string take_share() {
    const uint64_t live = std::max<uint64_t>(1, shared_->replicas->totals().members);
    const auto share = static_cast<uint32_t>((shared_->set_edges + live - 1) / live);
    if (shared_->sessions.fetch_add(1) >= share) {
      shared_->sessions.fetch_sub(1);
      metrics_.count_refusal("replica_share");
      return cat("this replica serves ", share, " edges, its share of the replica set's ", shared_->set_edges, " over ",
                 live, " replica", live == 1 ? "" : "s", " (--back-accumulate x --replicas): try another replica of "
                 "the set");
    }
    holds_share_ = true;
    greeted_ = true;  // it said who it is: the wait for the set's next round is no missing Hello
    return "";
  }

  // Whether an accepted Hello's back shard fits beside the others' (its estimate reserved
  // until the session ends); if not, the connection is closed with Busy (try again later) or,
  // when it could never fit, NoRoom, instead of the Welcome. A federation's one shard is made
  // at start: nothing to admit.
  // Whether a session's back shard fits beside the others' (its estimate reserved until the
  // session ends): none (ok) or the refusal, Busy (try again later) or, when it could never
  // fit, NoRoom. A federation's one shard is made at start: nothing to admit.
  WireError admission(const BackShard& shard) {
    if (shared_ || memory_.limit() == 0) return {};
    std::size_t left = 0;
    const std::string needs = cat("this session's back shard (cut '", shard.cut, "', at the cloud's batch of ",
                                  options_.batch_size, ") needs about ", mib_up(shard.session_bytes), " MiB");
    if (shard.session_bytes > memory_.limit()) {
      metrics_.count_refusal("session_memory");
      return {wire::ErrorCode::NoRoom,
              cat(needs, ", more than the ", mib_up(memory_.limit()),
                  " MiB this cloud gives all sessions together (tandem-cloud serve --session-memory-mb): it cannot "
                  "train here; the operator can raise the bound or lower --batch")};
    }
    if (!memory_.take(shard.session_bytes, left)) {
      metrics_.count_refusal("session_memory");
      return {wire::ErrorCode::Busy, cat(needs, " and the sessions' memory (", mib_up(memory_.limit()),
                                         " MiB, --session-memory-mb) has ", left >> 20, " MiB left: try again later")};
    }
    reserved_ = shard.session_bytes;
    return {};
  }
  // An accepted Hello's admission: if refused, the connection is closed with the Error
  // instead of the Welcome.
  bool admit(const BackShard& shard) {
    const WireError no = admission(shard);
    if (!no.ok()) close_with(no.code, no.text);
    return no.ok();
  }

  void start_session(const BackShard& shard) {
    const ServeOptions& o = options_;
    // Labels range over the model's classes (its output's size per head).
    const auto classes = static_cast<int32_t>(shard.graph.classes());
    CloudSessionConfig config{shard.hash,          o.batch_size,  o.microbatches, classes, id_,
                              o.max_message_bytes, o.wire_dtypes, shard.cut,      &checkpoints_};
    config.peer_identity = peer_;
    config.defer_weights = o.defer_weights;
    if (peer_.empty()) {  // no client certificate: the Hello's enrolment token must vouch for the edge
      pki::TokenVerifier* tokens = tokens_;
      config.authorize = [tokens](const std::string& token, const std::string& client) {
        return tokens ? tokens->accept(token, client) : std::string("this cloud takes only client certificates");
      };
      // Its token is spent now: a fresh one (an hour's) for its Hello after a lost link.
      config.next_token = [state_dir = o.state_dir](const std::string& client) {
        return pki::issue_token(state_dir, client, 3600);
      };
    }
    std::unique_ptr<Network> back;
    std::unique_ptr<Optimizer> optimizer;
    std::unique_ptr<BackShardTrainer> trainer;
    std::unique_ptr<CloudSession> session;
    if (shared_) {  // one back shard for every edge, in turns
      config.federation = shared_->federation.get();
      config.rounds = shared_->rounds.get();
      if (shared_->replicas) config.take_place = [this] { return take_share(); };
      session = std::make_unique<CloudSession>(*shared_->trainer, config);
    } else {
      // Made here, on the session's thread at its first message, not per connection: a cuda
      // backend's stream and library handles are not spent on connections that never speak.
      backend_ = make_backend(o.backend, BackendOptions{o.threads});
      back = shard.make_network(*backend_, o.seed);
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
    shard_ = &shard;
  }

  void run() {
    try {
      serve_messages();
    } catch (const std::exception& e) {  // the cloud's own failure (a backend that cannot start): this session ends
      close_with(wire::ErrorCode::Internal, cat("the cloud failed on this session: ", e.what()));
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_; });
    }
  }

  void serve_messages() {
    for (;;) {
      Frame frame;
      bool idle = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // While no message waits, the back shard's deferred weight gradients run (one
        // micro-batch's at a time, so a Forward that arrives meanwhile waits little).
        idle = !stop_ && inbox_.empty() && !closing_ && session_ && session_->has_deferred_work();
        if (!idle) {
          wake_.wait(lock, [&] { return stop_ || !inbox_.empty(); });
          if (stop_) return;
          frame = std::move(inbox_.front());
          inbox_.pop_front();
          inbox_bytes_ -= frame.size();
        }
      }
      if (idle) {
        const double busy_before = session_->busy_seconds();
        session_->run_deferred();
        metrics_.busy_us += static_cast<uint64_t>(std::max(0.0, session_->busy_seconds() - busy_before) * 1e6);
        continue;
      }
      if (closing_) continue;
      if (!session_ && is_stage_hello(frame)) {
        serve_stage(std::move(frame));
        return;  // one run a connection: the service ends the worker when its connection closes
      }
      if (!session_) start_session(shard_for(frame));
      CloudSession& session = *session_;
      if (session.closed()) continue;  // the connection is closing: drop the rest
      bytes_in_ += frame.size();
      metrics_.bytes_in += frame.size();
      ++metrics_.messages_in;
      const uint64_t steps_before = session.step(), samples_before = session.trained_samples();
      const double busy_before = session.busy_seconds();
      CloudReply reply = session.handle(frame);
      // Admitted once its Hello is accepted: a wrong model or a refused token gets its own Error.
      if (!greeted_ && !session.client_id().empty() && !reply.close && !session.closed() && !admit(*shard_)) {
        greeted_ = true;
        continue;
      }
      greeted_ = greeted_ || !session.client_id().empty() || session.closed();
      bytes_out_ += reply.bytes.size() + reply.then.size();
      metrics_.bytes_out += reply.bytes.size() + reply.then.size();
      if (reply.close && !session.closed()) continue;
      count_and_log_error(reply);
      if (!reply.bytes.empty()) endpoint_.send(id_, reply.bytes, reply.close);
      if (!reply.then.empty()) endpoint_.send(id_, reply.then);
      session.finish_step();
      // (A resumed session's step jumps with no samples: not a step trained here.)
      if (session.step() > steps_before && session.trained_samples() > samples_before)
        metrics_.steps += session.step() - steps_before;
      if (session.trained_samples() > samples_before) metrics_.samples += session.trained_samples() - samples_before;
      metrics_.busy_us += static_cast<uint64_t>(std::max(0.0, session.busy_seconds() - busy_before) * 1e6);
    }
  }

  // A pipeline's first party: `tandem stage` with this cloud as the party after it, whose
  // first message is a StageHello (pipeline/stage_peer.h), not a Hello.
  bool is_stage_hello(const Frame& frame) const {
    WireError err;
    const wire::Message* m = verify_frame(frame, options_.max_message_bytes, err);
    return m && m->payload_type() == wire::Payload::StageHello;
  }

  // The connection as a pipeline's link (the stage before's end): what arrives comes from the
  // inbox, on this thread; a refusal is the connection's last word.
  class InboxLink final : public StageLink {
   public:
    InboxLink(Worker& w, Frame first) : w_(w), first_(std::move(first)) {}
    void send(std::span<const uint8_t> bytes) override { w_.out(bytes, false); }
    void send_last(std::span<const uint8_t> bytes) override { w_.out(bytes, true); }
    Frame receive(const char* awaiting) override {
      if (first_) {
        Frame f = std::move(*first_);
        first_.reset();
        return f;
      }
      return w_.next_frame(awaiting);
    }
    void refuse(const WireError& error) override { w_.close_with(error.code, error.text); }

   private:
    Worker& w_;
    std::optional<Frame> first_;  // the StageHello, read first
  };
  void out(std::span<const uint8_t> bytes, bool close_after) {
    bytes_out_ += bytes.size();
    metrics_.bytes_out += bytes.size();
    endpoint_.send(id_, bytes, close_after);
  }
  // The next frame of the connection; LinkLost once it closes (or is closed with an Error).
  Frame next_frame(const char* awaiting) {
    Frame frame;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || closing_ || !inbox_.empty(); });
      if (stop_ || closing_ || inbox_.empty())
        throw LinkLost(cat("the first party's link closed while this cloud awaited ", awaiting));
      frame = std::move(inbox_.front());
      inbox_.pop_front();
      inbox_bytes_ -= frame.size();
    }
    bytes_in_ += frame.size();
    metrics_.bytes_in += frame.size();
    ++metrics_.messages_in;
    return frame;
  }
  [[noreturn]] void refuse(StageLink& link, wire::ErrorCode code, const std::string& why) {
    link.refuse({code, why});
    fail("serve", why);
  }

  // The figures of a pipeline first party's session, for summary() and metrics_line().
  struct StageFigures {
    uint64_t steps = 0, samples = 0;
    double loss_sum = 0, busy_s = 0;
  };

  // A pipeline's first party: its session is the last of two stages cut where its plan says
  // (one of this cloud's cuts), trained by a StagePeer on this thread from the newest
  // checkpoint both have (STATE/checkpoints/NAME/stage1-*), until the party's Bye. The party
  // plans its own batch, K, schedule and dtype within this cloud's (--batch, --microbatches,
  // --wire-dtypes); the back shard's optimizer is the cloud's. One run a connection: after a
  // lost link the party links again and both go on from their newest common checkpoint.
  // What the cloud keeps of the session (checkpoints, the record of its end) is keyed by the
  // party's run (its plan, terms, schedule, batch, K and dtype) and the cloud's own terms.
  void serve_stage(Frame hello) {
    greeted_ = true;
    bytes_in_ += hello.size();
    metrics_.bytes_in += hello.size();
    ++metrics_.messages_in;
    const ServeOptions& o = options_;
    // The StageHello stays in `link` (its first frame) until connect() reads it: `h` is valid
    // until then.
    WireError err;
    const wire::StageHello* h = verify_frame(hello, o.max_message_bytes, err)->payload_as_StageHello();
    InboxLink link(*this, std::move(hello));
    const std::string said = h->client_id() ? h->client_id()->str() : std::string();
    // The shard whose plan it names; else one a pipeline can train against (whose checks then
    // refuse the plan by name).
    const BackShard* shard = nullptr;
    for (const BackShard& b : shards_)
      if (b.stage_plan && h->plan_hash() && h->plan_hash()->size() == 32 &&
          std::equal(b.stage_plan->hash.begin(), b.stage_plan->hash.end(), h->plan_hash()->begin()))
        shard = &b;
    for (const BackShard& b : shards_)
      if (!shard && b.stage_plan) shard = &b;
    if (!shard) shard = &shards_.front();
    // This name's place among the open pipeline sessions, given back however the session ends.
    struct Held {
      StageNames& names;
      std::string name;
      ~Held() {
        if (!name.empty()) names.give(name);
      }
    } held{stage_names_, {}};
    try {
      // Who it is: its certificate's name, or without one the name its enrolment token is for
      // (the token is spent below, once the session is admitted).
      if (!peer_.empty()) {
        if (!said.empty() && said != peer_)
          refuse(link, wire::ErrorCode::Unauthorized,
                 cat("the StageHello says client id '", said, "' but the client certificate was issued to '", peer_,
                     "': a party trains only as the identity it holds"));
      } else if (!valid_client_id(said)) {
        refuse(link, wire::ErrorCode::Malformed,
               "the client id must be 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'");
      } else if (!tokens_) {
        refuse(link, wire::ErrorCode::Unauthorized, "this cloud takes only client certificates");
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stage_client_ = peer_.empty() ? said : peer_;
      }
      const std::string& client = stage_client_;  // (this thread alone writes it)
      if (shared_)
        refuse(link, wire::ErrorCode::UnexpectedMessage,
               "this cloud serves a federation (--aggregate-every): a pipeline's first party trains against a cloud "
               "that keeps a last stage for each party");
      if (!shard->stage_plan)
        refuse(link, wire::ErrorCode::ModelMismatch,
               cat("this cloud serves the U-shaped cut '", shard->cut, "', which a pipeline's first party cannot "
                   "train against: serve a cut of one node"));
      std::unique_ptr<PipelineSchedule> schedule;
      try {
        schedule = make_pipeline_schedule(h->schedule() ? h->schedule()->str() : std::string());
      } catch (const std::exception& e) {
        refuse(link, wire::ErrorCode::ModelMismatch, cat("the first party's schedule: ", e.what()));
      }
      // Everything the session's peer checks, before anything is spent on it.
      if (const WireError no = stage_hello_problem(*shard->stage_plan, schedule->name(), *h, true); !no.ok())
        refuse(link, no.code, no.text);
      // One session a name: a second (its party linking again while the old connection is
      // still open here) waits until the first has ended.
      if (!stage_names_.take(client))
        refuse(link, wire::ErrorCode::Busy,
               cat("a session of '", client, "' is open here already (its connection not yet closed): try again later"));
      held.name = client;
      if (const WireError no = admission(*shard); !no.ok()) refuse(link, no.code, no.text);
      std::string next_token;  // a token's party: a fresh one, for its StageHello after a lost link
      if (peer_.empty()) {
        const std::string why = tokens_->accept(h->token() ? h->token()->str() : std::string(), said);
        if (!why.empty()) refuse(link, wire::ErrorCode::Unauthorized, why);
        next_token = pki::issue_token(o.state_dir, said, 3600);
      }
      // The session's key: the party's run as it says it (its plan, terms, schedule, batch, K
      // and the dtype chosen) and the cloud's own terms.
      StagePlan session = *shard->stage_plan;
      session.batch = h->batch();
      session.microbatches = h->microbatches();
      session.dtype = *choose_dtype(session, *h);
      {
        Sha256 t;
        if (h->terms_hash()) t.update(h->terms_hash()->data(), h->terms_hash()->size());
        t.update(shard->stage_plan->terms.data(), shard->stage_plan->terms.size());
        session.terms = t.finish();
      }
      const std::array<uint8_t, 32> key = run_hash(session, schedule->name());
      const std::string key_hex = to_hex(key.data(), key.size());
      const std::optional<uint64_t> party_ended = h->ended() ? std::optional<uint64_t>(h->ended_step()) : std::nullopt;

      backend_ = make_backend(o.backend, BackendOptions{o.threads});
      back_ = shard->make_network(*backend_, o.seed);
      optimizer_ = make_optimizer(back_->params(), o.optimizer);
      Stage stage(*back_, optimizer_.get());
      StagePlan plan = *shard->stage_plan;
      plan.run = key;
      StagePeer peer(stage, *schedule, plan, &link, nullptr);
      CheckpointMeta meta;
      meta.role = "stage";
      meta.cut = shard->cut;
      meta.model_hash = key;
      meta.client_id = client;
      const auto save = [&](uint64_t step) {
        meta.step = step;
        checkpoints_.save_stage(client, step, encode_checkpoint(meta, *back_, optimizer_.get()));
      };
      peer.on_checkpoint(save);
      // The run's end: its last stage saved and the end recorded before the party hears Bye, so
      // a party that links again after it (its Bye lost, or started again) hears Bye again.
      peer.on_end([&](uint64_t steps, bool acknowledged) {
        if (acknowledged) return;
        save(steps);
        checkpoints_.set_stage_end(client, steps, key_hex);
      });
      // A party that recorded the end this cloud recorded, of this run: answered Bye.
      const auto end = checkpoints_.stage_end(client);
      if (end && end->second == key_hex && party_ended == end->first) peer.set_ended(end->first, true);
      // This run's checkpoints only.
      std::vector<uint64_t> have;
      for (uint64_t step : checkpoints_.stage_steps(client)) try {
          const CheckpointData d = checkpoints_.load_stage(client, step);
          if (d.meta.model_hash == key && d.meta.step == step && d.meta.role == "stage" && d.meta.client_id == client)
            have.push_back(step);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "session %llu (%s): skipping its checkpoint of step %llu: %s\n",
                       static_cast<unsigned long long>(id_), client.c_str(), static_cast<unsigned long long>(step),
                       e.what());
        }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        cut_ = shard->cut;
        stage_ = std::make_unique<StageFigures>();
      }
      peer.set_answer_token(next_token);
      const uint64_t start = peer.connect(have);
      if (peer.ended()) {
        std::printf("session %llu (%s): its run ended here at step %llu before: answered Bye\n",
                    static_cast<unsigned long long>(id_), identity().c_str(), static_cast<unsigned long long>(start));
        return;
      }
      // The run goes on (or a new one starts): a record of an end is superseded, and every
      // checkpoint but this run's at or before `start` goes (another run's, or a future this
      // one has not reached).
      if (end) checkpoints_.drop_stage_end(client);
      if (start > 0) restore_checkpoint(checkpoints_.load_stage(client, start), *back_, optimizer_.get());
      std::erase_if(have, [&](uint64_t step) { return step > start; });
      checkpoints_.keep_stage_steps(client, have);
      std::printf("session %llu (%s): a pipeline's last stage cut at '%s', %s schedule, from step %llu\n",
                  static_cast<unsigned long long>(id_), identity().c_str(), shard->cut.c_str(), schedule->name(),
                  static_cast<unsigned long long>(start));
      std::fflush(stdout);
      for (StepStats stats;;) {
        const double busy_before = stage.busy_s();
        const bool more = peer.follow_step(stats);
        metrics_.busy_us += static_cast<uint64_t>(std::max(0.0, stage.busy_s() - busy_before) * 1e6);
        if (more && !peer.evaluated()) {
          ++metrics_.steps;
          metrics_.samples += static_cast<uint64_t>(stats.samples);
        }
        std::lock_guard<std::mutex> lock(mutex_);
        stage_->steps = peer.next_step();
        if (more && !peer.evaluated()) {
          stage_->samples += static_cast<uint64_t>(stats.samples);
          stage_->loss_sum += stats.loss_sum;
        }
        stage_->busy_s = stage.busy_s();
        if (!more) break;
      }
      std::printf("session %llu (%s): the party ended its run at step %llu\n", static_cast<unsigned long long>(id_),
                  identity().c_str(), static_cast<unsigned long long>(peer.next_step()));
    } catch (const LinkLost& e) {
      std::fprintf(stderr, "session %llu (%s): %s\n", static_cast<unsigned long long>(id_), identity().c_str(), e.what());
    } catch (const std::exception& e) {  // refused (the party was told why), or the cloud's own failure
      if (!closing_) close_with(wire::ErrorCode::Internal, cat("the cloud failed on this session: ", e.what()));
    }
  }

  // Errors sent are counted by code; refusals (the Error that closes) are logged, so the
  // operator sees why an edge was turned away.
  void count_and_log_error(const CloudReply& reply) {
    if (reply.bytes.empty()) return;
    // The session's own MessageWriter output (aligned, well-formed): read in place, with no
    // copy or verification of every Backward on the way.
    const wire::Message* m = wire::GetMessage(reply.bytes.data());
    if (m->payload_type() != wire::Payload::Error) return;
    const wire::Error* e = m->payload_as_Error();
    metrics_.count_error(wire::EnumNameErrorCode(e->code()));
    if (reply.close)
      std::fprintf(stderr, "session %llu (%s): refused: %s\n", static_cast<unsigned long long>(id_), identity().c_str(),
                   e->text() ? e->text()->c_str() : "(no text)");
  }
  // The certificate's name, or the client id a token vouched for.
  std::string identity() const {
    if (!peer_.empty()) return peer_;
    if (!stage_client_.empty()) return cat("token for ", stage_client_);
    return session_ && !session_->client_id().empty() ? cat("token for ", session_->client_id()) : "no certificate";
  }

  uint64_t id_;
  std::string peer_, serial_;
  LwsEndpoint& endpoint_;
  const std::vector<BackShard>& shards_;
  const ServeOptions& options_;
  FolderCheckpoints& checkpoints_;
  SharedBack* shared_;
  pki::TokenVerifier* tokens_;
  ServiceMetrics& metrics_;
  SessionMemory& memory_;
  StageNames& stage_names_;
  std::size_t reserved_ = 0;  // taken from memory_ at admit, given back with the worker
  bool holds_share_ = false;  // counted in shared_->sessions at admit, until the worker goes
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Network> back_;  // these four: made on the first message (start_session)
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<BackShardTrainer> trainer_;
  std::unique_ptr<CloudSession> session_;
  std::unique_ptr<StageFigures> stage_;  // a pipeline first party's session (serve_stage)
  std::string stage_client_;             // and who it is (its certificate's name, or its token's)
  std::string cut_;
  const BackShard* shard_ = nullptr;  // the session's (start_session)
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Frame> inbox_;
  uint64_t inbox_bytes_ = 0;
  bool stop_ = false;
  std::atomic<bool> closing_{false}, greeted_{false};
  const std::chrono::steady_clock::time_point connected_at_ = std::chrono::steady_clock::now();
  const int64_t connected_unix_ = static_cast<int64_t>(std::time(nullptr));
  std::atomic<uint64_t> bytes_in_{0}, bytes_out_{0};
  std::thread thread_;
};

}  // namespace

int serve(const ServeOptions& o) {
  const auto ids = pki::init(o.state_dir);
  const ModelSpec spec = load_model_spec(o.model_path);
  const Graph graph = Graph::build(spec);
  const std::string cut = o.cut.empty() ? graph.default_cut() : o.cut == "any" ? o.cut : graph.cut_nodes(o.cut);
  if (cut.empty()) fail("serve", "the spec names no default cut; pass --cut NODE (or --cut any)");
  // --cut any: every legal cut, the spec's default (if any) first; an edge picks with its Hello.
  std::vector<std::string> cuts = {cut};
  if (cut == "any") {
    cuts = legal_cuts(graph);
    const auto d = std::find(cuts.begin(), cuts.end(), graph.default_cut());
    if (d != cuts.end()) std::rotate(cuts.begin(), d, d + 1);
  }

  // The sessions' backend, made once now so that one this machine cannot run (cuda without a
  // GPU) is refused at start with the reason, not at the first edge's Hello.
  make_backend(o.backend, BackendOptions{o.threads});
  if (o.backend == "cuda") set_gpu_memory_budget(o.gpu_memory_bytes);

  // Back shards start from the same weights the whole model would (one seeded draw in graph
  // order), so a run does not depend on where the cut is.
  std::vector<BackShard> shards;
  {
    auto reference = make_backend("reference");
    Network whole(graph, *reference, o.seed);
    std::vector<SafeTensor> init;
    if (!o.init_from.empty()) init = read_safetensors_file(o.init_from, {});
    for (const std::string& c : cuts) {
      BackShard s{c, model_hash(spec, c), graph.split(c).second, {}, {}, 0, std::nullopt};
      Network back(s.graph, *reference, o.seed);
      if (!o.init_from.empty()) {
        shard_from_torch(graph, init, back);
        for (Param* p : back.all_params()) s.initial.push_back(p->value().clone());
        for (auto& [name, t] : back.buffers()) s.initial_buffers.push_back(t->clone());
      } else {
        for (Param* p : back.all_params()) s.initial.push_back(whole.param(p->name()).value().clone());
      }
      // At the cloud's limits, and with the whole batch as the working micro-batch: an edge may
      // send one of B, and deferred weight gradients keep K slots of backward buffers.
      s.session_bytes = static_cast<std::size_t>(
          training_memory_bytes(back, o.batch_size, o.batch_size, optimizer_state_floats(o.optimizer)));
      if (c.find(',') == std::string::npos) {  // a pipeline's first party may train against it too
        const GPipeSchedule gpipe;  // (the run's hash is made again with the party's schedule)
        const OptimizerOptions& opt = o.optimizer;
        StagePlan plan = make_stage_plan(
            spec.binary, graph, c, graph.partition(cut_list(c)), 1, gpipe, o.batch_size, o.microbatches,
            wire::DType::F32, true,
            cat("cloud optimizer=", opt.kind, " lr=", opt.lr, " momentum=", opt.momentum, " weight_decay=",
                opt.weight_decay, " nesterov=", opt.nesterov, " betas=", opt.beta1, ",", opt.beta2, " eps=", opt.eps,
                " clip_norm=", opt.clip_norm, " seed=", o.seed, " init_from=", o.init_from));
        plan.own_terms = true;
        plan.accepts = o.wire_dtypes;
        s.stage_plan = plan;
      }
      shards.push_back(std::move(s));
    }
    if (!o.init_from.empty()) std::printf("back shards initialised from %s\n", o.init_from.c_str());
  }

  EndpointOptions eo;
  eo.max_message_bytes = o.max_message_bytes;
  eo.client_certificate_optional = o.accept_tokens;
  eo.web_root = o.web_root;
  eo.max_connections = o.max_connections;
  eo.handshake_timeout_s = o.handshake_timeout_s;
  eo.max_queued_bytes = o.max_queued_bytes;
  if (o.io_threads > 0) {
    eo.io_threads = o.io_threads;
  } else {  // the cores this process may use (its affinity: a container's or taskset's), not the host's
    cpu_set_t cpus;
    const int usable = sched_getaffinity(0, sizeof cpus, &cpus) == 0
                           ? CPU_COUNT(&cpus)
                           : static_cast<int>(std::thread::hardware_concurrency());
    eo.io_threads = std::clamp(usable / 8, 1, 8);
  }
  if (!o.web_root.empty() && !std::filesystem::is_regular_file(o.web_root + "/index.html"))
    fail("serve", cat("--web ", o.web_root, " has no index.html (build the browser edge: bash wasm/build.sh, then --web build/wasm/web; docs/10-browser-edge.md)"));
  // Revoked identities (`pki revoke`): refused at every connection and token, and their live
  // sessions closed when the list changes.
  pki::RevocationList revoked(o.state_dir);
  std::unique_ptr<pki::TokenVerifier> tokens;
  if (o.accept_tokens)
    tokens = std::make_unique<pki::TokenVerifier>(o.state_dir, [&revoked](const std::string& client, int64_t iat) {
      return revoked.refuses_token(client, iat);
    });
  auto endpoint = LwsEndpoint::listen(o.host, o.port, {ids.server_cert, ids.server_key, ids.ca_cert}, eo);

  std::ofstream metrics_file;
  if (!o.metrics_json.empty()) {
    metrics_file.open(o.metrics_json, std::ios::app);
    if (!metrics_file) fail("serve", cat("cannot write --metrics-json ", o.metrics_json));
  }
  std::mutex metrics_mutex;
  auto write_metrics = [&](const std::string& line) {
    if (line.empty() || !metrics_file) return;
    std::lock_guard<std::mutex> lock(metrics_mutex);
    metrics_file << line << "\n" << std::flush;
  };
  std::unique_ptr<SharedBack> shared;
  if (o.federation.aggregate_every > 0) {
    if (shards.size() != 1) fail("serve", "a federation trains one cut: give --cut NODE (not any)");
    shared = std::make_unique<SharedBack>();
    shared->backend = make_backend(o.backend, BackendOptions{o.threads});
    const BackShard& s = shards.front();
    shared->net = s.make_network(*shared->backend, o.seed);
    shared->optimizer = make_optimizer(shared->net->params(), o.optimizer);
    // Steps whose gradients the shared shard sums before one update (the edges' steps
    // interleave, so with N edges an update sees every edge's data, as IID training would).
    shared->trainer = o.federation.batch_edges
                          ? std::make_unique<BackShardTrainer>(*shared->net, *shared->optimizer, o.federation.deadline_s,
                                                               o.federation.back_accumulate,
                                                               BackShardTrainer::Batched{o.federation.batch_gather_s, o.federation.min_edges})
                          : std::make_unique<BackShardTrainer>(*shared->net, *shared->optimizer, o.federation.deadline_s,
                                                               o.federation.back_accumulate);
    // The front every edge starts from: the whole model's initial weights (or --init-from's).
    shared->front_backend = make_backend("reference");
    shared->front = std::make_unique<Network>(graph.split(s.cut).first, *shared->front_backend, o.seed);
    std::vector<Network*> edge_model = {shared->front.get()};
    if (u_shaped_cut(s.cut)) {  // the edges also hold the tail: it joins the rounds after the front
      shared->tail = std::make_unique<Network>(graph.tail(s.cut), *shared->front_backend, o.seed);
      edge_model.push_back(shared->tail.get());
    }
    NamedTensors initial;
    for (Network* part : edge_model) {
      if (!o.init_from.empty()) {
        shard_from_torch(graph, read_safetensors_file(o.init_from, import_names(graph, *part)), *part);
      } else {
        init_from_whole_model(graph, o.seed, *part, *shared->front_backend);
      }
      for (Param* p : part->params()) initial.emplace_back(p->name(), p->value().clone());
    }
    LwsEndpoint* ep = endpoint.get();
    shared->federation = std::make_unique<Federation>(
        std::move(initial), o.federation, [ep](uint64_t c, std::span<const uint8_t> b) { ep->send(c, b); });
    shared->federation->set_metrics_sink(write_metrics);
    // Each round's back shard and average are kept; a restarted cloud goes on from the last.
    shared->rounds = std::make_unique<FolderRoundCheckpoints>(cat(o.state_dir, "/federation"), edge_model, s.hash, s.cut);
    if (auto last = shared->rounds->load_latest(*shared->net, *shared->optimizer)) {
      shared->federation->restore(last->first, std::move(last->second));
      std::printf("tandem-cloud: continuing the federation from round %u (%s)\n", last->first,
                  shared->rounds->dir().c_str());
    }
  }
  if (!o.replicas.set_dir.empty()) {
    // Replicas: before any edge is served, this process joins the set (forming it with the
    // first --replicas, or asking to join one that runs) and takes rank 0's shard, optimizer
    // state, round and average, so every replica serves the same model.
    const ServeReplicas& r = o.replicas;
    if (!shared || !o.federation.batch_edges)
      fail("serve", "--replica-set keeps one shared back shard in step over several clouds: give --aggregate-every S, "
                    "--back-accumulate N and --batch-edges (N: the edges of each replica)");
    MembershipOptions mo;
    mo.gloo.store_dir = r.set_dir;
    mo.gloo.prefix = "cloud";
    mo.gloo.address = r.address;
    mo.gloo.allow_public = r.allow_public;
    mo.engine = r.engine;
    mo.gloo.timeout = std::chrono::milliseconds(static_cast<int64_t>(r.timeout_s * 1000));
    mo.id = r.id;
    mo.initial = r.initial;
    mo.settle = std::chrono::milliseconds(static_cast<int64_t>(r.settle_s * 1000));
    std::printf("tandem-cloud: replica '%s' meeting its set in %s (collectives on %s over Gloo, neither encrypted nor "
                "authenticated: keep it on a private network)\n",
                r.id.c_str(), r.set_dir.c_str(), r.address.c_str());
    std::fflush(stdout);
    shared->membership = std::make_unique<Membership>(mo);
    // A replica left out of the set (silent past the others' timeout) ends, and its supervisor
    // starts it afresh: healing in place would leave its edges' steps a window behind the set's,
    // and the next round out of step. Its edges move to the other replicas' addresses.
    ReplicaOptions ro{replica_mode(r.mode), r.average_every};
    ro.heal = false;
    ro.sum = true;
    ro.on_left_out = [id = r.id](const std::string& why) {
      std::fprintf(stderr, "tandem-cloud: replica '%s' was left out of its set (%s): it stops with status 3, to be "
                           "started again (it then joins the set afresh)\n", id.c_str(), why.c_str());
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(3);
    };
    shared->replicas = std::make_unique<ReplicaSync>(*shared->trainer->batched_stage(), *shared->membership, ro);
    Federation* federation = shared->federation.get();
    ReplicaSync* sync = shared->replicas.get();
    sync->also_copy([federation] { return federation->state(); },
                    [federation](std::span<const float> v) { federation->set_state(v); });
    sync->copy_from(0);
    shared->set_edges = static_cast<uint64_t>(r.initial) * o.federation.back_accumulate;
    // Windows of one step of each edge this replica holds, whatever their number: every replica
    // makes one update a step, so edges may move between replicas; a driver thread applies them
    // and, with no edge here, takes part in the set's collectives with nothing to hand in.
    BackShardBatches& batches = *shared->trainer->batches();
    batches.set_replica_windows(r.timeout_s / 2);
    federation->set_on_close([&batches] { batches.round_boundary(); });
    federation->set_replica_rounds([&batches] { batches.round_ready(); });
    SharedBack* sb = shared.get();
    shared->driver = std::thread([sb, sync, federation, &batches, id = r.id] {
      BackShardBatches::Drive calls;
      calls.idle = [&] {
        ReplicaSync::IdleCalls idle;
        idle.update = [&](uint64_t steps, double lr_sum) { batches.apply_idle_update(steps, lr_sum); };
        idle.round = [&](std::span<const float> sums, uint64_t round) { federation->replica_round(sums, round); };
        idle.round_pending = [&] { return federation->round_pending(); };
        idle.round_values = [&] { return federation->replica_round_values(); };
        idle.next_round = [&] { return static_cast<uint64_t>(federation->round()) + 1; };
        switch (sync->idle(idle)) {
          case ReplicaSync::Idled::Update:
          case ReplicaSync::Idled::Average: return BackShardBatches::IdleTurn::Update;
          case ReplicaSync::Idled::Round: return BackShardBatches::IdleTurn::Round;
          default: return BackShardBatches::IdleTurn::Nothing;
        }
      };
      calls.round = [sync, federation] {
        if (!federation->round_ready()) return;
        std::vector<float> sums = federation->replica_round_values();
        const uint64_t round = static_cast<uint64_t>(federation->round()) + 1;
        // (a replica left out stops, heal being off: the sum is always made here)
        if (!sync->all_sum(sums, round)) fail("replicas", "this replica was left out of its set");
        federation->replica_round(sums, round);
      };
      calls.after_round = [sb, federation] {
        if (!sb->rounds) return;
        const auto due = federation->take_unsaved_round();
        if (!due) return;
        try {
          sb->rounds->save(due->first, due->second, *sb->net, *sb->optimizer);
        } catch (const Error& e) {  // training goes on; the operator sees why the round is not kept
          std::fprintf(stderr, "tandem-cloud: round %u was not checkpointed: %s\n", due->first, e.what());
        }
      };
      try {
        batches.drive(sb->stop, calls);
      } catch (const std::exception& e) {
        if (sb->stop) return;  // stopping: the others may have gone first
        // Out of step, or a collective this replica cannot go on from: it stops, to be started
        // afresh (it then joins the set and copies a member's state).
        std::fprintf(stderr, "tandem-cloud: replica '%s' stops: %s\n", id.c_str(), e.what());
        std::fflush(stderr);
        std::fflush(stdout);
        std::_Exit(1);
      }
    });
    std::string members;
    for (const std::string& m : shared->membership->members()) members += cat(members.empty() ? "" : ", ", m);
    std::printf("tandem-cloud: replica %d of %d in epoch %llu (%s), %s; the shard at update %lld, round %u\n",
                sync->group().rank(), sync->group().size(), static_cast<unsigned long long>(shared->membership->epoch()),
                members.c_str(),
                r.mode == "sync" ? "gradients all-summed every update"
                                 : cat("weights averaged every ", r.average_every, " updates").c_str(),
                static_cast<long long>(shared->optimizer->steps()), federation->round());
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::printf("tandem-cloud: listening on wss://%s:%d (model %s, cut '%s', back shard on %s, %d kernel thread%s a "
              "session, CA %s)\n",
              o.host.c_str(), endpoint->port(), spec.name.c_str(),
              cut == "any" ? cat("any of ", cuts.size()).c_str() : cut.c_str(), o.backend.c_str(), o.threads,
              o.threads == 1 ? "" : "s", ids.ca_cert.c_str());
  if (o.backend == "cuda") std::printf("tandem-cloud: the GPU: %s\n", gpu_summary().c_str());
  if (shared)
    std::printf("split-federated: one back shard for every edge, front shards averaged every %u steps (a round "
                "waits at most %.1f s once one edge has sent, for at least %u edges)\n",
                o.federation.aggregate_every, o.federation.deadline_s, o.federation.min_edges);
  if (shared && o.federation.back_accumulate > 1)
    std::printf("split-federated: %u edge steps summed into one update of the back shard, %s\n",
                o.federation.back_accumulate,
                o.federation.batch_edges ? cat("run together: micro-batches handed in within ",
                                               o.federation.batch_gather_s * 1000.0, " ms of each other are one batch").c_str()
                                         : "in turns");
  if (tokens)
    std::printf("edges without a client certificate are taken with an enrolment token (tandem-cloud pki token)%s\n",
                o.web_root.empty() ? "" : cat("; web page: https://", o.host, ":", endpoint->port(), "/").c_str());
  std::printf("limits: %zu connections, %zu without Hello, %d s for the TLS handshake and %d s for the Hello, %zu MiB "
              "queued a session; TLS on %zu I/O thread%s\n",
              o.max_connections, o.max_pending_hello, o.handshake_timeout_s, o.hello_timeout_s, o.max_queued_bytes >> 20,
              endpoint->io_threads(), endpoint->io_threads() == 1 ? "" : "s");

  // The sessions' memory, by their estimates at Hello: --session-memory-mb, or on cuda the
  // GPU's budget (whose buffers hold the shards' tensors).
  SessionMemory memory(o.session_memory_bytes != 0 ? o.session_memory_bytes
                       : o.backend == "cuda"       ? gpu_memory_use().budget
                                                   : 0);
  if (!shared) {
    std::size_t largest = 0;
    for (const BackShard& sh : shards) largest = std::max(largest, sh.session_bytes);
    std::printf("sessions' memory: about %lld MiB a session's back shard (at batch %u%s); %s\n", mib_up(largest),
                o.batch_size, shards.size() > 1 ? ", the largest cut's" : "",
                memory.limit() ? cat("at most ", mib_up(memory.limit()),
                                     " MiB for all together, estimated at Hello: beyond, Busy").c_str()
                               : "no bound (--session-memory-mb)");
  }

  FolderCheckpoints checkpoints(o.state_dir + "/checkpoints");
  StageNames stage_names;
  ServiceMetrics metrics;
  std::map<uint64_t, std::unique_ptr<Worker>> workers;
  std::mutex workers_mutex;  // the loop changes `workers`; a scrape reads them
  std::unique_ptr<HttpListener> http;
  if (o.metrics_port >= 0) {
    http = HttpListener::listen(o.metrics_host, o.metrics_port, [&](const std::string& path) -> HttpResponse {
      if (path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
      if (path != "/metrics") return {404, "text/plain; charset=utf-8", "not found: try /metrics or /healthz\n"};
      return {200, "text/plain; version=0.0.4; charset=utf-8", metrics.prometheus_text([&] {
                ServiceMetrics::Gauges g;
                {
                  std::lock_guard<std::mutex> lock(workers_mutex);
                  g.sessions_open = workers.size();
                  for (auto& [id, w] : workers) {
                    g.sessions_without_hello += w->greeted() ? 0 : 1;
                    const auto [messages, bytes] = w->inbox();
                    g.inbox_messages += messages;
                    g.inbox_bytes += bytes;
                  }
                }
                g.transport_queue = endpoint->queued_events();
                g.federation_round = shared ? shared->federation->round() : 0;
                if (shared) {
                  const auto batches = shared->trainer->batch_stats();
                  g.shard_batches = batches.batches;
                  g.shard_batched_microbatches = batches.microbatches;
                }
                if (shared && shared->replicas) {
                  const ReplicaSync::Totals t = shared->replicas->totals();
                  g.replica = true;
                  g.replica_epoch = t.epoch;
                  g.replica_members = t.members;
                  g.replica_rank = static_cast<uint64_t>(t.rank);
                  g.replica_collectives = t.collectives;
                  g.replica_bytes = t.bytes;
                  g.replica_seconds = t.seconds;
                  g.replica_reforms = t.membership.reforms;
                  g.replica_dropped = t.membership.dropped;
                  g.replica_joined = t.membership.joined;
                }
                g.refused_max_connections = endpoint->refused_connections();
                g.closed_queue_overflow = endpoint->overflowed_connections();
                if (o.backend == "cuda") g.gpu = gpu_memory_use();
                g.session_memory_used = memory.used();
                g.session_memory_limit = memory.limit();
                return g;
              })};
    });
    std::printf("metrics for Prometheus: http://%s:%d/metrics (health: /healthz)\n", o.metrics_host.c_str(),
                http->port());
  }
  std::fflush(stdout);

  // Turns a connection away before it has a session: its last word is an Error saying why.
  auto refuse = [&](uint64_t connection, wire::ErrorCode code, const std::string& reason, const std::string& why) {
    metrics.count_refusal(reason);
    metrics.count_error(wire::EnumNameErrorCode(code));
    std::fprintf(stderr, "connection %llu: refused: %s\n", static_cast<unsigned long long>(connection), why.c_str());
    MessageWriter writer;
    endpoint->send(connection, writer.error(code, why), /*close_after=*/true);
  };
  auto last_check = std::chrono::steady_clock::now();
  uint64_t revocations_seen = revoked.generation();
  while (!g_stop) {
    EndpointEvent ev;
    if (shared) shared->federation->tick();
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check >= std::chrono::milliseconds(500)) {
      last_check = now;
      // A `pki revoke` while we run: the revoked identities' sessions end now.
      revoked.reload_if_changed();
      const bool changed = revoked.generation() != revocations_seen;
      revocations_seen = revoked.generation();
      std::lock_guard<std::mutex> lock(workers_mutex);
      for (auto& [id, w] : workers) {
        if (changed)
          if (const std::string why = w->revoked_by(revoked); !why.empty()) {
            metrics.count_refusal("revoked");
            w->close_with(wire::ErrorCode::Unauthorized, why);
            continue;
          }
        if (!w->greeted() && now - w->connected_at() > std::chrono::seconds(o.hello_timeout_s)) {
          metrics.count_refusal("hello_timeout");
          w->close_with(wire::ErrorCode::Unauthorized,
                        cat("no Hello within ", o.hello_timeout_s, " s of connecting: a connection must say who it is"));
        }
      }
    }
    if (!endpoint->next(ev, std::chrono::milliseconds(100))) continue;
    switch (ev.kind) {
      case EndpointEvent::Kind::Connected: {
        if (!ev.text.empty())
          if (const std::string why = revoked.refuses_certificate(ev.text, ev.serial); !why.empty()) {
            refuse(ev.connection, wire::ErrorCode::Unauthorized, "revoked", why);
            break;
          }
        std::lock_guard<std::mutex> lock(workers_mutex);
        const auto pending = std::count_if(workers.begin(), workers.end(), [](auto& w) { return !w.second->greeted(); });
        if (static_cast<std::size_t>(pending) >= o.max_pending_hello) {
          refuse(ev.connection, wire::ErrorCode::Busy, "pending_hello",
                 cat(pending, " connections have not said Hello yet, the most this cloud waits for: try again later"));
          break;
        }
        std::printf("session %llu: edge '%s' connected\n", static_cast<unsigned long long>(ev.connection),
                    ev.text.c_str());
        ++metrics.sessions_opened;
        workers[ev.connection] = std::make_unique<Worker>(ev.connection, ev.text, ev.serial, shards, o, *endpoint,
                                                          checkpoints, shared.get(), tokens.get(), metrics, memory,
                                                          stage_names);
        break;
      }
      case EndpointEvent::Kind::Message: {
        std::lock_guard<std::mutex> lock(workers_mutex);
        if (auto it = workers.find(ev.connection); it != workers.end()) {
          const std::size_t size = ev.frame.size();
          if (!it->second->push(std::move(ev.frame))) {
            metrics.count_refusal("queue_overflow");
            it->second->close_with(wire::ErrorCode::Busy,
                                   cat("this session has more than ", o.max_queued_bytes, " bytes waiting (a message of ",
                                       size, " more arrived): an edge must not send past its window"));
          }
        }
        break;
      }
      case EndpointEvent::Kind::Closed: {
        std::unique_ptr<Worker> gone;
        {
          std::lock_guard<std::mutex> lock(workers_mutex);
          if (auto it = workers.find(ev.connection); it != workers.end()) {
            gone = std::move(it->second);
            workers.erase(it);
          }
        }
        if (gone) {
          ++metrics.sessions_closed;
          const std::string summary = gone->summary();
          write_metrics(gone->metrics_line());
          gone.reset();
          std::printf("%s; closed\n", summary.c_str());
        }
        break;
      }
    }
    std::fflush(stdout);
  }
  http.reset();
  workers.clear();
  std::printf("tandem-cloud: stopped\n");
  return 0;
}

}  // namespace tandem
