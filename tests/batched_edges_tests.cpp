// Many edges, one batch (cloud/session/back_shard_batches.h), in-process: three edges' steps
// on one shared back shard, their micro-batches joined into batches on their sessions'
// threads, equal the same steps run one after another in turns summing three steps an
// update; an edge whose micro-batch overflows the shard is refused alone, and a quiet step
// loses its slot so the others' update goes on.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <functional>
#include <thread>

#include "backends/registry.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/sha256.h"
#include "edge/session/edge_session.h"
#include "test_support.h"

namespace tandem::test {
namespace {

OptimizerOptions sgd() { return {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f, .nesterov = false}; }

constexpr uint32_t kEdges = 3, kBatch = 24, kMicrobatches = 3;

// One back shard and its optimizer, shared in turns or in batches by every edge's session.
// The small split model with batch norm in its back shard (after fc1): batch statistics
// cover a joined batch.
std::string with_batch_norm() {
  std::string spec = kSmallSplitSpec;
  const std::string relu2 = R"({ name: "relu2", op: "relu", inputs: ["fc1"] })";
  spec.replace(spec.find(relu2), relu2.size(),
               R"({ name: "bn", op: "batch_norm", inputs: ["fc1"] }, { name: "relu2", op: "relu", inputs: ["bn"] })");
  return spec;
}

struct Cloud {
  ModelSpec spec;
  Graph graph = Graph::build(spec);
  std::pair<Graph, Graph> shards = graph.split("pool1");
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network back{shards.second, *backend, 5};
  Sgd optimizer{back.params(), sgd()};
  std::unique_ptr<BackShardTrainer> shard;
  BackShardTrainer& trainer;
  // A federation whose rounds never come in these tests: the edges know the shard is shared.
  std::unique_ptr<Federation> federation;
  Cloud(bool batched, double timeout_s = 30.0, double gather_s = 1.0, const std::string& model = kSmallSplitSpec)
      : spec(parse_model_json(model)),
        shard(batched ? std::make_unique<BackShardTrainer>(back, optimizer, timeout_s, kEdges, BackShardTrainer::Batched{gather_s})
                      : std::make_unique<BackShardTrainer>(back, optimizer, timeout_s, kEdges)),
        trainer(*shard) {
    Network front(shards.first, *backend, 9);
    NamedTensors start;
    for (Param* p : front.params()) start.emplace_back(p->name(), p->value().clone());
    federation = std::make_unique<Federation>(start, FederationOptions{.aggregate_every = 1000},
                                              [](uint64_t, std::span<const uint8_t>) {});
  }
};

// One edge: its front shard, its data and its session on the shared shard.
struct Edge {
  std::unique_ptr<Backend> backend = make_backend("reference");
  Network front;
  Sgd optimizer{front.params(), sgd()};
  EdgeSession session;
  CloudSession cloud;
  QuadrantData data;
  Edge(Cloud& c, uint32_t i, wire::DType dtype = wire::DType::F32)
      : front(c.shards.first, *backend, 9),
        session(front, optimizer, kMicrobatches, model_hash(c.spec, "pool1"), cat("edge-", i), {dtype}),
        cloud(c.trainer, {model_hash(c.spec, "pool1"), kBatch, kMicrobatches, 4, 10 + i, kDefaultMaxMessageBytes,
                          CloudSessionConfig{}.dtypes, "pool1", nullptr, c.federation.get()}),
        data(quadrant_data(kBatch, 100 + i)) {}

  CloudReply send(std::span<const uint8_t> bytes) {
    CloudReply r = cloud.handle(Frame::copy_of(bytes.data(), bytes.size()));
    cloud.finish_step();
    return r;
  }
  void handshake() {
    CloudReply r = send(session.hello());
    ASSERT_FALSE(r.close);
    WireError err;
    ASSERT_TRUE(session.on_welcome(Frame::copy_of(r.bytes.data(), r.bytes.size()), err)) << err.text;
  }
  void step() {
    const int k = session.begin_step(data.images, data.labels.data(), 1.0f, false);
    std::vector<Frame> replies;
    for (int mb = 0; mb < k; ++mb) {
      CloudReply r = send(session.forward(mb));
      ASSERT_FALSE(r.close) << "the cloud closed the session of edge " << session_name() << ": " << reply_text(r);
      replies.push_back(Frame::copy_of(r.bytes.data(), r.bytes.size()));
    }
    for (const Frame& f : replies) {
      WireError err;
      bool done = false;
      ASSERT_TRUE(session.on_backward(f, err, done)) << err.text;
    }
  }
  std::string session_name() const { return cloud.client_id(); }
  static std::string reply_text(const CloudReply& r) {
    const Frame f = Frame::copy_of(r.bytes.data(), r.bytes.size());
    WireError err;
    const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
    return m && m->payload_as_Error() ? m->payload_as_Error()->text()->str() : err.text;
  }
};

// F32 activations are read where they arrive; BF16's are decoded into the session's buffer,
// which its next Forward reuses while the batch's weight gradients may still read them.
class BatchedEdgesWire : public ::testing::TestWithParam<wire::DType> {};

TEST_P(BatchedEdgesWire, EdgesStepsInOneBatchEqualTheirStepsInTurns) {
  constexpr int kSteps = 6;
  Cloud in_turns(false), batched(true);
  std::vector<std::unique_ptr<Edge>> a, b;
  for (uint32_t i = 0; i < kEdges; ++i) {
    a.push_back(std::make_unique<Edge>(in_turns, i, GetParam()));
    b.push_back(std::make_unique<Edge>(batched, i, GetParam()));
    a.back()->handshake();
    b.back()->handshake();
  }
  // In turns: edge 0's step, then 1's, then 2's, one update every three.
  for (int s = 0; s < kSteps; ++s)
    for (auto& e : a) e->step();
  // Batched: each edge on its own thread, as the service runs sessions; the barrier keeps
  // every edge's step s in window s, as the turns above did.
  std::barrier each_step(kEdges);
  std::vector<std::thread> threads;
  for (auto& e : b)
    threads.emplace_back([&, edge = e.get()] {
      for (int s = 0; s < kSteps; ++s) {
        each_step.arrive_and_wait();
        edge->step();
      }
    });
  for (auto& t : threads) t.join();

  EXPECT_EQ(in_turns.trainer.updates(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ(batched.trainer.updates(), static_cast<uint64_t>(kSteps));
  EXPECT_LE(max_diff(batched.back, in_turns.back), 2e-5f);
  for (uint32_t i = 0; i < kEdges; ++i) {
    EXPECT_LE(max_diff(b[i]->front, a[i]->front), 2e-5f) << "edge " << i;
    EXPECT_EQ(b[i]->cloud.trained_samples(), a[i]->cloud.trained_samples());
    EXPECT_NEAR(b[i]->cloud.train_loss_sum(), a[i]->cloud.train_loss_sum(), 1e-4);
  }
  // The micro-batches really ran together: every edge's in one batch, once all were known.
  const auto stats = batched.trainer.batch_stats();
  EXPECT_EQ(stats.microbatches, uint64_t{kSteps} * kEdges * kMicrobatches);
  EXPECT_EQ(stats.largest, kEdges);
  // (The first step may run each micro-batch alone: the edges are not known yet.)
  EXPECT_LE(stats.batches, uint64_t{kSteps - 1} * kMicrobatches + kEdges * kMicrobatches)
      << "once every edge is known, each of a step's micro-batches should join all edges";
  EXPECT_EQ(in_turns.trainer.batch_stats().batches, 0u);
}

INSTANTIATE_TEST_SUITE_P(BatchedEdges, BatchedEdgesWire, ::testing::Values(wire::DType::F32, wire::DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Activations near the float range's end overflow the back shard: that edge is refused with
// the reason, its rows reach no weight, and the edges beside it in the batch train on. With
// batch norm in the back shard its overflow spreads to every row of the joined batch, so the
// batch is tried a micro-batch at a time: still only that edge is refused.
std::string overflow_text(uint64_t step, const char* what) {
  return cat("step ", step, " micro-batch 0: the activations overflow the back shard (non-finite ", what,
             "); they are far outside any trained range");
}

// `bad` sends micro-batch 0 of `step` as activations near the float range's end, signed as
// fc1's first row of weights so that its first unit overflows; returns the cloud's reply.
CloudReply send_overflowing(Cloud& c, Edge& bad, uint64_t step) {
  const Tensor& row = c.back.param("fc1.weight").value();  // [24, 96]
  Tensor a = Tensor::empty({8, 4, 4, 6});
  for (int64_t i = 0; i < a.numel(); ++i) a[i] = std::copysign(3e38f, row[i % 96]);
  const int32_t labels[8] = {0, 1, 2, 3, 0, 1, 2, 3};
  MessageWriter w;
  return bad.send(w.forward(step, 0, 0, a, labels, kBatch, kMicrobatches));
}

// The back shard's weights and running statistics (batch norm) as one list of values.
std::vector<float> shard_state(Cloud& c, bool weights) {
  std::vector<float> values;
  if (weights)
    for (const Param* p : c.back.params()) values.insert(values.end(), p->value().data(), p->value().data() + p->value().numel());
  for (const auto& [name, buffer] : c.back.buffers()) values.insert(values.end(), buffer->data(), buffer->data() + buffer->numel());
  return values;
}

void expect_all_finite(const std::vector<float>& values) {
  for (std::size_t i = 0; i < values.size(); ++i) ASSERT_TRUE(std::isfinite(values[i])) << "value " << i;
}

void overflow_in_a_joined_batch(const std::string& model) {
  Cloud c(true, 30.0, /*gather_s=*/1.0, model);
  Edge good(c, 0), bad(c, 1), third(c, 2);
  for (Edge* e : {&good, &bad, &third}) e->handshake();
  auto together = [&](const std::function<void()>& for_bad) {
    std::thread b(for_bad), t([&] { third.step(); });
    good.step();
    b.join();
    t.join();
  };
  together([&] { bad.step(); });  // a first window: every edge is known, so batches wait for all three
  ASSERT_EQ(c.trainer.updates(), 1u);
  const auto before = c.trainer.batch_stats();
  std::string refusal;
  together([&] {
    CloudReply r = send_overflowing(c, bad, 1);
    ASSERT_TRUE(r.close);
    refusal = Edge::reply_text(r);
  });
  // The bad micro-batch came in a batch of all three (then two edges' micro-batches a batch).
  const auto after = c.trainer.batch_stats();
  EXPECT_EQ(after.largest, kEdges);
  EXPECT_EQ(after.batches - before.batches, uint64_t{kMicrobatches});
  EXPECT_EQ(after.microbatches - before.microbatches, uint64_t{kEdges + 2 * (kMicrobatches - 1)});
  // (Through batch norm the loss may stay finite and the gradient overflow instead.)
  EXPECT_TRUE(refusal == overflow_text(1, "loss") || refusal == overflow_text(1, "gradient")) << refusal;
  EXPECT_TRUE(bad.cloud.closed());
  EXPECT_FALSE(good.cloud.closed());
  EXPECT_FALSE(third.cloud.closed());
  // The refused edge's slot is free: the good edge's next step fills the window, and the
  // update is applied with finite weights.
  EXPECT_EQ(c.trainer.updates(), 1u);
  good.step();
  EXPECT_EQ(c.trainer.updates(), 2u);
  // Nor did the refused rows reach batch norm's running statistics (its evaluation).
  expect_all_finite(shard_state(c, true));
}

TEST(BatchedEdges, AnOverflowingMicroBatchEndsOnlyItsEdgesSession) { overflow_in_a_joined_batch(kSmallSplitSpec); }

TEST(BatchedEdges, WithBatchNormAnOverflowingMicroBatchStillEndsOnlyItsEdgesSession) {
  overflow_in_a_joined_batch(with_batch_norm());
}

// The same in turns (no --batch-edges): the refused micro-batch's forward leaves batch norm's
// running statistics as they were, its loss reaches no gradient, and the summed update goes on.
TEST(BatchedEdges, InTurnsAnOverflowingMicroBatchLeavesTheSharedShardAlone) {
  Cloud c(false, 30.0, 1.0, with_batch_norm());
  Edge good(c, 0), bad(c, 1), third(c, 2);
  for (Edge* e : {&good, &bad, &third}) e->handshake();
  good.step();
  const std::vector<float> before = shard_state(c, false);
  CloudReply r = send_overflowing(c, bad, 0);
  ASSERT_TRUE(r.close);
  const std::string refusal = Edge::reply_text(r);
  EXPECT_TRUE(refusal == overflow_text(0, "loss") || refusal == overflow_text(0, "gradient")) << refusal;
  EXPECT_EQ(shard_state(c, false), before) << "the refused micro-batch moved the running statistics";
  // Through batch norm the gradient may overflow with a finite loss: what batch norm added
  // then stays in the open sum, and that window's update is skipped (in turns nothing can
  // undo it; --batch-edges does). The next window's update is applied, with finite weights.
  third.step();
  good.step();  // the third step of the sum
  third.step();
  good.step();
  third.step();  // the next three
  EXPECT_GE(c.trainer.updates(), 1u);
  expect_all_finite(shard_state(c, true));
}

// A step that goes quiet mid-window (its edge hung) loses its slot once another step has
// waited past the timeout; the window completes without it and its session is told.
TEST(BatchedEdges, AQuietStepLosesItsSlotAndTheOthersGoOn) {
  Cloud c(true, /*timeout_s=*/0.1);
  std::atomic<bool> no{false};
  ASSERT_TRUE(c.trainer.begin_step(1, no, 2));
  ASSERT_TRUE(c.trainer.begin_step(2, no, 2));
  ASSERT_TRUE(c.trainer.begin_step(3, no, 2));
  EXPECT_TRUE(c.trainer.finish_step(2, 1.0f));
  EXPECT_TRUE(c.trainer.finish_step(3, 1.0f));
  EXPECT_EQ(c.trainer.updates(), 0u) << "updated while a step of the window was open";
  ASSERT_TRUE(c.trainer.begin_step(2, no, 2));  // the window is full: waits, then 1 loses its slot
  EXPECT_TRUE(c.trainer.was_evicted(1));
  EXPECT_FALSE(c.trainer.step_open(1));
  EXPECT_TRUE(c.trainer.finish_step(2, 1.0f));
  EXPECT_EQ(c.trainer.updates(), 1u);
  std::atomic<bool> cancelled{true};
  EXPECT_TRUE(c.trainer.begin_step(3, cancelled, 2)) << "a free slot is taken even when closing";
  c.trainer.release(3);
  EXPECT_FALSE(c.trainer.step_open(3));
}

// Like turns' queue: a session with a step in the window already leaves the free slot to a
// known session without one for up to the gather time, and takes it when none comes.
TEST(BatchedEdges, ASessionWithAStepInTheWindowLeavesTheFreeSlotToOneWithout) {
  Cloud c(true);
  std::atomic<bool> no{false};
  BackShardTrainer trainer(c.back, c.optimizer, 30.0, 2, BackShardTrainer::Batched{0.3});
  for (uint64_t owner : {1, 2}) ASSERT_TRUE(trainer.begin_step(owner, no, 1));  // both known
  for (uint64_t owner : {1, 2}) ASSERT_TRUE(trainer.finish_step(owner, 1.0f));
  ASSERT_EQ(trainer.updates(), 1u);
  ASSERT_TRUE(trainer.begin_step(1, no, 1));
  ASSERT_TRUE(trainer.finish_step(1, 1.0f));
  std::atomic<bool> again{false};
  std::thread eager([&] { again = trainer.begin_step(1, no, 1); });  // yields to 2
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(trainer.step_open(1)) << "took the slot a session without a step in the window could have";
  ASSERT_TRUE(trainer.begin_step(2, no, 1));
  ASSERT_TRUE(trainer.finish_step(2, 1.0f));  // the window is complete: its update, a new window
  eager.join();
  EXPECT_TRUE(again);
  EXPECT_EQ(trainer.updates(), 2u);
  EXPECT_TRUE(trainer.step_open(1));
  ASSERT_TRUE(trainer.finish_step(1, 1.0f));
  // Now 2 does not come: after the gather time 1 takes the second slot itself.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(trainer.begin_step(1, no, 1));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
  ASSERT_TRUE(trainer.finish_step(1, 1.0f));
  EXPECT_EQ(trainer.updates(), 3u);
}

// Replicas of the shard (replica windows) take a resuming edge only at a round's boundary:
// one whose checkpoint is mid-round is refused with what to give it.
TEST(BatchedEdges, AReplicaRefusesAnEdgeResumingMidRound) {
  Cloud c(true);
  c.trainer.batches()->set_replica_windows(0.0);
  Edge e(c, 0);
  e.session.resume_from(6);
  const CloudReply r = e.send(e.session.hello());
  EXPECT_TRUE(r.close);
  EXPECT_EQ(Edge::reply_text(r),
            "this replica set takes a resuming edge at a round's boundary, and step 6 is none (a round is 1000 steps): "
            "give the edge --checkpoint-every a multiple of 1000 and resume it from there");
}

// The update is the mean of the window's steps' gradients, applied once, when the last
// step of the window finishes; a new window sums from zero.
TEST(BatchedEdges, TheWindowsLastStepAppliesTheMeanOfItsSteps) {
  Cloud c(true);
  std::atomic<bool> no{false};
  auto add_grad = [&](float g) {  // on the host, as no step would: after what the trainer queued
    c.backend->wait();
    for (Param* p : c.back.params())
      for (int64_t i = 0; i < p->grad().numel(); ++i) p->grad()[i] += g;
  };
  Sgd plain{c.back.params(), {.lr = 0.5f, .momentum = 0.0f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false}};
  BackShardTrainer trainer(c.back, plain, 10.0, 3, BackShardTrainer::Batched{0.0});
  const float before = c.back.params()[0]->value()[0];
  add_grad(100.0f);  // stale: the window's first step clears it
  int between = 0;
  for (uint64_t owner = 1; owner <= 3; ++owner) ASSERT_TRUE(trainer.begin_step(owner, no, 1));
  add_grad(6.0f);  // as the three steps' batches would leave it summed
  EXPECT_TRUE(trainer.finish_step(1, 1.0f, [&] { ++between; }));
  EXPECT_TRUE(trainer.finish_step(3, 1.0f, [&] { ++between; }));
  EXPECT_EQ(c.back.params()[0]->value()[0], before) << "updated before the window's steps were complete";
  EXPECT_TRUE(trainer.finish_step(2, 0.5f, [&] { ++between; }));
  EXPECT_NEAR(c.back.params()[0]->value()[0], before - 0.5f * 0.5f * 6.0f / 3.0f, 1e-6f);
  EXPECT_EQ(trainer.updates(), 1u);
  EXPECT_EQ(between, 1);
  EXPECT_TRUE(trainer.finish_step(2, 0.5f)) << "a second finish of the same step does nothing";
  EXPECT_EQ(trainer.updates(), 1u);
}

}  // namespace
}  // namespace tandem::test
