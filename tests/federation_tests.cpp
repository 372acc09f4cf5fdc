// Split-federated rounds in-process: the average is weighted by samples, late edges get the
// newest one, a round closes at its deadline with enough edges or when the rest leave, bad
// FrontWeights are refused with the reason, and turns on the shared back shard are taken
// first come first served with a quiet holder evicted; the back shard's update is applied
// once per step on every path (its own shard, a shared one summing steps, an evicted step).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <thread>

#include "cloud/federation/federation.h"
#include "backends/registry.h"
#include "cloud/session/back_shard_trainer.h"
#include "cloud/session/back_shard_turns.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/wire/messages.h"
#include "test_support.h"

namespace tandem {
namespace {

NamedTensors filled(float a, float b) {
  Tensor w = Tensor::empty({2, 3}), bias = Tensor::empty({2});
  w.fill(a);
  bias.fill(b);
  return {{"conv1.weight", w}, {"conv1.bias", bias}};
}

struct Rounds {
  std::map<uint64_t, std::vector<Frame>> sent;
  Federation federation;
  explicit Rounds(FederationOptions o = {.aggregate_every = 5, .min_edges = 1, .deadline_s = 10.0})
      : federation(filled(0, 0), o, [this](uint64_t c, std::span<const uint8_t> b) {
          sent[c].push_back(Frame::copy_of(b.data(), b.size()));
        }) {}
  // Submits weights (a, b) from `connection`; returns the refusal text ("" when accepted).
  std::string submit(uint64_t connection, const NamedTensors& weights, uint64_t samples, uint64_t max = 1000) {
    MessageWriter w;
    const auto bytes = w.front_weights(0, samples, weights);
    Frame f = Frame::copy_of(bytes.data(), bytes.size());
    WireError err;
    const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
    EXPECT_NE(m, nullptr);
    return federation.submit(connection, f, *m->payload_as_FrontWeights(), max, err) ? "" : err.text;
  }
};

const wire::Aggregated* aggregated(const Frame& f) {
  WireError err;
  const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
  return m ? m->payload_as_Aggregated() : nullptr;
}

float first_value(const Frame& f, int tensor) {
  const auto* a = aggregated(f);
  float v;
  std::memcpy(&v, a->tensors()->Get(static_cast<flatbuffers::uoffset_t>(tensor))->data()->data(), sizeof v);
  return v;
}

TEST(Federation, AverageIsWeightedBySamplesAndReachesEveryEdgeThatSent) {
  Rounds r;
  EXPECT_TRUE(r.federation.join(1, "a").empty());  // no round closed yet
  r.federation.join(2, "b");
  EXPECT_EQ(r.submit(1, filled(1.0f, 10.0f), 100), "");
  EXPECT_TRUE(r.sent.empty());  // waits for b
  EXPECT_EQ(r.submit(2, filled(5.0f, 20.0f), 300), "");
  ASSERT_EQ(r.sent[1].size(), 1u);
  ASSERT_EQ(r.sent[2].size(), 1u);
  const auto* a = aggregated(r.sent[1][0]);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->round(), 1u);
  EXPECT_EQ(a->edges(), 2u);
  EXPECT_EQ(a->samples(), 400u);
  EXPECT_FLOAT_EQ(first_value(r.sent[1][0], 0), 0.25f * 1.0f + 0.75f * 5.0f);
  EXPECT_FLOAT_EQ(first_value(r.sent[2][0], 1), 0.25f * 10.0f + 0.75f * 20.0f);
  EXPECT_EQ(r.federation.round(), 1u);
  // A late edge starts from the newest average.
  const std::vector<uint8_t> late = r.federation.join(3, "c");
  ASSERT_FALSE(late.empty());
  EXPECT_FLOAT_EQ(first_value(Frame::copy_of(late.data(), late.size()), 0), 4.0f);
  EXPECT_EQ(r.federation.edge(1)->rounds_joined, 1u);
  EXPECT_EQ(r.federation.edge(3)->rounds_joined, 0u);
}

TEST(Federation, ARoundClosesAtItsDeadlineWithEnoughEdgesOrWhenTheRestLeave) {
  Rounds r({.aggregate_every = 5, .min_edges = 2, .deadline_s = 2.0});
  for (uint64_t c = 1; c <= 3; ++c) r.federation.join(c, "e");
  EXPECT_EQ(r.submit(1, filled(1, 1), 10), "");
  r.federation.tick(Federation::Clock::now() + std::chrono::seconds(5));
  EXPECT_TRUE(r.sent.empty());  // past the deadline but only 1 of the 2 needed
  EXPECT_EQ(r.submit(2, filled(3, 3), 10), "");
  r.federation.tick(Federation::Clock::now() + std::chrono::seconds(1));
  EXPECT_TRUE(r.sent.empty());  // 2 edges, deadline not reached
  r.federation.tick(Federation::Clock::now() + std::chrono::seconds(5));
  ASSERT_EQ(r.sent[1].size(), 1u);
  EXPECT_FLOAT_EQ(first_value(r.sent[1][0], 0), 2.0f);
  EXPECT_EQ(r.sent.count(3), 0u);  // the straggler gets the average when it next sends

  EXPECT_EQ(r.submit(3, filled(7, 7), 10), "");  // its late weights count towards round 2
  EXPECT_EQ(r.submit(1, filled(1, 1), 10), "");
  r.federation.leave(2);  // the only edge still missing goes away: the round is complete
  ASSERT_EQ(r.sent[3].size(), 1u);
  EXPECT_EQ(aggregated(r.sent[3][0])->round(), 2u);
  EXPECT_FLOAT_EQ(first_value(r.sent[3][0], 0), 4.0f);
}

TEST(Federation, FewerEdgesThanTheMinimumWaitForOthersUntilTheDeadline) {
  Rounds r({.aggregate_every = 5, .min_edges = 3, .deadline_s = 2.0});
  r.federation.join(1, "early");
  EXPECT_EQ(r.submit(1, filled(1, 1), 10), "");
  EXPECT_TRUE(r.sent.empty());  // alone: the others may still be starting
  r.federation.join(2, "late");
  EXPECT_EQ(r.submit(2, filled(3, 3), 10), "");
  EXPECT_TRUE(r.sent.empty());
  r.federation.tick(Federation::Clock::now() + std::chrono::seconds(3));  // all there are, at the deadline
  ASSERT_EQ(r.sent[2].size(), 1u);
  EXPECT_FLOAT_EQ(first_value(r.sent[2][0], 0), 2.0f);
}

TEST(Federation, AnEdgeThatMissedADeadlineIsNotWaitedForUntilItSendsAgain) {
  Rounds r({.aggregate_every = 5, .min_edges = 2, .deadline_s = 2.0});
  for (uint64_t c = 1; c <= 3; ++c) r.federation.join(c, "e");
  EXPECT_EQ(r.submit(1, filled(1, 1), 10), "");
  EXPECT_EQ(r.submit(2, filled(1, 1), 10), "");
  r.federation.tick(Federation::Clock::now() + std::chrono::seconds(3));  // edge 3 hangs: a straggler
  ASSERT_EQ(r.sent[1].size(), 1u);
  EXPECT_EQ(r.submit(1, filled(1, 1), 10), "");
  EXPECT_EQ(r.submit(2, filled(1, 1), 10), "");
  EXPECT_EQ(r.sent[1].size(), 2u);  // round 2 closed at once, without waiting for edge 3
  EXPECT_EQ(r.submit(3, filled(9, 9), 10), "");  // edge 3 is back: round 3 waits for it again
  EXPECT_EQ(r.submit(1, filled(1, 1), 10), "");
  EXPECT_EQ(r.sent[1].size(), 2u);
  EXPECT_EQ(r.submit(2, filled(2, 2), 10), "");
  ASSERT_EQ(r.sent[3].size(), 1u);
  EXPECT_FLOAT_EQ(first_value(r.sent[3][0], 0), 4.0f);
}

TEST(Federation, BadFrontWeightsAreRefusedWithTheReason) {
  Rounds r;
  r.federation.join(1, "a");
  r.federation.join(2, "b");
  EXPECT_EQ(r.submit(9, filled(1, 1), 1), "FrontWeights from an edge that has not joined");
  EXPECT_EQ(r.submit(1, filled(1, 1), 5000), "FrontWeights claims 5000 samples, more than the 1000 of a round");
  NamedTensors nan = filled(1, 1);
  nan[0].second[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(r.submit(1, nan, 1), "conv1.weight: non-finite value at element 3");
  NamedTensors renamed = filled(1, 1);
  renamed[1].first = "conv9.bias";
  EXPECT_EQ(r.submit(1, renamed, 1), "weights: tensor 1 is 'conv9.bias', expected 'conv1.bias'");
  NamedTensors short_list = filled(1, 1);
  short_list.pop_back();
  EXPECT_EQ(r.submit(1, short_list, 1), "weights: 1 tensors given, the front shard has 2");
  NamedTensors misshapen = {{"conv1.weight", Tensor::zeros({3, 2})}, {"conv1.bias", Tensor::zeros({2})}};
  EXPECT_EQ(r.submit(1, misshapen, 1), "conv1.weight: shape [3, 2] differs from the expected [2, 3]");
  EXPECT_EQ(r.submit(1, filled(1, 1), 1), "");
  EXPECT_EQ(r.submit(1, filled(1, 1), 1), "a second FrontWeights in round 1");
}

TEST(BackShardTurns, FirstComeFirstServedAndAQuietHolderIsEvicted) {
  BackShardTurns turns(0.2);
  std::atomic<bool> no{false};
  ASSERT_TRUE(turns.acquire(1, no));
  std::vector<uint64_t> order;
  std::mutex m;
  auto take = [&](uint64_t id) {
    ASSERT_TRUE(turns.acquire(id, no));
    {
      std::lock_guard<std::mutex> lock(m);
      order.push_back(id);
    }
    turns.release(id);
  };
  std::thread t2([&] { take(2); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  std::thread t3([&] { take(3); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  turns.release(1);
  t2.join();
  t3.join();
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 3}));

  // A holder that computes is never evicted; one that stays quiet past the timeout is.
  ASSERT_TRUE(turns.acquire(1, no));
  ASSERT_TRUE(turns.begin_compute(1));
  std::atomic<bool> got{false};
  std::thread t4([&] {
    got = turns.acquire(4, no);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_FALSE(got.load());
  turns.end_compute();  // now quiet
  t4.join();
  EXPECT_TRUE(got.load());
  EXPECT_TRUE(turns.was_evicted(1));
  EXPECT_FALSE(turns.begin_compute(1));  // the evicted holder learns it lost the turn
  EXPECT_TRUE(turns.held_by(4));

  std::atomic<bool> cancel{true};
  EXPECT_FALSE(turns.acquire(5, cancel));  // a closing session gives up at once
}

// A back shard with every gradient set to `g` as a step's backward would leave it.
struct Shard {
  std::unique_ptr<Backend> backend = make_backend("reference");
  Network net{Graph::build(parse_model_json(test::kSmallSplitSpec)).split("pool1").second, *backend, 3};
  Sgd sgd{net.params(), {.lr = 0.5f, .momentum = 0.0f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false}};
  std::vector<float> first = values();
  std::vector<float> values() const {
    std::vector<float> v;
    for (const Param* p : net.params()) v.insert(v.end(), p->value().data(), p->value().data() + p->value().numel());
    return v;
  }
  void add_grad(float g) {
    for (Param* p : net.params())
      for (int64_t i = 0; i < p->grad().numel(); ++i) p->grad()[i] += g;
  }
  // How far every weight moved from the start (all move alike here); NAN when they differ.
  float moved() const {
    const std::vector<float> now = values();
    const float d = first[0] - now[0];
    for (std::size_t i = 0; i < now.size(); ++i)
      if (std::fabs((first[i] - now[i]) - d) > 1e-6f) return NAN;
    return d;
  }
};

TEST(BackShardTrainer, OneEdgesShardIsUpdatedOncePerStep) {
  Shard s;
  BackShardTrainer trainer(s.net, s.sgd);
  std::atomic<bool> no{false};
  s.add_grad(7.0f);  // stale: begin_step clears it
  ASSERT_TRUE(trainer.begin_step(1, no));
  EXPECT_TRUE(trainer.step_open(1));
  s.add_grad(1.0f);
  int between = 0;
  EXPECT_TRUE(trainer.finish_step(1, 0.5f, [&] { ++between; }));
  EXPECT_NEAR(s.moved(), 0.5f * 0.5f * 1.0f, 1e-6f);  // lr 0.5, the step's factor 0.5
  EXPECT_TRUE(trainer.finish_step(1, 0.5f, [&] { ++between; }));  // again: nothing
  EXPECT_NEAR(s.moved(), 0.25f, 1e-6f);
  EXPECT_EQ(trainer.updates(), 1u);
  EXPECT_EQ(between, 1);
  EXPECT_FALSE(trainer.step_open(1));
}

TEST(BackShardTrainer, ASharedShardSumsStepsIntoOneUpdate) {
  Shard s;
  BackShardTrainer trainer(s.net, s.sgd, 10.0, /*accumulate=*/2);
  std::atomic<bool> no{false};
  int between = 0;
  ASSERT_TRUE(trainer.begin_step(1, no));
  s.add_grad(1.0f);
  EXPECT_TRUE(trainer.finish_step(1, 1.0f, [&] { ++between; }));
  EXPECT_EQ(s.moved(), 0.0f) << "updated before the summed steps were complete";
  ASSERT_TRUE(trainer.begin_step(2, no));  // the gradients are summing: not cleared
  s.add_grad(3.0f);
  EXPECT_TRUE(trainer.finish_step(2, 1.0f, [&] { ++between; }));
  EXPECT_NEAR(s.moved(), 0.5f * (1.0f + 3.0f) / 2.0f, 1e-6f);  // the mean of the two steps' gradients
  EXPECT_EQ(trainer.updates(), 1u);
  EXPECT_EQ(between, 1);
  ASSERT_TRUE(trainer.begin_step(1, no));  // a new sum starts from zero
  s.add_grad(2.0f);
  trainer.release(1);  // its session closed mid-step: the step is abandoned
  EXPECT_TRUE(trainer.finish_step(1, 1.0f));
  EXPECT_EQ(trainer.updates(), 1u);
}

// A session that closes mid-step may leave weight gradients deferred (input gradients first)
// on a shared shard: the next step neither applies them nor trips over them.
TEST(BackShardTrainer, AnAbandonedStepsDeferredWeightGradientsAreDropped) {
  Shard s;
  BackShardTrainer trainer(s.net, s.sgd, 10.0, 1);
  std::atomic<bool> no{false};
  ASSERT_TRUE(trainer.begin_step(1, no));
  Rng rng(8);
  const Tensor cut = test::random_tensor(s.net.graph().inputs()[0].shape.batched(2), rng);
  const Tensor& out = s.net.forward(cut, 0);
  (void)s.net.backward(test::random_tensor(out.shape(), rng), 0, true, /*defer_weights=*/true);
  ASSERT_TRUE(s.net.any_weights_pending());
  trainer.release(1);  // its session closed before running them
  ASSERT_TRUE(trainer.begin_step(2, no));
  EXPECT_FALSE(s.net.any_weights_pending());
  s.net.forward(cut, 0);  // the slot is free again
  s.add_grad(1.0f);
  EXPECT_TRUE(trainer.finish_step(2, 1.0f));
  EXPECT_NEAR(s.moved(), 0.5f, 1e-6f) << "only step 2's gradient was applied";
}

TEST(BackShardTrainer, AnEvictedStepIsNeverApplied) {
  Shard s;
  BackShardTrainer trainer(s.net, s.sgd, /*timeout_s=*/0.05, 1);
  std::atomic<bool> no{false};
  ASSERT_TRUE(trainer.begin_step(1, no));
  s.add_grad(1.0f);
  std::thread other([&] { EXPECT_TRUE(trainer.begin_step(2, no)); });  // 1 goes quiet: 2 takes over
  other.join();
  EXPECT_TRUE(trainer.was_evicted(1));
  EXPECT_FALSE(trainer.finish_step(1, 1.0f));
  EXPECT_EQ(trainer.updates(), 0u);
  EXPECT_EQ(s.moved(), 0.0f);
  s.add_grad(2.0f);
  EXPECT_TRUE(trainer.finish_step(2, 1.0f));
  EXPECT_NEAR(s.moved(), 0.5f * 2.0f, 1e-6f);
}

}  // namespace
}  // namespace tandem
