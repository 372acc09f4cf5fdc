// The stage peer (pipeline/stage_peer.h), the protocol of one stage of a pipeline across
// parties, over in-memory links that carry the encoded messages: N peers on N threads train
// like the whole model under every synchronous schedule, the mask travelling down the chain,
// and like the in-process pipeline under the asynchronous one;
// and a stage refuses what a neighbour sends wrong, with the exact Error on the link.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/microbatch.h"
#include "core/model_spec.h"
#include "core/optimizer.h"
#include "core/privacy/nopeek.h"
#include "pipeline/event_link.h"
#include "pipeline/stage_peer.h"
#include "memory_link.h"
#include "test_support.h"

namespace tandem::test {
extern const char* const kTinyEncoderSpec;  // pipeline_tests.cpp
namespace {

// What stage `stage` of `stages` of `plan`, run under `schedule`, says in its StageHello
// (proposing `step`; a first party's member and epoch steps); the answer of a stage after says
// the same dtype, the one it chose.
StageHelloFields said(const StagePlan& plan, const PipelineSchedule& schedule, uint32_t stage, uint32_t stages,
                      uint64_t step, uint32_t member = 0, uint64_t epoch_steps = 0) {
  StageHelloFields f = stage_hello_fields(plan, schedule.name(), step, epoch_steps);
  f.stage = stage;
  f.stages = stages;
  f.member = member;
  return f;
}

struct PeerStage {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Network> net;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Stage> stage;
};

OptimizerOptions sgd() { return {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f}; }

PeerStage make_stage(const Graph& g, Network& whole) {
  PeerStage s;
  s.backend = make_test_backend(backend_under_test());
  s.net = std::make_unique<Network>(g, *s.backend, 0);
  copy_params(*s.net, whole);
  s.opt = make_optimizer(s.net->params(), sgd());
  s.stage = std::make_unique<Stage>(*s.net, s.opt.get());
  return s;
}

// A chain of peers, one a stage of `parts`, joined by in-memory links.
struct PeerChain {
  std::vector<PeerStage> stages;
  std::vector<std::unique_ptr<MemoryLink>> ups, downs;
  std::vector<std::unique_ptr<StagePeer>> peers;
  PeerChain(const ModelSpec& spec, const Graph& graph, const std::string& cuts, const std::vector<Graph>& parts,
            Network& init, const PipelineSchedule& schedule, uint32_t batch, uint32_t k)
      : ups(parts.size()), downs(parts.size()) {
    for (const Graph& g : parts) stages.push_back(make_stage(g, init));
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) std::tie(downs[i], ups[i + 1]) = MemoryLink::pair();
    for (std::size_t i = 0; i < parts.size(); ++i)
      peers.push_back(std::make_unique<StagePeer>(*stages[i].stage, schedule,
                                                  make_stage_plan(spec.binary, graph, cuts, parts, i, schedule, batch, k),
                                                  ups[i].get(), downs[i].get()));
  }
  // Every peer on its own thread, linked (from step 0): the first runs `lead`, the others
  // follow until the run ends (`follow` after each step or evaluation batch). A peer's Error
  // closes its links, so the others end too, and is reported as a failure naming its stage.
  void run(const std::function<void(StagePeer&)>& lead, const std::function<void(std::size_t, StagePeer&)>& follow = {}) {
    std::vector<std::exception_ptr> errors(peers.size());
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < peers.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          StagePeer& peer = *peers[i];
          EXPECT_EQ(peer.connect({}), 0u);
          if (i == 0) {
            lead(peer);
            return;
          }
          StepStats s;
          while (peer.follow_step(s))
            if (follow) follow(i, peer);
        } catch (...) {
          errors[i] = std::current_exception();
          if (ups[i]) ups[i]->close();
          if (downs[i]) downs[i]->close();
        }
      });
    for (std::thread& t : threads) t.join();
    for (std::size_t i = 0; i < peers.size(); ++i)
      if (errors[i]) ADD_FAILURE() << "stage " << i << ": " << error_of([&] { std::rethrow_exception(errors[i]); });
  }
};

// The same chain on one thread, driven by events as a browser's event loop or a server's
// executor drives it: each peer runs as a task (pipeline/task.h) over event links
// (pipeline/event_link.h), and what a peer sends is delivered to its neighbour's link from one
// queue, in the order sent, by the loop in run(); a delivery resumes the task waiting for it.
struct EventChain {
  struct Delivery {
    EventLink* to;
    std::vector<uint8_t> bytes;
    bool lost = false;  // the link closed instead (a refusal)
  };
  std::vector<PeerStage> stages;
  std::deque<Delivery> on_the_way;
  std::vector<std::unique_ptr<EventLink>> ups, downs;
  std::vector<std::unique_ptr<StagePeer>> peers;
  std::size_t delivered = 0, resumed = 0;  // deliveries, and those a waiting task took at once
  EventChain(const ModelSpec& spec, const Graph& graph, const std::string& cuts, const std::vector<Graph>& parts,
             Network& init, const PipelineSchedule& schedule, uint32_t batch, uint32_t k)
      : ups(parts.size()), downs(parts.size()) {
    for (const Graph& g : parts) stages.push_back(make_stage(g, init));
    const auto host = [this](std::unique_ptr<EventLink>* to) {
      const auto send = [this, to](std::span<const uint8_t> b) { on_the_way.push_back({to->get(), {b.begin(), b.end()}}); };
      return EventLink::Host{send, send, [this, to](const WireError&) { on_the_way.push_back({to->get(), {}, true}); },
                             {}};
    };
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      downs[i] = std::make_unique<EventLink>(host(&ups[i + 1]));
      ups[i + 1] = std::make_unique<EventLink>(host(&downs[i]));
    }
    for (std::size_t i = 0; i < parts.size(); ++i)
      peers.push_back(std::make_unique<StagePeer>(*stages[i].stage, schedule,
                                                  make_stage_plan(spec.binary, graph, cuts, parts, i, schedule, batch, k),
                                                  ups[i].get(), downs[i].get()));
  }
  static Task<> follow_run(StagePeer& peer, std::size_t i, const std::function<void(std::size_t, StagePeer&)>& follow) {
    const uint64_t start = co_await peer.connect_async({});
    EXPECT_EQ(start, 0u);
    StepStats s;
    for (;;) {
      const bool more = co_await peer.follow_step_async(s);
      if (!more) break;
      if (follow) follow(i, peer);
    }
  }
  // Every peer's task started, then the messages delivered one at a time until none is on
  // its way: every task must have ended then, and one that ended in an Error is a failure
  // naming its stage.
  void run(const std::function<Task<>(StagePeer&)>& lead, const std::function<void(std::size_t, StagePeer&)>& follow) {
    std::vector<Task<>> tasks;
    tasks.push_back(lead(*peers[0]));
    for (std::size_t i = 1; i < peers.size(); ++i) tasks.push_back(follow_run(*peers[i], i, follow));
    for (Task<>& t : tasks) t.start();
    while (!on_the_way.empty()) {
      Delivery d = std::move(on_the_way.front());
      on_the_way.pop_front();
      resumed += d.to->waiting() ? 1 : 0;
      if (d.lost) d.to->lose("refused by the neighbour");
      else d.to->deliver(Frame::copy_of(d.bytes.data(), d.bytes.size()));
      ++delivered;
    }
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      if (!tasks[i].done()) {
        ADD_FAILURE() << "stage " << i << " still waits with nothing on its way";
        continue;
      }
      const std::string error = error_of([&] { tasks[i].result(); });
      if (error != "(no error)") ADD_FAILURE() << "stage " << i << ": " << error;
    }
  }
};

// What the first stage trains and evaluates, and what the loss stage reported back.
struct Lead {
  int steps = 0;
  int64_t batch = 0;
  uint32_t k = 0;
  std::function<std::vector<Tensor>(int)> rows_of;
  std::function<const int32_t*(int)> labels_of;
  std::vector<double> losses;
  std::vector<StepStats> evals;
};

// The first stage's run: `steps` steps, two evaluation batches, the end.
Task<> lead_run(StagePeer& peer, Lead& lead) {
  for (int step = 0; step < lead.steps; ++step) {
    const std::vector<Tensor> rows = lead.rows_of(step);
    const StepHeader h{static_cast<uint64_t>(step), static_cast<uint32_t>(lead.batch), lead.k, 1.0f, false};
    const StepStats s = co_await peer.train_step_async(h, rows, lead.labels_of(step));
    lead.losses.push_back(s.loss_sum);
  }
  for (int b = 0; b < 2; ++b) {
    const std::vector<Tensor> rows = lead.rows_of(b);
    const StepStats s = co_await peer.evaluate_async(rows, lead.labels_of(b), static_cast<uint64_t>(b * lead.batch));
    lead.evals.push_back(s);
  }
  co_await peer.finish_async("done");
}

Task<> connect_and_lead(StagePeer& peer, Lead& lead) {
  const uint64_t start = co_await peer.connect_async({});
  EXPECT_EQ(start, 0u);
  co_await lead_run(peer, lead);
}

enum class Drive { Threads, Events };

// `steps` steps of the data (rows taken round robin) through a pipeline of peers cut at
// `cuts`, a thread each (or all on one thread, driven by events), against the whole model
// trained in one piece.
void expect_peers_train_like_the_whole_model(const ModelSpec& spec, const std::string& cuts, int steps, int64_t batch,
                                             uint32_t k, const std::vector<Tensor>& inputs,
                                             const std::vector<int32_t>& labels, Drive drive = Drive::Threads) {
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition(cut_list(cuts));
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network init(graph, *backend, 11);
  PeerStage whole = make_stage(graph, init);
  const int64_t n = inputs[0].shape()[0];
  auto rows_of = [&](int step) {
    std::vector<Tensor> out;
    for (const Tensor& t : inputs) out.push_back(t.slice_batch((step * batch) % n, batch));
    return out;
  };
  auto labels_of = [&](int step) { return labels.data() + (step * batch) % n; };
  std::vector<double> whole_loss;
  for (int step = 0; step < steps; ++step) {
    const std::vector<Tensor> x = rows_of(step);
    whole.net->zero_grad();
    double loss = 0;
    for (uint32_t mb = 0; mb < k; ++mb) {
      const auto [begin, count] = microbatch_range(batch, k, mb);
      std::vector<Tensor> in;
      for (const Tensor& t : x) in.push_back(t.slice_batch(begin, count));
      loss += whole.stage->train_loss(in, 0, labels_of(step) + begin, 1.0f / static_cast<float>(batch), false).loss;
    }
    whole.stage->step();
    whole_loss.push_back(loss);
  }
  // Then two batches of evaluation on the trained weights, micro-batched as a step is.
  const auto evaluate_whole = [&](int batch_index) {
    const std::vector<Tensor> x = rows_of(batch_index);
    StepStats st;
    for (uint32_t mb = 0; mb < k; ++mb) {
      const auto [begin, count] = microbatch_range(batch, k, mb);
      std::vector<Tensor> in;
      for (const Tensor& t : x) in.push_back(t.slice_batch(begin, count));
      const Tensor& out = whole.stage->evaluate(in, 0);
      st.loss_sum += whole.stage->loss(out, labels_of(batch_index) + begin, 1.0f, nullptr);
      st.correct += static_cast<uint64_t>(whole.stage->correct(out, labels_of(batch_index) + begin));
    }
    return st;
  };
  const StepStats whole_eval[2] = {evaluate_whole(0), evaluate_whole(1)};
  for (const char* name : {"gpipe", "1f1b", "zero-bubble"}) {
    SCOPED_TRACE(name);
    const auto schedule = make_pipeline_schedule(name);
    Lead lead{steps, batch, k, rows_of, labels_of, {}, {}};
    std::vector<int> followed(parts.size(), 0);
    const auto count = [&](std::size_t i, StagePeer& peer) { followed[i] += peer.evaluated() ? 0 : 1; };
    PeerChain threads(spec, graph, cuts, parts, init, *schedule, static_cast<uint32_t>(batch), k);
    EventChain events(spec, graph, cuts, parts, init, *schedule, static_cast<uint32_t>(batch), k);
    if (drive == Drive::Threads) {
      threads.run(
          [&](StagePeer& peer) {  // the blocking calls, as tandem stage makes them
            for (int step = 0; step < steps; ++step)
              lead.losses.push_back(peer.train_step({static_cast<uint64_t>(step), static_cast<uint32_t>(batch), k, 1.0f,
                                                     false}, rows_of(step), labels_of(step)).loss_sum);
            for (int b = 0; b < 2; ++b)
              lead.evals.push_back(peer.evaluate(rows_of(b), labels_of(b), static_cast<uint64_t>(b * batch)));
            peer.finish("done");
          },
          count);
    } else {
      events.run([&](StagePeer& peer) { return connect_and_lead(peer, lead); }, count);
      // Every stage waited on its links and was resumed by a delivery, many times a step.
      EXPECT_GT(events.resumed, static_cast<std::size_t>(steps) * (parts.size() - 1) * k);
    }
    const std::vector<double>& losses = lead.losses;
    const std::vector<StepStats>& evals = lead.evals;
    std::vector<PeerStage>& stages = drive == Drive::Threads ? threads.stages : events.stages;
    ASSERT_EQ(losses.size(), static_cast<std::size_t>(steps));
    for (int step = 0; step < steps; ++step)
      EXPECT_NEAR(losses[static_cast<std::size_t>(step)], whole_loss[static_cast<std::size_t>(step)],
                  1e-4 * std::max(1.0, whole_loss[0]))
          << "step " << step;
    for (std::size_t i = 1; i < parts.size(); ++i) EXPECT_EQ(followed[i], steps) << "stage " << i;
    ASSERT_EQ(evals.size(), 2u);
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ(evals[b].samples, static_cast<uint64_t>(batch));
      EXPECT_EQ(evals[b].correct, whole_eval[b].correct) << "evaluation batch " << b;
      EXPECT_NEAR(evals[b].loss_sum, whole_eval[b].loss_sum, 1e-4 * std::max(1.0, whole_eval[b].loss_sum));
    }
    float worst = 0;
    for (PeerStage& s : stages) worst = std::max(worst, max_diff(*s.net, *whole.net));
    EXPECT_LE(worst, 1e-5f);
    EXPECT_GT(max_diff(*stages[0].net, init), 1e-3f) << "the weights moved";
  }
}

// 16 random mails for the tiny encoder: token ids of 2 to 6 tokens, their mask, 3 classes.
void encoder_mails(std::vector<Tensor>& inputs, std::vector<int32_t>& labels) {
  Rng rng(9);
  const int64_t n = 16;
  Tensor ids = Tensor::empty(Shape{n, 6}), mask = Tensor::empty(Shape{n, 6});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 2 + static_cast<int64_t>(rng.below(5));
    for (int64_t t = 0; t < 6; ++t) {
      ids.data()[i * 6 + t] = static_cast<float>(t < len ? 1 + rng.below(19) : 0);
      mask.data()[i * 6 + t] = t < len ? 1.0f : 0.0f;
    }
    labels.push_back(static_cast<int32_t>(rng.below(3)));
  }
  inputs = {ids, mask};
}

// The CNN cut in four, on 32 random images.
void expect_cnn_peers_train_like_the_whole_model(Drive drive) {
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  Rng rng(5);
  const int64_t n = 32;
  std::vector<Tensor> inputs{random_tensor(Shape{n, 28, 28, 1}, rng, 0.0f, 1.0f)};
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>(rng.below(10)));
  expect_peers_train_like_the_whole_model(spec, "pool1,pool2,fc1", 12, 8, 4, inputs, labels, drive);
}

TEST(StagePeer, FourPeersTrainTheCnnLikeTheWholeModel) { expect_cnn_peers_train_like_the_whole_model(Drive::Threads); }

// The browser's and an executor's way: four peers as tasks on one thread, each resumed by the
// delivery of what it waits for, train as the whole model does under every schedule.
TEST(StagePeer, FourPeersOnOneThreadDrivenByEventsTrainTheCnnLikeTheWholeModel) {
  expect_cnn_peers_train_like_the_whole_model(Drive::Events);
}

// The same for the encoder, its mask travelling down the chain (and under the sanitizers).
TEST(StagePeer, FourPeersOnOneThreadDrivenByEventsTrainAnEncoderLikeTheWholeModel) {
  const ModelSpec spec = parse_model_json(kTinyEncoderSpec);
  std::vector<Tensor> inputs;
  std::vector<int32_t> labels;
  encoder_mails(inputs, labels);
  expect_peers_train_like_the_whole_model(spec, "ln0,ln1,ln2", 12, 8, 4, inputs, labels, Drive::Events);
}

// A blocking call on a link driven by events says how to drive the peer instead; the task
// waits, and the delivery it waits for resumes it.
TEST(StagePeer, ABlockingCallOnALinkDrivenByEventsSaysToAwaitTheTask) {
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition(cut_list("pool2"));
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network init(graph, *backend, 3);
  const auto schedule = make_pipeline_schedule("1f1b");
  EventChain chain(spec, graph, "pool2", parts, init, *schedule, 8, 2);
  EXPECT_EQ(error_of([&] { chain.peers[1]->connect({}); }),
            "[stage] connect waits on a link driven by events: drive the peer with connect_async and deliver the "
            "link's messages");
  Task<uint64_t> connect = chain.peers[1]->connect_async({});
  connect.start();
  EXPECT_FALSE(connect.done());
  EXPECT_TRUE(chain.ups[1]->waiting());
  chain.ups[1]->lose("the browser tab closed");
  ASSERT_TRUE(connect.done());
  EXPECT_EQ(error_of([&] { connect.result(); }),
            "[stage] the link closed while awaiting StageHello: the browser tab closed");
}

TEST(StagePeer, FourPeersTrainAnEncoderWithTheMaskTravellingDownTheChain) {
  const ModelSpec spec = parse_model_json(kTinyEncoderSpec);
  std::vector<Tensor> inputs;
  std::vector<int32_t> labels;
  encoder_mails(inputs, labels);
  expect_peers_train_like_the_whole_model(spec, "ln0,ln1,ln2", 12, 8, 4, inputs, labels);
}

// The last of two stages of the CNN (cut at pool2), facing a scripted stage before it.
struct LastStage {
  ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  Graph graph = Graph::build(spec);
  std::vector<Graph> parts = graph.partition({"pool2"});
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network init{graph, *backend, 3};
  PeerStage stage = make_stage(parts[1], init);
  GPipeSchedule schedule;
  StagePlan plan = make_stage_plan(spec.binary, graph, "pool2", parts, 1, schedule, 8, 2);
  std::unique_ptr<MemoryLink> before, up;  // the scripted party's end, and the stage's
  std::unique_ptr<StagePeer> peer;
  MessageWriter writer;
  LastStage() {
    std::tie(before, up) = MemoryLink::pair();
    peer = std::make_unique<StagePeer>(*stage.stage, schedule, plan, up.get(), nullptr);
  }
  void send(std::span<const uint8_t> bytes) { before->send(bytes); }
  void hello() {
    send(writer.stage_hello(said(plan, schedule, 0, 2, 0)));
    EXPECT_EQ(peer->connect({}), 0u);
    (void)before->receive("the answer");
  }
  // Micro-batch `mb` of a step of 8 samples in 2: activations [4, 7, 7, 64] of ones.
  void activations(uint64_t step, uint32_t mb, Shape shape = Shape{4, 7, 7, 64}, int32_t label = 1) {
    Tensor t = Tensor::empty(shape);
    t.fill(1.0f);
    const std::vector<int32_t> labels(4, label);
    send(writer.activations({step, 8, 2, 1.0f, false}, 0, mb, 0, t, labels, nullptr));
  }
  // The Error connect() ends with after the stage before says `f` (what it said, changed).
  std::string refused(const StageHelloFields& f) {
    send(writer.stage_hello(f));
    return error_of([&] { peer->connect({}); });
  }
  StageHelloFields said_before() const { return said(plan, schedule, 0, 2, 0); }
  // The Error the stage ends its run with, and what it answered on the link.
  std::string follow() {
    StepStats s;
    return error_of([&] { peer->follow_step(s); });
  }
};

TEST(StagePeerBadInput, AHelloOfAnotherPlanIsRefused) {
  LastStage t;
  StageHelloFields other = t.said_before();
  other.plan_hash[0] ^= 1;
  EXPECT_EQ(t.refused(other),
            "[stage] stage 1 refused the previous stage's message: the previous stage runs another plan (its model "
            "spec, cut list, number of stages, where the labels are or first parties differ from stage 1's): give "
            "every party the same deployment");
  EXPECT_EQ(t.up->refused.code, wire::ErrorCode::ModelMismatch);
}

TEST(StagePeerBadInput, AHelloFromTheWrongStageOrFormatIsRefused) {
  {
    LastStage t;
    t.send(t.writer.stage_hello(said(t.plan, t.schedule, 1, 2, 0)));
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
              "[stage] stage 1 refused the previous stage's message: stage 1 of 2 linked to stage 1 of 2");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::ModelMismatch);
  }
  {
    LastStage t;
    StageHelloFields old = said(t.plan, t.schedule, 0, 2, 0);
    old.format = kWireFormat - 1;
    t.send(t.writer.stage_hello(old));
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
              cat("[stage] stage 1 refused the previous stage's message: wire format ", kWireFormat - 1,
                  "; this stage speaks ", kWireFormat));
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::ProtocolVersion);
  }
}

// StageHello says the run's terms one by one: a stage names the one the stage before has
// another of.
TEST(StagePeerBadInput, AHelloOfOtherTermsIsRefusedNamingTheTerm) {
  const std::string refused = "[stage] stage 1 refused the previous stage's message: ";
  const auto refusal = [&](const std::function<void(StageHelloFields&)>& change) {
    LastStage t;
    StageHelloFields f = t.said_before();
    change(f);
    const std::string error = t.refused(f);
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::ModelMismatch) << error;
    return error.substr(0, refused.size()) == refused ? error.substr(refused.size()) : error;
  };
  EXPECT_EQ(refusal([](StageHelloFields& f) { f.schedule = "1f1b"; }),
            "the previous stage runs the '1f1b' schedule and stage 1 the 'gpipe' one: give every party the same "
            "pipeline-schedule");
  EXPECT_EQ(refusal([](StageHelloFields& f) { f.batch = 16; }),
            "the previous stage plans steps of at most 16 samples in 2 micro-batches, and stage 1 8 in 2: give every "
            "party the same batch and microbatches");
  EXPECT_EQ(refusal([](StageHelloFields& f) { f.microbatches = 1; }),
            "the previous stage plans steps of at most 8 samples in 1 micro-batches, and stage 1 8 in 2: give every "
            "party the same batch and microbatches");
  EXPECT_EQ(refusal([](StageHelloFields& f) { f.microbatches = 9; }),
            "the previous stage plans steps of at most 8 samples in 9 micro-batches: not a plan");
  EXPECT_EQ(refusal([](StageHelloFields& f) { f.terms[3] ^= 1; }),
            "the previous stage's run terms (the optimizer's, the seed, the epochs, the data's extent, the privacy "
            "filters or checkpoint-every) differ from stage 1's: give every party the same deployment");
  EXPECT_EQ(refusal([](StageHelloFields& f) { f.dtypes = {wire::DType::F16, wire::DType::I8}; }),
            "the previous stage sends f16, i8 and stage 1 takes f32: give every party the same wire-dtype");
  EXPECT_EQ(refusal([](StageHelloFields& f) { f.dtypes = {}; }),
            "the previous stage sends no dtype and stage 1 takes f32: give every party the same wire-dtype");
}

// A stage serving parties of their own terms (later-stages = "own", a cloud's sessions) takes
// a smaller batch and fewer micro-batches than its own, other run terms, and the first dtype
// offered that it takes, which it answers; a larger batch it refuses.
TEST(StagePeer, AStageOfOwnTermsTakesTheTermsOfThePartyBeforeWithinItsOwn) {
  const auto host = [](LastStage& t) {
    t.plan.batch = 16;
    t.plan.microbatches = 4;
    t.plan.own_terms = true;
    t.plan.accepts = {wire::DType::F32, wire::DType::BF16, wire::DType::F16};
    t.peer = std::make_unique<StagePeer>(*t.stage.stage, t.schedule, t.plan, t.up.get(), nullptr);
  };
  {
    LastStage t;
    StageHelloFields f = said(t.plan, t.schedule, 0, 2, 0);  // batch 8 in 2
    host(t);
    f.terms[0] ^= 1;
    f.dtypes = {wire::DType::I8, wire::DType::F16, wire::DType::F32};
    t.send(t.writer.stage_hello(f));
    EXPECT_EQ(t.peer->connect({}), 0u);
    const Frame answer = t.before->receive("the answer");
    const wire::StageHello* h = wire::GetMessage(answer.data())->payload_as_StageHello();
    ASSERT_NE(h, nullptr);
    ASSERT_EQ(h->dtypes()->size(), 1u);
    EXPECT_EQ(h->dtypes()->Get(0), wire::DType::F16);  // i8 it does not take
    // A step of the party's batch trains, its activations and gradients in f16.
    Tensor x = Tensor::empty(Shape{4, 7, 7, 64});
    x.fill(0.5f);
    const std::vector<int32_t> labels(4, 1);
    for (uint32_t mb = 0; mb < 2; ++mb)
      t.send(t.writer.activations({0, 8, 2, 1.0f, false}, 0, mb, 0, x, labels, nullptr, wire::DType::F16));
    StepStats stats;
    EXPECT_TRUE(t.peer->follow_step(stats));
    for (uint32_t mb = 0; mb < 2; ++mb) {
      const Frame g = t.before->receive("gradients");
      const wire::Gradients* grad = wire::GetMessage(g.data())->payload_as_Gradients();
      ASSERT_NE(grad, nullptr);
      EXPECT_EQ(grad->tensor()->dtype(), wire::DType::F16);
    }
  }
  {
    LastStage t;
    StageHelloFields f = t.said_before();
    f.batch = 32;
    host(t);
    EXPECT_EQ(t.refused(f),
              "[stage] stage 1 refused the previous stage's message: the previous stage plans steps of at most 32 "
              "samples in 2 micro-batches, and stage 1 takes at most 16 in 4: plan a smaller batch or fewer "
              "micro-batches");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::ModelMismatch);
  }
}

// The first of two stages of the CNN (cut at pool2), facing a scripted stage after it.
struct FirstStage {
  ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  Graph graph = Graph::build(spec);
  std::vector<Graph> parts = graph.partition({"pool2"});
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network init{graph, *backend, 3};
  PeerStage stage = make_stage(parts[0], init);
  GPipeSchedule schedule;
  StagePlan plan = make_stage_plan(spec.binary, graph, "pool2", parts, 0, schedule, 8, 2);
  std::unique_ptr<MemoryLink> down, after;  // the stage's end, and the scripted party's
  std::unique_ptr<StagePeer> peer;
  MessageWriter writer;
  FirstStage() {
    std::tie(down, after) = MemoryLink::pair();
    peer = std::make_unique<StagePeer>(*stage.stage, schedule, plan, nullptr, down.get());
  }
};

// The stage after must answer with the dtype this stage offered.
TEST(StagePeerBadInput, AnAnswerWithAnotherDtypeIsRefused) {
  FirstStage t;
  StageHelloFields answer = said(t.plan, t.schedule, 1, 2, 0);
  answer.dtypes = {wire::DType::BF16};
  t.after->send(t.writer.stage_hello(answer));
  EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
            "[stage] stage 0 refused the next stage's message: the stage after did not choose the dtype stage 0 "
            "offered (f32) for their link");
  EXPECT_EQ(t.down->refused.code, wire::ErrorCode::ModelMismatch);
}

// A stage after that answers Busy (a cloud at its bound) is a lost link to try again later, not
// the run's end; its other Errors end the run.
TEST(StagePeer, BusyFromTheStageAfterIsALinkToTryAgain) {
  for (const wire::ErrorCode code : {wire::ErrorCode::Busy, wire::ErrorCode::NoRoom}) {
    FirstStage t;
    t.after->send(t.writer.error(code, "the sessions' memory has 4 MiB left: try again later"));
    bool busy = false;
    std::string text;
    try {
      t.peer->connect({});
    } catch (const LinkBusy& e) {
      busy = true;
      text = e.what();
    } catch (const std::exception& e) {
      text = e.what();
    }
    EXPECT_EQ(busy, code == wire::ErrorCode::Busy) << text;
    if (busy) EXPECT_EQ(text, "[stage] the next stage is busy: the sessions' memory has 4 MiB left: try again later");
  }
}

// The step to start from: the newest checkpoint at or before the stage before's proposal.
TEST(StagePeer, TheStepToStartFromIsTheNewestCheckpointAtOrBeforeTheProposal) {
  for (const auto& [proposal, want] : std::vector<std::pair<uint64_t, uint64_t>>{{7, 4}, {8, 8}, {3, 0}, {20, 8}}) {
    LastStage t;
    t.send(t.writer.stage_hello(said(t.plan, t.schedule, 0, 2, proposal)));
    const std::vector<uint64_t> have{4, 8};
    EXPECT_EQ(t.peer->connect(have), want) << proposal;
    EXPECT_EQ(t.peer->next_step(), want);
    const Frame answer = t.before->receive("the answer");
    WireError error;
    const wire::Message* msg = verify_frame(answer, answer.size(), error);
    ASSERT_NE(msg, nullptr);
    ASSERT_NE(msg->payload_as_StageHello(), nullptr);
    EXPECT_EQ(msg->payload_as_StageHello()->resume_step(), want);
    EXPECT_EQ(msg->payload_as_StageHello()->stage(), 1u);
    EXPECT_EQ(msg->format(), kWireFormat);
  }
}

TEST(StagePeerBadInput, ActivationsOfTheWrongShapeAreRefused) {
  LastStage t;
  t.hello();
  t.activations(0, 0, Shape{4, 7, 7, 32});
  EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: activations: shape [4, 7, 7, 32] "
                        "differs from the expected [4, 7, 7, 64]");
  EXPECT_EQ(t.up->refused.code, wire::ErrorCode::BadTensor);
}

TEST(StagePeerBadInput, AStepOutOfOrderOrAMicroBatchTwiceIsRefused) {
  {
    LastStage t;
    t.hello();
    t.activations(3, 0);
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: activations of step 3 while stage 1 "
                          "trains step 0 next");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::OutOfWindow);
  }
  {
    LastStage t;
    t.hello();
    t.activations(0, 0);
    t.activations(0, 0);
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: micro-batch 0 of step 0 arrived twice");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::OutOfWindow);
  }
}

// A step that asks for a checkpoint, at a stage that keeps none (no save hook), is refused.
TEST(StagePeerBadInput, ACheckpointAStageCannotKeepIsRefused) {
  LastStage t;
  t.hello();
  Tensor x = Tensor::empty(Shape{4, 7, 7, 64});
  x.fill(1.0f);
  const std::vector<int32_t> labels(4, 1);
  t.send(t.writer.activations({0, 8, 2, 1.0f, true}, 0, 0, 0, x, labels, nullptr));
  EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: step 0 asks every stage for a "
                        "checkpoint; stage 1 keeps none (give its party a checkpoint-dir)");
  EXPECT_EQ(t.up->refused.code, wire::ErrorCode::NoCheckpoint);
}

TEST(StagePeerBadInput, LabelsOutOfRangeAndOtherMessagesAreRefused) {
  {
    LastStage t;
    t.hello();
    t.activations(0, 0, Shape{4, 7, 7, 64}, 10);
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: labels: 10 at 0 is outside [0, 10)");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::BadTensor);
  }
  {
    LastStage t;
    t.hello();
    t.send(t.writer.hello("x", t.plan.hash));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: expected Activations, got Hello");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::UnexpectedMessage);
  }
  {
    LastStage t;
    t.hello();
    const std::vector<uint8_t> junk(100, 0xab);
    t.send(junk);
    EXPECT_EQ(t.follow().rfind("[stage] stage 1 refused the previous stage's message: ", 0), 0u);
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::Malformed);
  }
}

TEST(StagePeerBadInput, AByeWithinAStepIsRefusedAndBetweenStepsEndsTheRun) {
  {
    LastStage t;
    t.hello();
    t.activations(0, 0);
    t.send(t.writer.bye("gone"));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: Bye within step 0: a run ends between steps");
  }
  {  // the last stage records its end (on_end), then answers Bye up
    LastStage t;
    t.hello();
    std::vector<std::pair<uint64_t, bool>> recorded;
    t.peer->on_end([&](uint64_t steps, bool acknowledged) {
      EXPECT_EQ(t.up->sent, 1u) << "only its StageHello went up before the end was recorded";
      recorded.emplace_back(steps, acknowledged);
    });
    t.send(t.writer.bye("done"));
    StepStats s;
    EXPECT_FALSE(t.peer->follow_step(s));
    EXPECT_EQ(recorded, (std::vector<std::pair<uint64_t, bool>>{{0, false}, {0, true}}));
    const Frame bye = t.before->receive("the Bye back");
    const wire::Message* m = wire::GetMessage(bye.data());
    ASSERT_EQ(m->payload_type(), wire::Payload::Bye);
    EXPECT_EQ(m->payload_as_Bye()->reason()->str(), "every later stage has recorded the run's end");
  }
  {  // an end that cannot be recorded: follow_step throws it, and no Bye goes up
    LastStage t;
    t.hello();
    t.peer->on_end([](uint64_t, bool) { fail("test", "the disk is full"); });
    t.send(t.writer.bye("done"));
    EXPECT_EQ(t.follow(), "[test] the disk is full");
    t.before->close();
    EXPECT_EQ(error_of([&] { (void)t.before->receive("the Bye back"); }),
              "the link closed while awaiting the Bye back");
  }
}

TEST(StagePeerBadInput, AnEvaluationThatAsksForACheckpointOrIsAnsweredWithGradientsIsRefused) {
  {  // the last stage: an evaluation batch never checkpoints
    LastStage t;
    t.hello();
    Tensor x = Tensor::empty(Shape{4, 7, 7, 64});
    x.fill(1.0f);
    const std::vector<int32_t> labels(4, 1);
    t.send(t.writer.activations({0, 8, 2, 1.0f, true, true, 0}, 0, 0, 0, x, labels, nullptr));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: an evaluation batch before step 0 "
                          "asks for a checkpoint: nothing trains in one");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::BadTensor);
  }
  {  // and an evaluation batch ends up with Evaluated, its reply, and evaluates the last stage's way
    LastStage t;
    t.hello();
    Tensor x = Tensor::empty(Shape{4, 7, 7, 64});
    x.fill(1.0f);
    for (uint32_t mb = 0; mb < 2; ++mb)
      t.send(t.writer.activations({0, 8, 2, 1.0f, false, true, 16}, 0, mb, 0, x, std::vector<int32_t>(4, 2), nullptr));
    StepStats s;
    EXPECT_TRUE(t.peer->follow_step(s));
    EXPECT_TRUE(t.peer->evaluated());
    EXPECT_EQ(t.peer->next_step(), 0u) << "nothing trained";
    for (uint32_t mb = 0; mb < 2; ++mb) {
      const Frame reply = t.before->receive("Evaluated");
      const wire::Message* msg = wire::GetMessage(reply.data());
      ASSERT_EQ(msg->payload_type(), wire::Payload::Evaluated);
      EXPECT_EQ(msg->payload_as_Evaluated()->microbatch(), mb);
      EXPECT_GT(msg->payload_as_Evaluated()->loss(), 0.0f);
    }
    EXPECT_EQ(s.samples, 8u);
  }
  // The first stage: its evaluation batch answered with Gradients.
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition({"pool2"});
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network init(graph, *backend, 3);
  PeerStage a = make_stage(parts[0], init);
  GPipeSchedule schedule;
  const StagePlan plan = make_stage_plan(spec.binary, graph, "pool2", parts, 0, schedule, 8, 2);
  auto [down, after] = MemoryLink::pair();
  StagePeer first(*a.stage, schedule, plan, nullptr, down.get());
  std::thread next([&, after = after.get()] {
    (void)after->receive("StageHello");
    MessageWriter w;
    after->send(w.stage_hello(said(plan, schedule, 1, 2, 0)));
    (void)after->receive("evaluation activations");
    after->send(w.gradients(1, 0, 0, 0, Tensor::empty(Shape{4, 7, 7, 64}), 1.0f, 1));
  });
  first.connect({});
  Rng rng(2);
  const std::vector<Tensor> rows{random_tensor(Shape{8, 28, 28, 1}, rng, 0.0f, 1.0f)};
  const std::vector<int32_t> labels(8, 1);
  EXPECT_EQ(error_of([&] { first.evaluate(rows, labels.data(), 0); }),
            "[stage] stage 0 refused the next stage's message: expected Evaluated, got Gradients");
  EXPECT_EQ(down->refused.code, wire::ErrorCode::UnexpectedMessage);
  next.join();
}

// NoPeek on a link gives the penalty of the whole step, as distance_correlation computes it over
// all of the step's samples at once, whatever K: each micro-batch's gradient gets its rows.
TEST(StagePeerFilters, NoPeekAddsTheWholeStepsPenaltyToEachMicroBatch) {
  Rng rng(8);
  const int64_t n = 8, dx = 5, dz = 3;
  const Tensor x = random_tensor(Shape{n, dx}, rng, -1.0f, 1.0f), z = random_tensor(Shape{n, dz}, rng, -1.0f, 1.0f);
  const Tensor g = random_tensor(Shape{n, dz}, rng, -0.1f, 0.1f);
  std::vector<float> penalty(static_cast<std::size_t>(n * dz), 0.0f);
  std::vector<double> work;
  const double dcor = distance_correlation(x.data(), dx, z.data(), dz, n, penalty.data(), 0.7f, work);
  ASSERT_GT(dcor, 0.0);
  for (uint32_t k : {1u, 2u, 4u}) {
    NoPeekFilter f(0.7f);
    f.begin_step(std::span<const Tensor>(&x, 1), static_cast<uint32_t>(n), k);
    for (uint32_t mb = 0; mb < k; ++mb) {
      const auto [begin, count] = microbatch_range(n, k, mb);
      EXPECT_EQ(f.activations_out(z.slice_batch(begin, count), mb, begin).data(), z.slice_batch(begin, count).data())
          << "NoPeek sends the activations as they are";
    }
    for (uint32_t mb = 0; mb < k; ++mb) {
      const auto [begin, count] = microbatch_range(n, k, mb);
      const Tensor& out = f.gradient_in(g.slice_batch(begin, count), mb, begin);
      for (int64_t i = 0; i < count * dz; ++i)
        EXPECT_NEAR(out.data()[i], g.data()[begin * dz + i] + penalty[static_cast<std::size_t>(begin * dz + i)], 1e-6f)
            << "K " << k << ", element " << begin * dz + i;
    }
    EXPECT_DOUBLE_EQ(f.dcor(), dcor);
  }
  NoPeekFilter early(0.7f);  // a gradient back before the step's last micro-batch went
  early.begin_step(std::span<const Tensor>(&x, 1), static_cast<uint32_t>(n), 2);
  early.activations_out(z.slice_batch(0, 4), 0, 0);
  EXPECT_EQ(error_of([&] { early.gradient_in(g.slice_batch(0, 4), 0, 0); }),
            "[stage] NoPeek needs every micro-batch of the step sent before the first gradient comes back");
}

TEST(StagePeerBadInput, AnEvaluationBeyondTheFirstPartysEvaluationSetIsRefused) {
  LastStage t;
  t.plan = make_stage_plan(t.spec.binary, t.graph, "pool2", t.parts, 1, t.schedule, 8, 2, wire::DType::F32, false);
  t.peer = std::make_unique<StagePeer>(*t.stage.stage, t.schedule, t.plan, t.up.get(), nullptr);
  const std::vector<int32_t> test_labels(10, 1);
  t.peer->evaluation_labels_from([&](uint64_t begin, uint32_t count) {  // as tandem stage's, overflow-safe
    const std::span<const int32_t> all(test_labels);
    return begin <= all.size() && count <= all.size() - begin ? all.subspan(begin, count) : std::span<const int32_t>();
  });
  t.hello();
  Tensor x = Tensor::empty(Shape{4, 7, 7, 64});
  x.fill(1.0f);
  const uint64_t huge = ~uint64_t{0} - 2;
  for (uint32_t mb = 0; mb < 2; ++mb) t.send(t.writer.activations({0, 8, 2, 1.0f, false, true, huge}, 0, mb, 0, x, {}, nullptr));
  EXPECT_EQ(t.follow(), cat("[stage] stage 1 refused the previous stage's message: an evaluation batch from sample ",
                            huge, " of 8 samples: the evaluation set here has no labels for samples ", huge, " to ",
                            huge + 3, " (give both processes of the first party the same data and test-limit)"));
  EXPECT_EQ(t.up->refused.code, wire::ErrorCode::OutOfWindow);
}

// A neighbour's Restart is a lost link (LinkLost, not the end of the run): after reset() the
// stage links again and trains the step it had dropped.
TEST(StagePeer, ARestartIsALostLinkAndTheStageLinksAgain) {
  LastStage t;
  t.hello();
  t.activations(0, 0);
  t.send(t.writer.error(wire::ErrorCode::Restart, "gpu-box lost a link"));
  StepStats s;
  bool lost = false;
  try {
    t.peer->follow_step(s);
  } catch (const LinkLost& e) {
    lost = true;
    EXPECT_EQ(std::string(e.what()), "[stage] the previous stage starts again from the newest checkpoint: gpu-box lost a link");
  }
  EXPECT_TRUE(lost);
  t.peer->reset();
  t.hello();
  t.activations(0, 0);
  t.activations(0, 1);
  EXPECT_TRUE(t.peer->follow_step(s));
  EXPECT_EQ(s.samples, 8);
  EXPECT_EQ(t.peer->next_step(), 1u);
}

// A plan whose labels stay at the first party: the loss stage reads them from labels_from,
// and refuses Activations that carry any.
TEST(StagePeer, WhereTheLabelsStayTheLossStageReadsItsOwnAndRefusesAnyThatArrive) {
  {
    LastStage t;
    t.plan = make_stage_plan(t.spec.binary, t.graph, "pool2", t.parts, 1, t.schedule, 8, 2, wire::DType::F32, false);
    t.peer = std::make_unique<StagePeer>(*t.stage.stage, t.schedule, t.plan, t.up.get(), nullptr);
    std::vector<int32_t> labels(8, 3);
    uint64_t asked = 99;
    t.peer->labels_from([&](uint64_t step) {
      asked = step;
      return std::span<const int32_t>(labels);
    });
    t.hello();
    Tensor x = Tensor::empty(Shape{4, 7, 7, 64});
    x.fill(1.0f);
    for (uint32_t mb = 0; mb < 2; ++mb) t.send(t.writer.activations({0, 8, 2, 1.0f, false}, 0, mb, 0, x, {}, nullptr));
    StepStats s;
    EXPECT_TRUE(t.peer->follow_step(s));
    EXPECT_EQ(asked, 0u);
    t.activations(1, 0);  // with labels
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: labels arrived, and in this plan they "
                          "never leave the first party");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::BadTensor);
  }
  {  // and a plan that says otherwise is another plan
    LastStage t;
    const StagePlan other =
        make_stage_plan(t.spec.binary, t.graph, "pool2", t.parts, 1, t.schedule, 8, 2, wire::DType::F32, false);
    EXPECT_NE(other.hash, t.plan.hash);
    // one whose optimizer or seed differ (the host's run terms) says other terms, and is another run
    const StagePlan lr = make_stage_plan(t.spec.binary, t.graph, "pool2", t.parts, 1, t.schedule, 8, 2,
                                         wire::DType::F32, true, "lr=0.1\n");
    EXPECT_EQ(lr.hash, t.plan.hash);
    EXPECT_NE(lr.terms, t.plan.terms);
    EXPECT_NE(lr.run, t.plan.run);
    // as is one of another batch, K, dtype or schedule
    EXPECT_NE(make_stage_plan(t.spec.binary, t.graph, "pool2", t.parts, 1, t.schedule, 16, 2).run, t.plan.run);
    EXPECT_NE(make_stage_plan(t.spec.binary, t.graph, "pool2", t.parts, 1, t.schedule, 8, 4).run, t.plan.run);
    EXPECT_NE(make_stage_plan(t.spec.binary, t.graph, "pool2", t.parts, 1, t.schedule, 8, 2, wire::DType::F16).run,
              t.plan.run);
    EXPECT_NE(make_stage_plan(t.spec.binary, t.graph, "pool2", t.parts, 1, OneFOneBSchedule(), 8, 2).run, t.plan.run);
  }
}

// Filters on the links (pipeline/link_filter.h): two peers, the first with `down` filters on
// what it sends, the last with `up` filters on the gradient it sends back, train exactly as
// the two stages do when the same filters (fresh, with the same seeds) are applied by hand.
// Returns the first stage's reported losses.
using Filters = std::vector<std::unique_ptr<LinkFilter>>;
std::vector<double> expect_filtered_peers_match_by_hand(const std::function<Filters()>& down,
                                                        const std::function<Filters()>& up,
                                                        const std::string& schedule_name = "gpipe") {
  SCOPED_TRACE(schedule_name);
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition({"fc1"});
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network init(graph, *backend, 4);
  Rng rng(6);
  const int64_t batch = 8;
  const uint32_t k = 2;
  const int steps = 3;
  const Tensor x = random_tensor(Shape{batch * steps, 28, 28, 1}, rng, 0.0f, 1.0f);
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < batch * steps; ++i) labels.push_back(static_cast<int32_t>(rng.below(10)));
  const auto ptrs = [](const Filters& f) {
    std::vector<LinkFilter*> out;
    for (const auto& p : f) out.push_back(p.get());
    return out;
  };
  const std::unique_ptr<PipelineSchedule> scheduled = make_pipeline_schedule(schedule_name);
  const PipelineSchedule& schedule = *scheduled;

  // By hand.
  PeerStage a = make_stage(parts[0], init), b = make_stage(parts[1], init);
  const Filters hand_down = down(), hand_up = up();
  for (int step = 0; step < steps; ++step) {
    const std::vector<Tensor> rows{x.slice_batch(step * batch, batch)};
    const int32_t* y = labels.data() + step * batch;
    a.stage->zero_grad();
    b.stage->zero_grad();
    for (const auto& f : hand_down) f->begin_step(rows, batch, k);
    std::vector<Tensor> sent(k), back(k);
    for (uint32_t mb = 0; mb < k; ++mb) {
      const auto [begin, count] = microbatch_range(batch, k, mb);
      const std::vector<Tensor> in{rows[0].slice_batch(begin, count)};
      const Tensor* t = &a.stage->forward(in, static_cast<int>(mb));
      for (const auto& f : hand_down) t = &f->activations_out(*t, mb, begin);
      sent[mb] = Tensor::empty(t->shape());
      sent[mb].copy_from(*t);
      b.stage->forward_loss({&sent[mb], 1}, static_cast<int>(mb), y + begin, 1.0f / batch);
    }
    for (const PipelineAction& act : schedule.actions(1, 2, static_cast<int>(k))) {
      // one whole backward a micro-batch (zero bubble's weight half is the same pass, split)
      if (act.kind == PipelineAction::Kind::Forward || act.kind == PipelineAction::Kind::BackwardWeight) continue;
      const auto mb = static_cast<uint32_t>(act.microbatch);
      const Tensor& exact = b.stage->output_grad(act.microbatch);
      const Tensor* noised = nullptr;  // label noise: the gradient up from it, the weights' from the exact one
      for (const auto& f : hand_up)
        if (const Tensor* n = f->loss_gradient_up(exact, mb, batch)) noised = n;
      Tensor g;
      if (noised) {
        std::vector<Tensor> kept;
        for (Param* p : b.net->params()) {
          kept.push_back(Tensor::empty(p->grad().shape()));
          kept.back().copy_from(p->grad());
        }
        const Tensor up = b.stage->backward(*noised, act.microbatch, true);
        g = Tensor::empty(up.shape());
        g.copy_from(up);
        for (std::size_t i = 0; i < kept.size(); ++i) b.net->params()[i]->grad().copy_from(kept[i]);
        b.stage->backward(exact, act.microbatch, false);
      } else {
        g = b.stage->backward(exact, act.microbatch, true);
      }
      const Tensor* t = &g;
      for (const auto& f : hand_up) t = &f->gradient_out(*t, mb, batch);
      back[mb] = Tensor::empty(t->shape());
      back[mb].copy_from(*t);
    }
    for (uint32_t mb = 0; mb < k; ++mb) {
      const Tensor* g = &back[mb];
      for (auto f = hand_down.rbegin(); f != hand_down.rend(); ++f)
        g = &(*f)->gradient_in(*g, mb, microbatch_range(batch, k, mb).begin);
      a.stage->backward(*g, static_cast<int>(mb), false);
    }
    a.stage->step();
    b.stage->step();
  }

  // Over links.
  PeerStage pa = make_stage(parts[0], init), pb = make_stage(parts[1], init);
  auto [down_link, up_link] = MemoryLink::pair();
  StagePeer first(*pa.stage, schedule, make_stage_plan(spec.binary, graph, "fc1", parts, 0, schedule, batch, k), nullptr,
                  down_link.get());
  StagePeer last(*pb.stage, schedule, make_stage_plan(spec.binary, graph, "fc1", parts, 1, schedule, batch, k),
                 up_link.get(), nullptr);
  const Filters peer_down = down(), peer_up = up();
  first.set_filters(ptrs(peer_down), {});
  last.set_filters({}, ptrs(peer_up));
  std::vector<double> losses;
  double last_loss = 0;
  std::string errors[2];
  std::thread t([&] {
    errors[1] = error_of([&] {
      last.connect({});
      StepStats s;
      while (last.follow_step(s)) last_loss += s.loss_sum;
    });
    up_link->close();
  });
  errors[0] = error_of([&] {
    first.connect({});
    for (int step = 0; step < steps; ++step)
      losses.push_back(first.train_step({static_cast<uint64_t>(step), static_cast<uint32_t>(batch), k, 1.0f, false},
                                        std::vector<Tensor>{x.slice_batch(step * batch, batch)},
                                        labels.data() + step * batch)
                           .loss_sum);
    first.finish("done");
  });
  if (!errors[0].empty()) down_link->close();
  t.join();
  EXPECT_EQ(errors[0], "(no error)");
  EXPECT_EQ(errors[1], "(no error)");
  EXPECT_GT(last_loss, 0.0) << "the loss stage keeps its own loss";
  EXPECT_LE(max_diff(*pa.net, *a.net), 1e-5f);
  EXPECT_LE(max_diff(*pb.net, *b.net), 1e-5f);
  EXPECT_GT(max_diff(*pa.net, init), 1e-3f) << "the weights moved";
  return losses;
}

TEST(StagePeerFilters, NoiseOnTheActivationsSentDownAndTheirGradientBackThroughTheClip) {
  for (const char* schedule : {"gpipe", "1f1b", "zero-bubble"}) {
    const auto losses = expect_filtered_peers_match_by_hand(
        [] {
          Filters f;
          f.push_back(std::make_unique<CutNoiseFilter>(0.5f, 0.3f, 7));
          return f;
        },
        [] { return Filters{}; }, schedule);
    for (double loss : losses) EXPECT_GT(loss, 0.0) << "no up filter hides the loss";
  }
}

TEST(StagePeerFilters, NoPeekThenNoiseOnTheActivationsAsTheEdgeAppliesThem) {
  expect_filtered_peers_match_by_hand(
      [] {
        Filters f;
        f.push_back(std::make_unique<NoPeekFilter>(0.5f));
        f.push_back(std::make_unique<CutNoiseFilter>(1.0f, 0.1f, 3));
        return f;
      },
      [] { return Filters{}; });
}

TEST(StagePeerFilters, NoiseOnTheGradientSentUpKeepsTheLossAtTheLossStage) {
  const auto losses = expect_filtered_peers_match_by_hand([] { return Filters{}; },
                                                          [] {
                                                            Filters f;
                                                            f.push_back(std::make_unique<GradNoiseFilter>(0.2f, 0.5f, 9));
                                                            return f;
                                                          });
  for (double loss : losses) EXPECT_EQ(loss, 0.0) << "the loss would tell of the labels";
}

TEST(StagePeerFilters, LabelNoiseOnTheGradientSentUpWhileTheLossStageTrainsOnTheExactOne) {
  const auto losses = expect_filtered_peers_match_by_hand([] { return Filters{}; },
                                                          [] {
                                                            Filters f;
                                                            f.push_back(std::make_unique<LabelNoiseFilter>(0.5f, 1, 5));
                                                            return f;
                                                          });
  for (double loss : losses) EXPECT_EQ(loss, 0.0) << "the loss would tell of the labels";
}

TEST(StagePeerFilters, AFilterWithoutItsLinkOrAWholeStepFilterUnderAnInterleavedScheduleIsRefused) {
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition({"pool2", "fc1"});
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network init(graph, *backend, 4);
  PeerStage a = make_stage(parts[0], init);
  auto [down_link, up_link] = MemoryLink::pair();
  const auto one_f_one_b = make_pipeline_schedule("1f1b");
  NoPeekFilter nopeek(1.0f);
  GradNoiseFilter grad(1.0f, 1.0f, 1);
  {
    StagePeer first(*a.stage, *one_f_one_b,
                    make_stage_plan(spec.binary, graph, "pool2,fc1", parts, 0, *one_f_one_b, 8, 4), nullptr,
                    down_link.get());
    EXPECT_EQ(error_of([&] { first.set_filters({}, {&grad}); }),
              "[stage] stage 0 is the first: it sends nothing up for noise on the gradient sent up (clip 1, sigma 1) "
              "to filter");
    EXPECT_EQ(error_of([&] { first.set_filters({&nopeek}, {}); }),
              "[stage] NoPeek (alpha 1) reads a whole step's activations before the first gradient comes back; the "
              "1f1b schedule backs micro-batch 0 up at stage 0 before its last is sent: use the gpipe schedule");
  }
  GPipeSchedule gpipe;
  StagePeer first(*a.stage, gpipe, make_stage_plan(spec.binary, graph, "pool2,fc1", parts, 0, gpipe, 8, 4), nullptr,
                  down_link.get());
  EXPECT_EQ(error_of([&] { first.set_filters({&nopeek}, {}); }), "(no error)");
  // Label noise backs the loss stage up whole, twice: not where zero bubble splits its backward.
  PeerStage c = make_stage(parts[2], init);
  auto [before, last_up] = MemoryLink::pair();
  const auto zero_bubble = make_pipeline_schedule("zero-bubble");
  StagePeer last(*c.stage, *zero_bubble, make_stage_plan(spec.binary, graph, "pool2,fc1", parts, 2, *zero_bubble, 8, 4),
                 last_up.get(), nullptr);
  LabelNoiseFilter labels(0.5f, 1, 1);
  EXPECT_EQ(error_of([&] { last.set_filters({}, {&labels}); }),
            "[stage] noise on the loss gradient sent up (sigma 0.5) backs the loss stage up whole, twice; the "
            "zero-bubble schedule splits its backward (input gradients first): use gpipe or 1f1b");
}

// Under the asynchronous schedule (weight stashing) N peers give the in-process pipeline's
// weights under the same schedule, step for step: a step's backwards run during the next,
// a checkpoint step drains, a change of K drains, the run ends drained. The weights are not
// whole-model training's (each stage before the last applies its gradients a step late).
TEST(StagePeer, FourCnnPeersUnderTheAsyncScheduleTrainLikeTheInProcessPipeline) {
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  const std::string cuts = "pool1,pool2,fc1";
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition(cut_list(cuts));
  Rng rng(5);
  const int64_t n = 32, batch = 8;
  const Tensor images = random_tensor(Shape{n, 28, 28, 1}, rng, 0.0f, 1.0f);
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>(rng.below(10)));
  // The run: steps of K = 4, a checkpoint at step 3, two steps of K = 2 (the step in flight
  // drained first), then K = 4 again, and the end.
  const std::vector<uint32_t> ks{4, 4, 4, 4, 4, 2, 2, 4, 4};
  const uint64_t checkpoint_step = 3;
  // A learning-rate schedule: each update at the factor of the step it runs in (a drain before
  // a change of K at the next step's, as one process sets it before the step).
  const auto factor = [](std::size_t step) { return 1.0f - 0.06f * static_cast<float>(step); };
  const auto rows_of = [&](std::size_t step) { return images.slice_batch(static_cast<int64_t>(step) * batch % n, batch); };
  const auto labels_of = [&](std::size_t step) { return labels.data() + static_cast<int64_t>(step) * batch % n; };
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network init(graph, *backend, 11);

  std::vector<PeerStage> local;
  std::vector<Network*> nets;
  std::vector<Optimizer*> opts;
  for (const Graph& g : parts) {
    local.push_back(make_stage(g, init));
    nets.push_back(local.back().net.get());
    opts.push_back(local.back().opt.get());
  }
  LocalPipeline pipeline(nets, opts, {.schedule = "async"});
  double local_loss = 0;
  for (std::size_t step = 0; step < ks.size(); ++step) {
    for (Optimizer* o : opts) o->set_lr_scale(factor(step));
    local_loss += pipeline.train_step(rows_of(step), labels_of(step), static_cast<int>(ks[step])).loss_sum;
    if (step == checkpoint_step) pipeline.flush();
  }
  pipeline.flush();
  {  // the in-process pipeline's asynchronous weights are not whole-model training's
    PeerStage whole = make_stage(graph, init);
    LocalPipeline sync({whole.net.get()}, {whole.opt.get()});
    for (std::size_t step = 0; step < ks.size(); ++step)
      (void)sync.train_step(rows_of(step), labels_of(step), static_cast<int>(ks[step]));
    EXPECT_GT(max_diff(*local[0].net, *whole.net), 1e-4f) << "the test would not tell async from sync";
  }

  AsyncStashSchedule schedule;
  PeerChain chain(spec, graph, cuts, parts, init, schedule, batch, 4);
  std::vector<std::vector<uint64_t>> saved(parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i)
    chain.peers[i]->on_checkpoint([&saved, &chain, i](uint64_t step) {
      EXPECT_FALSE(chain.peers[i]->in_flight()) << "a checkpoint holds no step in flight";
      saved[i].push_back(step);
    });
  StepStats peer_total, evaluation;
  std::vector<int64_t> returned;  // the samples each train_step reported
  chain.run([&](StagePeer& peer) {
    for (std::size_t step = 0; step < ks.size(); ++step) {
      const std::vector<Tensor> x{rows_of(step)};
      const StepStats st =
          peer.train_step({step, static_cast<uint32_t>(batch), ks[step], factor(step), step == checkpoint_step}, x, labels_of(step));
      returned.push_back(st.samples);
      peer_total.loss_sum += st.loss_sum;
      peer_total.samples += st.samples;
    }
    EXPECT_TRUE(peer.in_flight());
    EXPECT_EQ(error_of([&] { peer.finish("done"); }), "[stage] step 8 is in flight: drain() before finish()");
    const StepStats last = peer.drain();
    returned.push_back(last.samples);
    peer_total.loss_sum += last.loss_sum;
    peer_total.samples += last.samples;
    EXPECT_EQ(peer.drain().samples, 0) << "nothing in flight after a drain";
    const std::vector<Tensor> x{rows_of(0)};
    evaluation = peer.evaluate(x, labels_of(0), 0);
    peer.finish("done");
  });
  std::vector<PeerStage>& stages = chain.stages;
  // Step 0 reports nothing (its backwards run in step 1); step 3 reports steps 2 and 3 (a
  // checkpoint drains); step 4 none; step 5 (K = 2) step 4 drained, and none of its own.
  EXPECT_EQ(returned, (std::vector<int64_t>{0, 8, 8, 16, 0, 8, 8, 8, 8, 8}));
  EXPECT_EQ(peer_total.samples, static_cast<int64_t>(ks.size()) * batch);
  EXPECT_NEAR(peer_total.loss_sum, local_loss, 1e-4 * local_loss);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    EXPECT_LE(max_diff(*stages[i].net, *local[i].net), 1e-5f) << "stage " << i;
    EXPECT_EQ(saved[i], std::vector<uint64_t>{checkpoint_step + 1}) << "stage " << i;
  }
  EXPECT_EQ(evaluation.samples, batch);
  const StepStats local_eval = pipeline.evaluate(rows_of(0), labels_of(0), batch);
  EXPECT_EQ(evaluation.correct, local_eval.correct);
  EXPECT_NEAR(evaluation.loss_sum, local_eval.loss_sum, 1e-4 * std::max(1.0, local_eval.loss_sum));
}

// The middle of three stages of the CNN (cuts pool1, pool2) under `Schedule`, between two
// scripted neighbours (or a given downstream link), not yet linked.
template <class Schedule>
struct ScriptedMiddle {
  ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  Graph graph = Graph::build(spec);
  std::vector<Graph> parts = graph.partition({"pool1", "pool2"});
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network init{graph, *backend, 3};
  PeerStage stage = make_stage(parts[1], init);
  Schedule schedule;
  StagePlan plan = make_stage_plan(spec.binary, graph, "pool1,pool2", parts, 1, schedule, 8, 2);
  std::unique_ptr<MemoryLink> before, up, down, after;  // the scripted parties' ends, and the stage's
  std::unique_ptr<StagePeer> peer;
  MessageWriter writer;
  explicit ScriptedMiddle(StageLink* downstream = nullptr) {
    std::tie(before, up) = MemoryLink::pair();
    std::tie(down, after) = MemoryLink::pair();
    peer = std::make_unique<StagePeer>(*stage.stage, schedule, plan, up.get(), downstream ? downstream : down.get());
  }
};

// Under the asynchronous schedule, linked (from step 0).
struct AsyncMiddle : ScriptedMiddle<AsyncStashSchedule> {
  AsyncMiddle() {
    before->send(writer.stage_hello(said(plan, schedule, 0, 3, 0)));
    after->send(writer.stage_hello(said(plan, schedule, 2, 3, 0)));
    EXPECT_EQ(peer->connect({}), 0u);
    (void)before->receive("the answer");
    (void)after->receive("the hello");
  }
  // Micro-batch `mb` of a step of 8 samples in `k`: pool1's output, ones.
  void activations(uint64_t step, uint32_t mb, uint32_t k = 2) {
    Tensor t = Tensor::empty(parts[1].inputs()[0].shape.batched(8 / k));
    t.fill(1.0f);
    const std::vector<int32_t> labels(8 / k, 1);
    before->send(writer.activations({step, 8, k, 1.0f, false}, 0, mb, 0, t, labels, nullptr));
  }
  // Step `step`'s two micro-batches, followed: they go down, their backwards wait.
  void step(uint64_t step) {
    activations(step, 0);
    activations(step, 1);
    StepStats s;
    ASSERT_TRUE(peer->follow_step(s));
    for (int mb = 0; mb < 2; ++mb) (void)after->receive("activations");
  }
  void gradients(uint64_t step, uint32_t mb) {
    Tensor g = Tensor::empty(stage.net->output(0).shape());
    g.fill(0.01f);
    after->send(writer.gradients(2, step, mb, 0, g, 1.0f, 1));
  }
  std::string follow() {
    StepStats s;
    return error_of([&] { peer->follow_step(s); });
  }
};

// A middle stage records its end, then passes Bye down and answers Bye up only once the stage
// after has recorded its own (its Bye back); anything else in its place is refused.
TEST(StagePeer, AMiddleStageRecordsItsEndThenAnswersByeOnceTheStageAfterHasRecordedItsOwn) {
  {
    AsyncMiddle t;
    const uint64_t down0 = t.down->sent, up0 = t.up->sent;  // the StageHellos
    std::vector<bool> recorded;
    t.peer->on_end([&](uint64_t steps, bool acknowledged) {
      EXPECT_EQ(steps, 0u);
      recorded.push_back(acknowledged);
      EXPECT_EQ(t.up->sent, up0) << "Bye went up before the end was recorded";
      if (!acknowledged) {
        EXPECT_EQ(t.down->sent, down0) << "Bye went down before this stage recorded its end";
        t.after->send(t.writer.bye("recorded"));  // the stage after's answer
      } else {
        EXPECT_EQ(t.down->sent, down0 + 1) << "the Bye down";
      }
    });
    t.before->send(t.writer.bye("done"));
    StepStats s;
    EXPECT_FALSE(t.peer->follow_step(s));
    EXPECT_EQ(recorded, (std::vector<bool>{false, true}));
    const Frame down = t.after->receive("the Bye passed down");
    EXPECT_EQ(wire::GetMessage(down.data())->payload_type(), wire::Payload::Bye);
    const Frame bye = t.before->receive("the Bye back");
    EXPECT_EQ(wire::GetMessage(bye.data())->payload_type(), wire::Payload::Bye);
  }
  {
    AsyncMiddle t;
    t.before->send(t.writer.bye("done"));
    t.after->send(t.writer.stage_hello(said(t.plan, t.schedule, 2, 3, 0)));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the next stage's message: expected Bye after this stage's Bye, got StageHello");
    EXPECT_EQ(t.down->refused.code, wire::ErrorCode::UnexpectedMessage);
  }
  {  // an end that cannot be recorded: nothing goes down, nor up
    AsyncMiddle t;
    t.peer->on_end([](uint64_t, bool) { fail("test", "the disk is full"); });
    t.before->send(t.writer.bye("done"));
    EXPECT_EQ(t.follow(), "[test] the disk is full");
    t.down->close();
    t.up->close();
    EXPECT_EQ(error_of([&] { (void)t.after->receive("a Bye"); }), "the link closed while awaiting a Bye");
    EXPECT_EQ(error_of([&] { (void)t.before->receive("a Bye"); }), "the link closed while awaiting a Bye");
  }
  {  // the stage after is lost before it answers: a lost link, and the run starts again
    AsyncMiddle t;
    t.before->send(t.writer.bye("done"));
    t.after->close();
    StepStats s;
    try {
      t.peer->follow_step(s);
      ADD_FAILURE() << "no LinkLost";
    } catch (const LinkLost& e) {
      EXPECT_STREQ(e.what(), "the link closed while awaiting the stages after to record the run's end");
    }
  }
}

// Under gpipe, the stage before's StageHello (proposing step 4) sent, not yet linked.
struct UnlinkedMiddle : ScriptedMiddle<GPipeSchedule> {
  explicit UnlinkedMiddle(StageLink* downstream = nullptr) : ScriptedMiddle(downstream) {
    before->send(writer.stage_hello(said(plan, schedule, 0, 3, 4)));
  }
  wire::Payload answer_up(std::string* reason = nullptr) {
    const Frame f = before->receive("the answer");
    const wire::Message* m = wire::GetMessage(f.data());
    if (reason && m->payload_as_Bye()) *reason = m->payload_as_Bye()->reason()->str();
    return m->payload_type();
  }
};

// A link whose party cannot be reached: it ended its run and went away.
struct GoneLink final : StageLink {
  void open() override { throw LinkUnreachable("[stage] cannot reach the party after"); }
  void send(std::span<const uint8_t>) override {}
  Frame receive(const char* awaiting) override { throw LinkLost(cat("nothing to await ", awaiting)); }
  void refuse(const WireError&) override {}
};

// A stage that recorded the run's end in an earlier process (set_ended) and links again: the
// last stage has ended; a middle one has where the stage after answers its StageHello with Bye
// or cannot be reached; then the stage before is answered Bye and nothing trains. Where the
// stage after answers a StageHello the run goes on from the newest checkpoint; and a stage
// without the record is refused a Bye.
TEST(StagePeer, AStageThatRecordedTheRunsEndLinksAgainAndFindsOutWhetherTheStagesAfterEndedToo) {
  {
    LastStage t;
    t.peer->set_ended(5, false);  // the last stage's record needs no answer
    t.send(t.writer.stage_hello(said(t.plan, t.schedule, 0, 2, 4)));
    EXPECT_EQ(t.peer->connect({}), 5u);
    EXPECT_TRUE(t.peer->ended());
    const Frame f = t.before->receive("the answer");
    const wire::Message* m = wire::GetMessage(f.data());
    ASSERT_EQ(m->payload_type(), wire::Payload::Bye);
    EXPECT_EQ(m->payload_as_Bye()->reason()->str(), "the run ended at step 5 at stage 1 and every stage after it");
  }
  {
    UnlinkedMiddle t;
    t.peer->set_ended(6, false);
    t.after->send(t.writer.bye("the run ended at step 6 at stage 2 and every stage after it"));
    EXPECT_EQ(t.peer->connect({}), 6u);
    EXPECT_TRUE(t.peer->ended());
    EXPECT_EQ(t.peer->next_step(), 6u);
    std::string reason;
    EXPECT_EQ(t.answer_up(&reason), wire::Payload::Bye);
    EXPECT_EQ(reason, "the run ended at step 6 at stage 1 and every stage after it");
  }
  {
    GoneLink gone;
    UnlinkedMiddle t(&gone);
    t.peer->set_ended(6, true);
    EXPECT_EQ(t.peer->connect({}), 6u);
    EXPECT_TRUE(t.peer->ended());
    EXPECT_EQ(t.answer_up(), wire::Payload::Bye);
  }
  {  // an end the stages after never answered: they may be down before recording theirs
    GoneLink gone;
    UnlinkedMiddle t(&gone);
    t.peer->set_ended(6, false);
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }), "[stage] cannot reach the party after");
    EXPECT_FALSE(t.peer->ended());
  }
  {  // the stage after lost its state before recording its end: the run goes on, and the
     // record is dropped (a later lost link is no end)
    UnlinkedMiddle t;
    t.peer->set_ended(6, true);
    bool dropped = false;
    t.peer->on_resume([&] {
      dropped = true;
      EXPECT_EQ(t.up->sent, 0u) << "the stage before heard the run goes on before the record was dropped";
    });
    t.after->send(t.writer.stage_hello(said(t.plan, t.schedule, 2, 3, 0)));
    EXPECT_EQ(t.peer->connect({}), 0u);
    EXPECT_FALSE(t.peer->ended());
    EXPECT_TRUE(dropped);
    EXPECT_EQ(t.answer_up(), wire::Payload::StageHello);
    t.peer->reset();
    t.before->send(t.writer.stage_hello(said(t.plan, t.schedule, 0, 3, 0)));
    t.after->send(t.writer.bye("ended"));
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
              "[stage] stage 1 refused the next stage's message: the stages after have ended the run, but stage 1 has "
              "no record of its end: start every party again from empty checkpoint-dirs");
  }
  {  // no record here
    GoneLink gone;
    UnlinkedMiddle t(&gone);
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }), "[stage] cannot reach the party after");
  }
  {
    UnlinkedMiddle t;
    t.after->send(t.writer.bye("ended"));
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
              "[stage] stage 1 refused the next stage's message: the stages after have ended the run, but stage 1 has "
              "no record of its end: start every party again from empty checkpoint-dirs");
    EXPECT_EQ(t.down->refused.code, wire::ErrorCode::UnexpectedMessage);
  }
}

TEST(StagePeer, AMiddleStageUnderTheAsyncScheduleKeepsAStepInFlightUntilDrainArrives) {
  AsyncMiddle t;
  t.step(0);
  EXPECT_TRUE(t.peer->in_flight());
  EXPECT_EQ(t.peer->next_step(), 1u);
  EXPECT_EQ(t.peer->weight_version(), 0u) << "no update before step 0's backwards";
  // Drain: passed on down first, then step 0 backed up with the next stage's gradients, which
  // go up, and the update.
  t.gradients(0, 0);
  t.gradients(0, 1);
  t.before->send(t.writer.drain(0, 0));
  t.before->send(t.writer.bye("done"));
  t.after->send(t.writer.bye("recorded"));  // the stage after's end, recorded
  StepStats s;
  EXPECT_FALSE(t.peer->follow_step(s));
  const Frame drain = t.after->receive("Drain");
  const wire::Message* m = wire::GetMessage(drain.data());
  ASSERT_EQ(m->payload_type(), wire::Payload::Drain);
  EXPECT_EQ(m->payload_as_Drain()->step(), 0u);
  EXPECT_EQ(m->payload_as_Drain()->stage(), 1u);
  for (uint32_t mb = 0; mb < 2; ++mb) {
    const Frame g = t.before->receive("Gradients");
    const wire::Message* gm = wire::GetMessage(g.data());
    ASSERT_EQ(gm->payload_type(), wire::Payload::Gradients);
    EXPECT_EQ(gm->payload_as_Gradients()->step(), 0u);
    EXPECT_EQ(gm->payload_as_Gradients()->microbatch(), mb);
  }
  EXPECT_FALSE(t.peer->in_flight());
  EXPECT_EQ(t.peer->weight_version(), 1u);
  EXPECT_GT(max_diff(*t.stage.net, t.init), 0.0f) << "the update ran";
}

// A lost link while a backward of the step in flight runs on the stashed weights: reset()
// puts the current weights back and drops the step in flight.
TEST(StagePeer, ALostLinkUnderTheAsyncScheduleDropsTheStepInFlightAndKeepsTheCurrentWeights) {
  AsyncMiddle t;
  t.step(0);
  t.gradients(0, 0);
  t.gradients(0, 1);
  t.step(1);  // backs step 0 up on its stash, then the update: the current weights differ from the stash
  EXPECT_EQ(t.peer->weight_version(), 1u);
  Network current(t.parts[1], *t.backend, 0);
  copy_params(current, *t.stage.net);
  t.activations(2, 0);
  t.after->close();  // step 2's first action, step 1's backward of micro-batch 0, waits in vain
  StepStats s;
  bool lost = false;
  try {
    t.peer->follow_step(s);
  } catch (const LinkLost&) {
    lost = true;
  }
  EXPECT_TRUE(lost);
  EXPECT_TRUE(t.peer->in_flight());
  t.peer->reset();
  EXPECT_FALSE(t.peer->in_flight());
  EXPECT_EQ(max_diff(*t.stage.net, current), 0.0f) << "the stashed weights were left in place";
}

TEST(StagePeerBadInput, AStepInFlightRefusesAnotherKAnEvaluationAByeAndAWrongDrain) {
  {
    AsyncMiddle t;
    t.step(0);
    t.activations(1, 0, 1);
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: step 1 with K = 1 while step 0's "
                          "backwards (K = 2) are in flight: the first stage sends Drain first");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::OutOfWindow);
  }
  {
    AsyncMiddle t;
    t.step(0);
    Tensor x = Tensor::empty(t.parts[1].inputs()[0].shape.batched(4));
    x.fill(1.0f);
    t.before->send(t.writer.activations({1, 8, 2, 1.0f, false, true, 0}, 0, 0, 0, x, std::vector<int32_t>(4, 1), nullptr));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: an evaluation batch while step 0's "
                          "backwards (K = 2) are in flight: the first stage sends Drain first");
  }
  {
    AsyncMiddle t;
    t.step(0);
    t.before->send(t.writer.bye("done"));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: Bye while step 0's backwards are in "
                          "flight: the first stage sends Drain before it ends the run");
  }
  {
    AsyncMiddle t;
    t.step(0);
    t.before->send(t.writer.drain(0, 7));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: Drain of step 7 reached stage 1, "
                          "whose step in flight is 0");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::UnexpectedMessage);
  }
  {
    AsyncMiddle t;
    t.step(0);
    t.before->send(t.writer.drain(0, 0, 1000.0f));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: Drain of step 0 asks for a "
                          "learning-rate scale of 1000, outside [0, 100]");
    EXPECT_EQ(t.up->refused.code, wire::ErrorCode::BadTensor);
  }
  {
    AsyncMiddle t;
    t.before->send(t.writer.drain(0, 0));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: Drain of step 0 reached stage 1, "
                          "whose step in flight is none");
  }
  {
    AsyncMiddle t;
    t.step(0);
    t.activations(1, 0);
    t.before->send(t.writer.drain(0, 0));
    t.gradients(0, 0);  // step 1 runs B0' F0 B1' F1: step 0's backwards come first
    t.gradients(0, 1);
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: Drain within step 1: a step in "
                          "flight drains between steps");
  }
  {  // a gradient of the step being forwarded, where the step in flight's is awaited
    AsyncMiddle t;
    t.step(0);
    t.activations(1, 0);
    t.activations(1, 1);
    t.gradients(1, 0);
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the next stage's message: step 1 micro-batch 0 is outside the "
                          "window (step 0, micro-batches 0..1)");
    EXPECT_EQ(t.down->refused.code, wire::ErrorCode::OutOfWindow);
  }
  {  // a synchronous plan has no step in flight
    LastStage t;
    t.hello();
    t.send(t.writer.drain(0, 0));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: Drain in a plan whose gpipe schedule "
                          "keeps no step in flight");
  }
}

TEST(StagePeerFilters, TheAsyncScheduleRefusesFiltersOnItsLinks) {
  AsyncMiddle t;
  CutNoiseFilter filter(1.0f, 0.5f, 1);
  EXPECT_EQ(error_of([&] { t.peer->set_filters({&filter}, {}); }),
            "[stage] " + std::string(filter.name()) + " keeps one step's state per micro-batch; the async schedule has "
            "two steps in flight: use gpipe or 1f1b with filters on the links");
}

// The first of two stages of the CNN (cut pool2), facing a scripted stage after it: what it
// takes back for an evaluation batch.
TEST(StagePeerBadInput, EvaluatedOfAnotherStageStepOrMicroBatchTwiceOrImpossibleIsRefused) {
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition({"pool2"});
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network init{graph, *backend, 3};
  GPipeSchedule schedule;
  const StagePlan plan = make_stage_plan(spec.binary, graph, "pool2", parts, 0, schedule, 8, 2);
  Rng rng(2);
  const std::vector<Tensor> x{random_tensor(Shape{8, 28, 28, 1}, rng, 0.0f, 1.0f)};
  const std::vector<int32_t> labels(8, 1);
  MessageWriter writer;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<std::function<std::span<const uint8_t>()>> replies;
    std::string error;
  };
  const std::vector<Case> cases{
      {{[&] { return writer.evaluated(5, 0, 0, 1.0f, 1); }},
       "[stage] stage 0 refused the next stage's message: an evaluation result named stage 5 reached stage 0"},
      {{[&] { return writer.evaluated(1, 3, 0, 1.0f, 1); }},
       "[stage] stage 0 refused the next stage's message: step 3 micro-batch 0 is outside the window (step 0, "
       "micro-batches 0..1)"},
      {{[&] { return writer.evaluated(1, 0, 0, 1.0f, 1); }, [&] { return writer.evaluated(1, 0, 0, 1.0f, 1); }},
       "[stage] stage 0 refused the next stage's message: an evaluation result of micro-batch 0 that was not awaited"},
      {{[&] { return writer.evaluated(1, 0, 0, 1.0f, 5); }},
       "[stage] stage 0 refused the next stage's message: evaluation micro-batch 0's loss 1 or correct count 5 is "
       "impossible"},
      {{[&] { return writer.evaluated(1, 0, 1, nan, 1); }},
       "[stage] stage 0 refused the next stage's message: evaluation micro-batch 1's loss nan or correct count 1 is "
       "impossible"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    PeerStage stage = make_stage(parts[0], init);
    auto [down, after] = MemoryLink::pair();
    StagePeer peer(*stage.stage, schedule, plan, nullptr, down.get());
    after->send(writer.stage_hello(said(plan, schedule, 1, 2, 0)));
    EXPECT_EQ(peer.connect({}), 0u);
    for (const auto& reply : c.replies) after->send(reply());
    EXPECT_EQ(error_of([&] { peer.evaluate(x, labels.data(), 0); }), c.error);
    EXPECT_EQ(down->refused.code, c.error.find("window") != std::string::npos || c.error.find("awaited") != std::string::npos
                                      ? wire::ErrorCode::OutOfWindow
                                  : c.error.find("impossible") != std::string::npos ? wire::ErrorCode::BadTensor
                                                                                    : wire::ErrorCode::UnexpectedMessage);
  }
}

// Two first parties (hospitals) share the CNN's later three stages: member m leads the steps
// g with g mod 2 = m, on its own data and its own first-stage weights. That equals two
// in-process pipelines sharing those three stages' networks, stepped in turns. A checkpoint
// asked for in round 1 is saved at every stage labelled with the round's end (step 4), and
// each member's evaluation runs its own first stage through the shared ones. With
// `average_every` the first stages are averaged after every such round and, called at the
// end, once more (when rounds were trained since).
void expect_members_train_like_pipelines_in_turns(uint32_t average_every, int own_steps) {
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  const std::string cuts = "pool1,pool2,fc1";
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition(cut_list(cuts));
  constexpr uint32_t kMembers = 2, kK = 4;
  const int64_t n = 32, batch = 8;
  const uint64_t checkpoint_round = 1;
  Rng rng(7);
  std::vector<Tensor> images;
  std::vector<std::vector<int32_t>> labels(kMembers);
  for (uint32_t m = 0; m < kMembers; ++m) {
    images.push_back(random_tensor(Shape{n, 28, 28, 1}, rng, 0.0f, 1.0f));
    for (int64_t i = 0; i < n; ++i) labels[m].push_back(static_cast<int32_t>(rng.below(10)));
  }
  const auto rows_of = [&](uint32_t m, int j) { return images[m].slice_batch(j * batch % n, batch); };
  const auto labels_of = [&](uint32_t m, int j) { return labels[m].data() + j * batch % n; };
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network init(graph, *backend, 11);

  // The reference: a front per member, the later stages' networks shared by both pipelines.
  std::vector<PeerStage> ref;  // fronts 0 and 1, then parts 1 to 3
  for (uint32_t m = 0; m < kMembers; ++m) ref.push_back(make_stage(parts[0], init));
  for (std::size_t i = 1; i < parts.size(); ++i) ref.push_back(make_stage(parts[i], init));
  std::vector<std::unique_ptr<LocalPipeline>> pipelines;
  for (uint32_t m = 0; m < kMembers; ++m) {
    std::vector<Network*> nets{ref[m].net.get()};
    std::vector<Optimizer*> opts{ref[m].opt.get()};
    for (std::size_t i = kMembers; i < ref.size(); ++i) {
      nets.push_back(ref[i].net.get());
      opts.push_back(ref[i].opt.get());
    }
    pipelines.push_back(std::make_unique<LocalPipeline>(nets, opts, LocalPipeline::Options{.schedule = "1f1b"}));
  }
  const auto average_fronts = [&] {  // FedAvg of the two fronts, each once, summed in double
    const std::vector<Param*>& a = ref[0].net->params();
    const std::vector<Param*>& b = ref[1].net->params();
    for (std::size_t k = 0; k < a.size(); ++k)
      for (int64_t i = 0; i < a[k]->value().numel(); ++i) {
        const float v = static_cast<float>(0.5 * a[k]->value().data()[i] + 0.5 * b[k]->value().data()[i]);
        a[k]->value().data()[i] = b[k]->value().data()[i] = v;
      }
    for (Param* p : a) p->bump_version();
    for (Param* p : b) p->bump_version();
  };
  std::vector<std::vector<double>> ref_loss(kMembers);
  int ref_averages = 0;
  for (int j = 0; j < own_steps; ++j) {
    for (uint32_t m = 0; m < kMembers; ++m)
      ref_loss[m].push_back(pipelines[m]->train_step(rows_of(m, j), labels_of(m, j), kK).loss_sum);
    if (average_every > 0 && (j + 1) % static_cast<int>(average_every) == 0) {
      average_fronts();
      ++ref_averages;
    }
  }
  if (average_every > 0 && own_steps % static_cast<int>(average_every) != 0) {  // the run's end
    average_fronts();
    ++ref_averages;
  }
  std::vector<StepStats> ref_eval;
  for (uint32_t m = 0; m < kMembers; ++m) ref_eval.push_back(pipelines[m]->evaluate(rows_of(m, 0), labels_of(m, 0), batch));

  // The parties: two members, then the shared stage and two more.
  OneFOneBSchedule schedule;
  std::vector<PeerStage> st;
  for (uint32_t m = 0; m < kMembers; ++m) st.push_back(make_stage(parts[0], init));
  for (std::size_t i = 1; i < parts.size(); ++i) st.push_back(make_stage(parts[i], init));
  std::vector<std::unique_ptr<MemoryLink>> member_down(kMembers), shared_up(kMembers), downs(3), ups(3);
  for (uint32_t m = 0; m < kMembers; ++m) std::tie(member_down[m], shared_up[m]) = MemoryLink::pair();
  for (std::size_t i = 0; i + 1 < downs.size(); ++i) std::tie(downs[i], ups[i + 1]) = MemoryLink::pair();
  const auto plan_of = [&](std::size_t index, uint32_t member) {
    StagePlan plan = make_stage_plan(spec.binary, graph, cuts, parts, index, schedule, batch, kK, wire::DType::F32,
                                     true, "", FirstParties{kMembers, average_every});
    plan.member = member;
    return plan;
  };
  std::vector<std::unique_ptr<StagePeer>> peers;  // members 0 and 1, then stages 1 to 3
  for (uint32_t m = 0; m < kMembers; ++m)
    peers.push_back(std::make_unique<StagePeer>(*st[m].stage, schedule, plan_of(0, m), nullptr, member_down[m].get()));
  const std::vector<StageLink*> member_links{shared_up[0].get(), shared_up[1].get()};
  peers.push_back(std::make_unique<StagePeer>(*st[2].stage, schedule, plan_of(1, 0),
                                              std::span<StageLink* const>(member_links), downs[0].get()));
  if (average_every > 0) {  // the shared stage checks the members' weights against the first stage's
    NamedTensors front;
    for (Param* p : st[0].net->params()) front.emplace_back(p->name(), p->value());
    peers.back()->set_first_stage(front);
  }
  peers.push_back(std::make_unique<StagePeer>(*st[3].stage, schedule, plan_of(2, 0), ups[1].get(), downs[1].get()));
  peers.push_back(std::make_unique<StagePeer>(*st[4].stage, schedule, plan_of(3, 0), ups[2].get(), nullptr));
  std::vector<std::vector<uint64_t>> saved(peers.size());
  for (std::size_t p = 0; p < peers.size(); ++p) peers[p]->on_checkpoint([&saved, p](uint64_t step) { saved[p].push_back(step); });
  // Every party's links, closed when it fails so the others end too.
  const std::vector<std::vector<MemoryLink*>> links_of{{member_down[0].get()},
                                                       {member_down[1].get()},
                                                       {shared_up[0].get(), shared_up[1].get(), downs[0].get()},
                                                       {ups[1].get(), downs[1].get()},
                                                       {ups[2].get()}};
  std::vector<std::vector<double>> losses(kMembers);
  std::vector<StepStats> evals(kMembers);
  std::vector<int> followed(peers.size(), 0), evaluated(peers.size(), 0);
  std::vector<std::exception_ptr> errors(peers.size());
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < peers.size(); ++p)
    threads.emplace_back([&, p] {
      try {
        StagePeer& peer = *peers[p];
        EXPECT_EQ(peer.connect({}), 0u);
        if (p < kMembers) {
          const auto m = static_cast<uint32_t>(p);
          EXPECT_EQ(peer.next_step(), m) << "a member's first turn";
          for (int j = 0; j < own_steps; ++j) {
            const std::vector<Tensor> x{rows_of(m, j)};
            const uint64_t step = static_cast<uint64_t>(j) * kMembers + m;
            losses[m].push_back(peer.train_step({step, static_cast<uint32_t>(batch), kK, 1.0f,
                                                 static_cast<uint64_t>(j) == checkpoint_round},
                                                x, labels_of(m, j)).loss_sum);
          }
          EXPECT_EQ(peer.own_steps(), static_cast<uint64_t>(own_steps));
          if (average_every > 0) {
            EXPECT_EQ(peer.average(), own_steps % static_cast<int>(average_every) != 0);
            EXPECT_FALSE(peer.average()) << "nothing trained since";
            EXPECT_EQ(peer.averages(), static_cast<uint32_t>(ref_averages));
          }
          const std::vector<Tensor> x{rows_of(m, 0)};
          evals[m] = peer.evaluate(x, labels_of(m, 0), 0);
          peer.finish("done");
          return;
        }
        StepStats s;
        while (peer.follow_step(s)) (peer.evaluated() ? evaluated : followed)[p] += 1;
      } catch (...) {
        errors[p] = std::current_exception();
        for (MemoryLink* l : links_of[p]) l->close();
      }
    });
  for (std::thread& t : threads) t.join();
  for (std::size_t p = 0; p < peers.size(); ++p)
    if (errors[p]) ADD_FAILURE() << "party " << p << ": " << error_of([&] { std::rethrow_exception(errors[p]); });

  for (uint32_t m = 0; m < kMembers; ++m) {
    ASSERT_EQ(losses[m].size(), static_cast<std::size_t>(own_steps));
    for (int j = 0; j < own_steps; ++j)
      EXPECT_NEAR(losses[m][j], ref_loss[m][j], 1e-4 * std::max(1.0, ref_loss[m][j])) << "member " << m << " step " << j;
    EXPECT_EQ(evals[m].samples, batch);
    EXPECT_EQ(evals[m].correct, ref_eval[m].correct) << "member " << m;
    EXPECT_NEAR(evals[m].loss_sum, ref_eval[m].loss_sum, 1e-4 * std::max(1.0, ref_eval[m].loss_sum)) << "member " << m;
  }
  for (std::size_t p = 0; p < peers.size(); ++p) {
    EXPECT_LE(max_diff(*st[p].net, *ref[p].net), 1e-5f) << "party " << p;
    EXPECT_EQ(saved[p], std::vector<uint64_t>{(checkpoint_round + 1) * kMembers}) << "party " << p;
  }
  for (std::size_t p = kMembers; p < peers.size(); ++p) {
    EXPECT_EQ(followed[p], own_steps * static_cast<int>(kMembers)) << "party " << p;
    EXPECT_EQ(evaluated[p], static_cast<int>(kMembers)) << "party " << p;
    EXPECT_EQ(peers[p]->next_step(), static_cast<uint64_t>(own_steps) * kMembers);
  }
  if (average_every == 0)
    EXPECT_GT(max_diff(*st[0].net, *st[1].net), 1e-3f) << "each member trains its own first stage";
  else
    EXPECT_EQ(max_diff(*st[0].net, *st[1].net), 0.0f) << "the members end on one average";
  EXPECT_EQ(peers[kMembers]->averages(), static_cast<uint32_t>(ref_averages));
  EXPECT_GT(max_diff(*st[0].net, init), 1e-3f) << "the weights moved";
}

TEST(StagePeer, TwoFirstPartiesTakeTurnsOnSharedCnnStagesLikeInProcessPipelinesInTurns) {
  expect_members_train_like_pipelines_in_turns(0, 4);
}

// FedAvg after rounds 2 and 4, and at the end after round 5: the members' first stages end
// equal, and every step equals the pipelines in turns averaged the same way.
TEST(StagePeer, TwoFirstPartiesAveragingTheirFirstStagesOnSharedCnnStagesLikePipelinesInTurns) {
  expect_members_train_like_pipelines_in_turns(2, 5);
}

// The loss stage of the CNN cut at pool2, shared by two scripted first parties whose first
// stages are averaged after every round.
struct SharedLastStage {
  ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json");
  Graph graph = Graph::build(spec);
  std::vector<Graph> parts = graph.partition({"pool2"});
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network init{graph, *backend, 3};
  PeerStage stage = make_stage(parts[1], init);
  PeerStage front = make_stage(parts[0], init);
  GPipeSchedule schedule;
  StagePlan plan = make_stage_plan(spec.binary, graph, "pool2", parts, 1, schedule, 8, 2, wire::DType::F32, true, "",
                                   FirstParties{2, 1});
  std::unique_ptr<MemoryLink> before[2], up[2];  // the scripted members' ends, and the stage's
  std::unique_ptr<StagePeer> peer;
  MessageWriter writer;
  SharedLastStage() {
    for (int m = 0; m < 2; ++m) std::tie(before[m], up[m]) = MemoryLink::pair();
    const std::vector<StageLink*> links{up[0].get(), up[1].get()};
    peer = std::make_unique<StagePeer>(*stage.stage, schedule, plan, std::span<StageLink* const>(links), nullptr);
    peer->set_first_stage(weights());
  }
  NamedTensors weights() const {
    NamedTensors out;
    for (Param* p : front.net->params()) out.emplace_back(p->name(), p->value());
    return out;
  }
  void step(int m, uint64_t step) {  // both micro-batches, then the stage runs them
    for (uint32_t mb = 0; mb < 2; ++mb) activations(m, step, mb);
    StepStats s;
    EXPECT_TRUE(peer->follow_step(s));
  }
  void hellos(uint32_t member1_says = 1, uint64_t resume0 = 0, uint64_t epoch1 = 10) {
    before[0]->send(writer.stage_hello(said(plan, schedule, 0, 2, resume0, 0, 10)));
    before[1]->send(writer.stage_hello(said(plan, schedule, 0, 2, 0, member1_says, epoch1)));
  }
  void activations(int m, uint64_t step, uint32_t mb, bool checkpoint = false) {
    Tensor t = Tensor::empty(Shape{4, 7, 7, 64});
    t.fill(1.0f);
    const std::vector<int32_t> labels(4, 1);
    before[m]->send(writer.activations({step, 8, 2, 1.0f, checkpoint}, 0, mb, 0, t, labels, nullptr));
  }
  std::string follow() {
    StepStats s;
    return error_of([&] { peer->follow_step(s); });
  }
};

TEST(StagePeerBadInput, ASharedStageRefusesAMemberOnAnotherMembersLinkResumingWithinARoundOrOfAnotherEpoch) {
  {
    SharedLastStage t;
    t.hellos(0);
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
              "[stage] stage 1 refused the previous stage's message: the first party on the link of member 1 of 2 says "
              "it is member 0: give each first party its own place in the deployment");
    EXPECT_EQ(t.up[1]->refused.code, wire::ErrorCode::ModelMismatch);
  }
  {
    SharedLastStage t;
    t.hellos(1, 3);
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
              "[stage] stage 1 refused the previous stage's message: member 0 proposes step 3, not the end of a round "
              "of 2 steps");
    EXPECT_EQ(t.up[0]->refused.code, wire::ErrorCode::NoCheckpoint);
  }
  {  // members sending in different dtypes, each one the stage takes: one link dtype for all
    SharedLastStage t;
    t.plan.accepts = {wire::DType::F32, wire::DType::F16};
    const std::vector<StageLink*> links{t.up[0].get(), t.up[1].get()};
    t.peer = std::make_unique<StagePeer>(*t.stage.stage, t.schedule, t.plan, std::span<StageLink* const>(links), nullptr);
    t.before[0]->send(t.writer.stage_hello(said(t.plan, t.schedule, 0, 2, 0, 0, 10)));
    StageHelloFields f16 = said(t.plan, t.schedule, 0, 2, 0, 1, 10);
    f16.dtypes = {wire::DType::F16};
    t.before[1]->send(t.writer.stage_hello(f16));
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
              "[stage] stage 1 refused the previous stage's message: member 1 sends f16 and member 0 f32: give every "
              "first party the same wire-dtype");
    EXPECT_EQ(t.up[1]->refused.code, wire::ErrorCode::ModelMismatch);
  }
  {  // members with epochs of different lengths cannot take turns
    SharedLastStage t;
    t.hellos(1, 0, 12);
    EXPECT_EQ(error_of([&] { t.peer->connect({}); }),
              "[stage] stage 1 refused the previous stage's message: member 1 trains 12 steps an epoch and member 0 10: "
              "the first parties take turns, a step each, so each needs as many (give them as many samples: limit in "
              "their sections)");
    EXPECT_EQ(t.up[1]->refused.code, wire::ErrorCode::ModelMismatch);
  }
}

TEST(StagePeerBadInput, ASharedStageTakesEachStepFromTheMemberWhoseTurnItIs) {
  {  // member 0 trains step 0; member 1 then sends step 2, which is member 0's
    SharedLastStage t;
    t.hellos();
    EXPECT_EQ(t.peer->connect({}), 0u);
    for (uint32_t mb = 0; mb < 2; ++mb) t.activations(0, 0, mb);
    StepStats s;
    EXPECT_TRUE(t.peer->follow_step(s));
    EXPECT_EQ(s.samples, 8);
    t.activations(1, 2, 0);  // member 1 trains out of turn
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: activations of step 2 while stage 1 "
                          "trains step 1 next (member 1's turn of 2)");
    EXPECT_EQ(t.up[1]->refused.code, wire::ErrorCode::OutOfWindow);
  }
  {  // member 0 ends its run; member 1 may evaluate and end, not train on
    SharedLastStage t;
    t.hellos();
    EXPECT_EQ(t.peer->connect({}), 0u);
    t.before[0]->send(t.writer.bye("done"));
    t.activations(1, 1, 0);
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: member 1 sent step 1 after another "
                          "first party ended its run: the members train the same number of steps (give each as many "
                          "samples)");
    EXPECT_EQ(t.up[1]->refused.code, wire::ErrorCode::OutOfWindow);
  }
  {  // a checkpoint is the round's last member's to ask for
    SharedLastStage t;
    t.hellos();
    EXPECT_EQ(t.peer->connect({}), 0u);
    t.activations(0, 0, 0, true);
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: step 0 asks for a checkpoint within a "
                          "round: the last member of 2 asks for it, at the round's end");
    EXPECT_EQ(t.up[0]->refused.code, wire::ErrorCode::BadTensor);
  }
  {  // both end: the run ends; member 1 evaluates first, named by its own next step
    SharedLastStage t;
    t.hellos();
    EXPECT_EQ(t.peer->connect({}), 0u);
    t.before[0]->send(t.writer.bye("done"));
    Tensor x = Tensor::empty(Shape{4, 7, 7, 64});
    x.fill(1.0f);
    const std::vector<int32_t> labels(4, 1);
    t.before[1]->send(t.writer.activations({1, 4, 1, 1.0f, false, true, 0}, 0, 0, 0, x, labels, nullptr));
    t.before[1]->send(t.writer.bye("done"));
    StepStats s;
    EXPECT_TRUE(t.peer->follow_step(s));
    EXPECT_TRUE(t.peer->evaluated());
    EXPECT_EQ(s.samples, 4);
    EXPECT_FALSE(t.peer->follow_step(s));
    for (int m = 0; m < 2; ++m) {  // each member hears that every first party has ended its run
      Frame f;
      WireError error;
      const wire::Message* msg = nullptr;
      do {
        f = t.before[m]->receive("Bye");
        msg = verify_frame(f, f.size(), error);
        ASSERT_NE(msg, nullptr) << error.text;
      } while (msg->payload_type() != wire::Payload::Bye);
    }
  }
}

TEST(StagePeerBadInput, ASharedStageTakesTheFirstStagesWeightsOnlyBetweenRoundsAndAsTheyAre) {
  {  // within a round
    SharedLastStage t;
    t.hellos();
    EXPECT_EQ(t.peer->connect({}), 0u);
    t.step(0, 0);
    t.before[1]->send(t.writer.front_weights(0, 8, t.weights(), true));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: FrontWeights from member 1 within "
                          "round 0: the first stages are averaged between rounds, after the last member's step");
    EXPECT_EQ(t.up[1]->refused.code, wire::ErrorCode::UnexpectedMessage);
  }
  {  // before anything was trained
    SharedLastStage t;
    t.hellos();
    EXPECT_EQ(t.peer->connect({}), 0u);
    t.before[0]->send(t.writer.front_weights(0, 0, t.weights(), true));
    EXPECT_EQ(t.follow(), "[stage] stage 1 refused the previous stage's message: FrontWeights after round 0: nothing "
                          "was trained since the last average");
  }
  {  // after round 0 (averaged every round): of another average; a step instead; the wrong tensors
    for (int variant = 0; variant < 3; ++variant) {
      SharedLastStage t;
      t.hellos();
      EXPECT_EQ(t.peer->connect({}), 0u);
      t.step(0, 0);
      if (variant == 0) t.before[0]->send(t.writer.front_weights(5, 8, t.weights(), false));
      if (variant == 1) t.activations(0, 2, 0);
      if (variant == 2) {
        NamedTensors w = t.weights();
        w.pop_back();
        t.before[0]->send(t.writer.front_weights(0, 8, w, false));
      }
      for (uint32_t mb = 0; mb < 2; ++mb) t.activations(1, 1, mb);
      const std::string error = t.follow();
      if (variant == 0) {
        EXPECT_EQ(error, "[stage] stage 1 refused the previous stage's message: member 0's FrontWeights between rounds "
                         "from average 5; stage 1 takes the rounds' average 1 after round 1");
        EXPECT_EQ(t.up[0]->refused.code, wire::ErrorCode::OutOfWindow);
      } else if (variant == 1) {
        EXPECT_EQ(error, "[stage] stage 1 refused the previous stage's message: expected member 0's FrontWeights after "
                         "round 1, got Activations");
        EXPECT_EQ(t.up[0]->refused.code, wire::ErrorCode::UnexpectedMessage);
      } else {
        EXPECT_EQ(error, cat("[stage] stage 1 refused the previous stage's message: weights: ",
                             t.weights().size() - 1, " tensors given, the front shard has ", t.weights().size()));
        EXPECT_EQ(t.up[0]->refused.code, wire::ErrorCode::BadTensor);
      }
    }
  }
  {  // a round's average: both members' weights, the equal-weight average back to each
    SharedLastStage t;
    t.hellos();
    EXPECT_EQ(t.peer->connect({}), 0u);
    t.step(0, 0);
    NamedTensors a = t.weights(), b = t.weights();
    for (auto& [name, v] : a) v = v.clone();
    for (auto& [name, v] : b) {
      v = v.clone();
      for (int64_t i = 0; i < v.numel(); ++i) v.data()[i] += 1.0f;
    }
    t.before[0]->send(t.writer.front_weights(0, 8, a, false));
    for (uint32_t mb = 0; mb < 2; ++mb) t.activations(1, 1, mb);
    t.before[1]->send(t.writer.front_weights(0, 8, b, false));  // after its step
    StepStats s;
    EXPECT_TRUE(t.peer->follow_step(s));
    EXPECT_EQ(t.peer->averages(), 1u);
    for (int m = 0; m < 2; ++m) {
      Frame f;
      WireError error;
      const wire::Message* msg = nullptr;
      do {  // after the step's gradients
        f = t.before[m]->receive("the average");
        msg = verify_frame(f, f.size(), error);
        ASSERT_NE(msg, nullptr) << error.text;
      } while (msg->payload_type() != wire::Payload::Aggregated);
      const wire::Aggregated* agg = msg->payload_as_Aggregated();
      EXPECT_EQ(agg->round(), 1u);
      EXPECT_EQ(agg->edges(), 2u);
      EXPECT_EQ(agg->samples(), 16u);
      std::vector<Tensor> values;
      ASSERT_TRUE(read_named_tensors(f, agg->tensors(), t.weights(), values, error)) << error.text;
      for (std::size_t k = 0; k < values.size(); ++k)
        for (int64_t i = 0; i < values[k].numel(); ++i)
          ASSERT_FLOAT_EQ(values[k].data()[i], a[k].second.data()[i] + 0.5f) << a[k].first;
    }
  }
}

}  // namespace
}  // namespace tandem::test
