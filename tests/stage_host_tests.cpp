// The stage host (pipeline/stage_host.h): one process serving the last stage to several
// first parties at once, each its own pipeline and weights, on one executor thread. Each
// first party runs on a thread of its own with blocking links, as tandem-edge does; the
// "transport" here carries bytes between them and the host. Every session trains as its
// whole model trained alone would; a link lost mid-run starts that session again from its
// checkpoint while the others go on; a stranger and a malformed message are refused with
// their exact Errors.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/checkpoint/checkpoint.h"
#include "core/microbatch.h"
#include "core/model_spec.h"
#include "core/optimizer.h"
#include "pipeline/stage_host.h"
#include "test_support.h"

namespace tandem::test {
namespace {

OptimizerOptions sgd() { return {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f}; }

struct OwnStage final : HostedStage {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Network> net;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Stage> stage_;
  OwnStage(const Graph& g, Network& init) {
    backend = make_test_backend(backend_under_test());
    net = std::make_unique<Network>(g, *backend, 0);
    copy_params(*net, init);
    opt = make_optimizer(net->params(), sgd());
    stage_ = std::make_unique<Stage>(*net, opt.get());
  }
  Stage& stage() override { return *stage_; }
};

// A first party's end of its connection to the host: what the host sends arrives in `inbox`.
class ClientLink final : public StageLink {
 public:
  ClientLink(StageHost*& host, uint64_t connection) : host_(host), connection_(connection) {}
  void send(std::span<const uint8_t> bytes) override {
    if (!gone_) host_->received(connection_, Frame::copy_of(bytes.data(), bytes.size()));
  }
  Frame receive(const char* awaiting) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return !inbox_.empty() || closed_; }))
      throw LinkLost(cat("no ", awaiting, " within 30 s"));
    if (inbox_.empty()) throw LinkLost(cat("the host closed the link while awaiting ", awaiting));
    std::vector<uint8_t> b = std::move(inbox_.front());
    inbox_.pop_front();
    Frame f = Frame::copy_of(b.data(), b.size());
    WireError e;
    const wire::Message* m = verify_frame(f, f.size(), e);
    taken_bye_ = taken_bye_ || (m && m->payload_type() == wire::Payload::Bye);
    return f;
  }
  void refuse(const WireError& error) override {
    refused = error;
    drop();
  }
  // The host's side: a message for this party, then maybe the end of the link.
  void from_host(std::span<const uint8_t> bytes, bool close) {
    std::lock_guard lock(mu_);
    inbox_.emplace_back(bytes.begin(), bytes.end());
    if (close) closed_ = true;
    cv_.notify_all();
  }
  // The connection drops (this party's machine lost its network): the host hears it closed.
  void drop() {
    if (gone_.exchange(true)) return;
    host_->closed(connection_, "the connection dropped");
  }
  // The last message the host sent, decoded: its Error's text ("" if it was none).
  std::string last_error() {
    std::lock_guard lock(mu_);
    if (inbox_.empty()) return "";
    const Frame f = Frame::copy_of(inbox_.back().data(), inbox_.back().size());
    WireError e;
    const wire::Message* m = verify_frame(f, f.size(), e);
    const wire::Error* err = m ? m->payload_as_Error() : nullptr;
    return err && err->text() ? err->text()->str() : "";
  }
  bool closed() {
    std::lock_guard lock(mu_);
    return closed_;
  }
  // Whether the host has sent this party a Bye (waiting in the inbox, or taken).
  bool heard_bye() {
    std::lock_guard lock(mu_);
    for (const auto& b : inbox_) {
      const Frame f = Frame::copy_of(b.data(), b.size());
      WireError e;
      const wire::Message* m = verify_frame(f, f.size(), e);
      if (m && m->payload_type() == wire::Payload::Bye) return true;
    }
    return taken_bye_;
  }
  WireError refused;

 private:
  StageHost*& host_;
  uint64_t connection_;
  std::atomic<bool> gone_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> inbox_;
  bool closed_ = false;
  bool taken_bye_ = false;
};

struct Fixture {
  ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  Graph graph = Graph::build(spec);
  std::string cut = "fc1";
  std::vector<Graph> parts = graph.partition(cut_list(cut));
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network init{graph, *backend, 17};
  // Zero-bubble: the weight gradients a session defers yield to the other sessions' messages.
  std::unique_ptr<PipelineSchedule> schedule = make_pipeline_schedule("zero-bubble");
  const uint32_t batch = 8, k = 4;
  StagePlan plan(std::size_t index) const {
    return make_stage_plan(spec.binary, graph, cut, parts, index, *schedule, batch, k);
  }
  // Each party's data: its own rows (a seed a party).
  struct Data {
    Tensor x;
    std::vector<int32_t> y;
  };
  Data data(uint64_t seed, int steps) const {
    Rng rng(seed);
    Data d{random_tensor(Shape{int64_t{batch} * steps, 28, 28, 1}, rng, 0.0f, 1.0f), {}};
    for (int i = 0; i < static_cast<int>(batch) * steps; ++i) d.y.push_back(static_cast<int32_t>(rng.below(10)));
    return d;
  }
  // The whole model trained alone on `d` for `steps` steps, micro-batched as the pipeline is.
  std::unique_ptr<OwnStage> whole_trained(const Data& d, int steps) {
    auto whole = std::make_unique<OwnStage>(graph, init);
    for (int step = 0; step < steps; ++step) {
      whole->net->zero_grad();
      for (uint32_t mb = 0; mb < k; ++mb) {
        const auto [begin, count] = microbatch_range(batch, k, mb);
        const Tensor in = d.x.slice_batch(int64_t{step} * batch + begin, count);
        (void)whole->stage_->train_loss(std::span<const Tensor>(&in, 1), 0, d.y.data() + step * batch + begin,
                                        1.0f / static_cast<float>(batch), false);
      }
      whole->stage_->step();
    }
    return whole;
  }
};

// A first party's run against the host: connect, `steps` steps (from `from`), its end unless
// `stop_after` steps came first (then its connection drops and the run stops there).
void first_party(Fixture& f, ClientLink& link, OwnStage& front, const Fixture::Data& d, int steps,
                 int stop_after = -1) {
  StagePeer peer(front.stage(), *f.schedule, f.plan(0), nullptr, &link);
  EXPECT_EQ(peer.connect({}), 0u);
  for (int step = 0; step < steps; ++step) {
    if (step == stop_after) {
      link.drop();
      return;
    }
    const Tensor rows = d.x.slice_batch(int64_t{step} * f.batch, f.batch);
    (void)peer.train_step({static_cast<uint64_t>(step), f.batch, f.k, 1.0f, false}, std::span<const Tensor>(&rows, 1),
                          d.y.data() + step * f.batch);
  }
  peer.finish("done");
}

TEST(StageHost, ThreeFirstPartiesTrainTheirOwnModelsOnTwoExecutorsAsEachWouldAlone) {
  Fixture f;
  const int steps = 6;
  const std::vector<std::string> names = {"hospital-a", "hospital-b", "hospital-c", "hospital-d"};
  // Each session's checkpoint of step 0 (the stage as made), kept by the host's hooks.
  std::mutex ck_mu;
  std::map<std::string, std::vector<uint8_t>> step0;
  std::map<std::string, std::string> ended;  // the last end of each session
  std::map<std::string, OwnStage*> backs;    // each session's stage, once its run ended
  StageHost* host_ptr = nullptr;
  std::map<uint64_t, ClientLink*> clients;
  std::mutex clients_mu;
  StageHostHooks hooks;
  hooks.make = [&](const std::string& id, std::size_t) {
    auto s = std::make_unique<OwnStage>(f.parts[1], f.init);
    std::lock_guard lock(ck_mu);
    step0[id] = encode_checkpoint(CheckpointMeta{}, *s->net, s->opt.get());
    return s;
  };
  hooks.restore = [&](const std::string& id, uint64_t step, HostedStage& s) {
    ASSERT_EQ(step, 0u);
    auto& own = static_cast<OwnStage&>(s);
    std::lock_guard lock(ck_mu);
    restore_checkpoint(decode_checkpoint(step0.at(id)), *own.net, own.opt.get());
  };
  hooks.ended = [&](const std::string& id, const std::string& error, HostedStage& stage, uint64_t) {
    std::lock_guard lock(ck_mu);
    ended[id] = error;
    backs[id] = static_cast<OwnStage*>(&stage);
  };
  StageHostOptions options{f.schedule.get(), f.plan(1), names, 8, 2};  // two executors
  StageHost host(options, hooks, [&](uint64_t connection, std::span<const uint8_t> bytes, bool close) {
    std::lock_guard lock(clients_mu);
    clients.at(connection)->from_host(bytes, close);
  });
  host_ptr = &host;
  std::vector<std::unique_ptr<ClientLink>> links;
  const auto connect = [&](const std::string& id) {
    std::lock_guard lock(clients_mu);
    const uint64_t connection = links.size() + 1;
    links.push_back(std::make_unique<ClientLink>(host_ptr, connection));
    clients[connection] = links.back().get();
    host.connected(connection, id);
    return links.back().get();
  };

  // A stranger is refused by name, and so is a malformed first message from a named party.
  ClientLink* stranger = connect("mallory");
  ClientLink* broken = connect("hospital-d");
  const std::vector<uint8_t> junk = {1, 2, 3, 4, 5, 6, 7, 8};
  broken->send(junk);

  const Fixture::Data da = f.data(1, steps), db = f.data(2, steps), dc = f.data(3, steps);
  OwnStage fa(f.parts[0], f.init), fb(f.parts[0], f.init), fc_lost(f.parts[0], f.init), fc(f.parts[0], f.init);
  ClientLink* la = connect("hospital-a");
  ClientLink* lb = connect("hospital-b");
  ClientLink* lc = connect("hospital-c");
  std::thread ta([&] { first_party(f, *la, fa, da, steps); });
  std::thread tb([&] { first_party(f, *lb, fb, db, steps); });
  // hospital-c's connection drops after 3 steps; it starts its run again from step 0 (a new
  // process without checkpoints) on a new connection, while a and b train on.
  std::thread tc([&] {
    first_party(f, *lc, fc_lost, dc, steps, 3);
    ClientLink* again = connect("hospital-c");
    first_party(f, *again, fc, dc, steps);
  });
  ta.join();
  tb.join();
  tc.join();
  {  // each run's end was recorded before its first party heard Bye back
    std::lock_guard lock(ck_mu);
    for (const char* id : {"hospital-a", "hospital-b", "hospital-c"}) {
      ASSERT_EQ(ended.count(id), 1u) << id;
      EXPECT_EQ(ended.at(id), "") << id;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::vector<StageHost::SessionState> states;
  for (;;) {
    states = host.sessions();
    int done = 0;
    for (const auto& s : states) done += s.finished ? 1 : 0;
    if (done == 3 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  EXPECT_EQ(stranger->last_error(), "this stage serves the first parties it was given; 'mallory' is not one of them");
  EXPECT_TRUE(stranger->closed());
  EXPECT_EQ(broken->last_error(), "not a tandem wire message (missing identifier 'TDMW')");
  EXPECT_TRUE(broken->closed());
  std::map<std::string, StageHost::SessionState> by_name;
  for (const auto& s : states) by_name[s.identity] = s;
  ASSERT_EQ(by_name.size(), 4u);
  for (const char* id : {"hospital-a", "hospital-b", "hospital-c"}) {
    SCOPED_TRACE(id);
    EXPECT_TRUE(by_name[id].finished);
    EXPECT_EQ(by_name[id].steps, static_cast<uint64_t>(steps));
    EXPECT_GT(by_name[id].busy_s, 0.0);
    EXPECT_EQ(ended[id], "");
  }
  EXPECT_EQ(by_name["hospital-a"].runs, 1u);
  EXPECT_EQ(by_name["hospital-c"].runs, 2u);
  EXPECT_FALSE(by_name["hospital-d"].finished);
  EXPECT_EQ(ended["hospital-d"],
            "[stage] stage 1 refused the previous stage's message: not a tandem wire message (missing identifier "
            "'TDMW')");
  EXPECT_FALSE(host.all_finished()) << "hospital-d never finished its run";

  // Each session's weights, front and back, are its whole model's trained alone.
  const std::vector<std::pair<OwnStage*, const Fixture::Data*>> runs = {{&fa, &da}, {&fb, &db}, {&fc, &dc}};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(names[i]);
    std::unique_ptr<OwnStage> whole = f.whole_trained(*runs[i].second, steps);
    EXPECT_LE(max_diff(*runs[i].first->net, *whole->net), 1e-5f);
    ASSERT_NE(backs[names[i]], nullptr);
    EXPECT_LE(max_diff(*backs[names[i]]->net, *whole->net), 1e-5f);
    EXPECT_GT(max_diff(*runs[i].first->net, f.init), 1e-3f) << "the weights moved";
    EXPECT_GT(max_diff(*backs[names[i]]->net, f.init), 1e-3f) << "the weights moved";
  }
  EXPECT_GT(max_diff(*fa.net, *fb.net), 1e-3f) << "two parties' models are their own";
  const std::vector<double> busy = host.executor_busy_s();  // the sessions spread over both executors
  ASSERT_EQ(busy.size(), 2u);
  EXPECT_GT(busy[0], 0.0);
  EXPECT_GT(busy[1], 0.0);
}

}  // namespace
}  // namespace tandem::test

namespace tandem::test {
namespace {

// Beyond max_sessions a first party is refused Busy (a party whose session could not be made
// holds no slot); a host is only for the last stage of two-party plans; a party that links
// again while its run goes on replaces the stale link.
TEST(StageHost, RefusesBeyondItsSessionsAndServesTheNewestLinkOfAParty) {
  Fixture f;
  EXPECT_EQ(error_of([&] { StageHost bad({f.schedule.get(), f.plan(0), {"a"}, 1, 1}, {}, {}); }),
            "[stage] a stage host serves the last stage of pipelines with one first party each; stage 0 of 2 (1 first "
            "parties) is not one");
  std::mutex mu;
  std::map<uint64_t, std::vector<std::vector<uint8_t>>> sent;
  std::map<uint64_t, bool> closed;
  StageHostHooks hooks;
  hooks.make = [&](const std::string& id, std::size_t) {
    if (id == "c") fail("test", "no memory for c's stage");
    return std::make_unique<OwnStage>(f.parts[1], f.init);
  };
  StageHost host({f.schedule.get(), f.plan(1), {"a", "b", "c"}, 1, 1}, hooks,
                 [&](uint64_t c, std::span<const uint8_t> b, bool close) {
                   std::lock_guard lock(mu);
                   sent[c].emplace_back(b.begin(), b.end());
                   closed[c] = closed[c] || close;
                 });
  const auto error_sent = [&](uint64_t c) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lock(mu);
        if (closed[c] && !sent[c].empty()) {
          const Frame fr = Frame::copy_of(sent[c].back().data(), sent[c].back().size());
          WireError e;
          const wire::Message* m = verify_frame(fr, fr.size(), e);
          const wire::Error* err = m ? m->payload_as_Error() : nullptr;
          return err && err->text() ? err->text()->str() : std::string("(not an Error)");
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::string("(nothing sent)");
  };
  // A session that could not be made holds no slot: the next party takes it.
  host.connected(4, "c");
  EXPECT_EQ(error_sent(4), "this stage could not make the session's stage: [test] no memory for c's stage");
  host.connected(1, "a");
  host.connected(2, "b");
  EXPECT_EQ(error_sent(2), "this stage serves 1 sessions at once: try again later");
  host.connected(3, "a");  // a's process started again: its first link is stale
  EXPECT_EQ(error_sent(1), "'a' linked again: this link is replaced");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (host.sessions().empty() || host.sessions()[0].runs < 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto s = host.sessions();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(s[0].linked);
  EXPECT_EQ(s[0].runs, 2u);
  std::lock_guard lock(mu);
  EXPECT_FALSE(closed[3]);
}


// A run's end that the host cannot record (its `ended` hook throws: a full disk) is not
// answered with Bye: the first party is told to link again, trains from its newest checkpoint
// (here step 0) and ends again, and the second end, recorded, is answered.
TEST(StageHost, AnEndThatCannotBeRecordedHasTheFirstPartyTrainItsLastStepsAgain) {
  Fixture f;
  const int steps = 2;
  std::mutex mu;
  std::vector<std::string> ends;  // each end the host saw: "" when recorded, else why not
  int refusals = 1;
  ClientLink* watched = nullptr;  // the party whose end the hook records
  StageHostHooks hooks;
  hooks.make = [&](const std::string&, std::size_t) { return std::make_unique<OwnStage>(f.parts[1], f.init); };
  hooks.restore = [&](const std::string&, uint64_t step, HostedStage&) { EXPECT_EQ(step, 0u); };
  hooks.ended = [&](const std::string&, const std::string& error, HostedStage&, uint64_t) {
    std::lock_guard lock(mu);
    if (error.empty() && refusals > 0) {
      --refusals;
      fail("test", "no room left to write the export");
    }
    if (error.empty()) {
      EXPECT_FALSE(watched->heard_bye()) << "the party heard Bye before its end was recorded";
    }
    ends.push_back(error);
  };
  StageHost* host_ptr = nullptr;
  std::map<uint64_t, ClientLink*> clients;
  std::mutex clients_mu;
  StageHost host({f.schedule.get(), f.plan(1), {"a"}, 8, 1}, hooks,
                 [&](uint64_t connection, std::span<const uint8_t> bytes, bool close) {
                   std::lock_guard lock(clients_mu);
                   clients.at(connection)->from_host(bytes, close);
                 });
  host_ptr = &host;
  std::vector<std::unique_ptr<ClientLink>> links;
  const auto connect = [&] {
    std::lock_guard lock(clients_mu);
    links.push_back(std::make_unique<ClientLink>(host_ptr, links.size() + 1));
    clients[links.size()] = links.back().get();
    host.connected(links.size(), "a");
    return links.back().get();
  };
  const Fixture::Data d = f.data(1, steps);
  OwnStage front(f.parts[0], f.init);
  ClientLink* first = connect();
  EXPECT_EQ(error_of([&] { first_party(f, *first, front, d, steps); }),
            "[stage] the next stage starts again from the newest checkpoint: link again to go on from the newest "
            "checkpoint: [test] no room left to write the export");
  OwnStage again(f.parts[0], f.init);  // a party without checkpoints starts again from step 0
  ClientLink* second = connect();
  watched = second;
  first_party(f, *second, again, d, steps);
  EXPECT_TRUE(second->heard_bye());
  {
    std::lock_guard lock(mu);  // recorded before the Bye came back
    ASSERT_EQ(ends.size(), 2u);
    EXPECT_EQ(ends[0], "[test] no room left to write the export");
    EXPECT_EQ(ends[1], "");
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!host.sessions().at(0).finished) {  // the host settles the session after its Bye is out
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(host.sessions().at(0).runs, 2u);
  // It links again after its end (a process started again with its end record): the host
  // answers its StageHello with Bye, and nothing is trained or recorded.
  OwnStage late(f.parts[0], f.init);
  ClientLink* third = connect();
  StagePeer peer(late.stage(), *f.schedule, f.plan(0), nullptr, third);
  peer.set_ended(steps, true);
  EXPECT_EQ(peer.connect({}), static_cast<uint64_t>(steps));
  EXPECT_TRUE(peer.ended());
  std::lock_guard lock(mu);
  EXPECT_EQ(ends.size(), 2u);
}

}  // namespace
}  // namespace tandem::test
