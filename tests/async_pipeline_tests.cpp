// The asynchronous pipeline in-process (EdgeSession::set_async): step t+1 is forwarded before
// step t's gradients are handled, and each micro-batch backs up on the weights its forward
// used (the stash). Checked against a reference replay of that rule, step by step, on the
// backend under test (kernels that pack weights must see the stash, not the newer weights).
#include <gtest/gtest.h>

#include <deque>

#include "backends/registry.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/microbatch.h"
#include "core/wire/messages.h"
#include "edge/session/edge_session.h"
#include "test_support.h"

namespace tandem::test {
namespace {

// Cut after relu2: the front holds conv1 and fc1, so fc1's input gradient (and with it
// conv1's weight gradient) depends on fc1's weights: a backward on the wrong weights shows.
constexpr const char* kCut = "relu2";
constexpr float kLr = 0.1f;

struct AsyncSplit {
  ModelSpec spec = parse_model_json(kSmallSplitSpec);
  Graph graph = Graph::build(spec);
  std::pair<Graph, Graph> shards = graph.split(kCut);
  std::unique_ptr<Backend> edge_backend = make_test_backend(backend_under_test());
  std::unique_ptr<Backend> cloud_backend = make_backend("reference");
  Network whole{graph, *edge_backend, 21};
  Network front{shards.first, *edge_backend, 0}, back{shards.second, *cloud_backend, 0};
  Sgd front_opt{front.params(), OptimizerOptions{.lr = kLr}};
  Sgd back_opt{back.params(), OptimizerOptions{.lr = kLr}};
  BackShardTrainer trainer{back, back_opt};
  CloudSession cloud{trainer, {model_hash(spec, kCut), 32, 4, 4, 1, kDefaultMaxMessageBytes,
                               CloudSessionConfig{}.dtypes, kCut}};
  EdgeSession edge{front, front_opt, 4, model_hash(spec, kCut), "async-test"};

  explicit AsyncSplit(bool async) {
    copy_params(front, whole);
    copy_params(back, whole);
    edge.set_async(async);
    const CloudReply r = send(edge.hello());
    WireError err;
    EXPECT_TRUE(edge.on_welcome(Frame::copy_of(r.bytes.data(), r.bytes.size()), err)) << err.text;
  }
  CloudReply send(std::span<const uint8_t> bytes) {
    CloudReply r = cloud.handle(Frame::copy_of(bytes.data(), bytes.size()));
    cloud.finish_step();
    return r;
  }
  // Begins a step and forwards all of it; the cloud's replies join `replies`, the
  // activations sent `sent`.
  void begin(const Tensor& images, const int32_t* labels, std::deque<Frame>& replies, std::vector<Tensor>* sent) {
    const int k = edge.begin_step(images, labels);
    for (int mb = 0; mb < k; ++mb) {
      const std::span<const uint8_t> fwd = edge.forward(mb);
      if (sent) {
        const Frame f = Frame::copy_of(fwd.data(), fwd.size());
        WireError err;
        const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
        const auto* t = m->payload_as_Forward()->activations();
        std::vector<int64_t> dims(t->shape()->begin(), t->shape()->end());
        const Shape shape = Shape::of(dims.data(), static_cast<int>(dims.size()));
        sent->push_back(read_tensor(f, t, shape, "activations", err).clone());
      }
      const CloudReply r = send(fwd);
      EXPECT_FALSE(r.close) << "the cloud closed the session";
      replies.push_back(Frame::copy_of(r.bytes.data(), r.bytes.size()));
    }
  }
  // Handles the oldest step's Backwards; true when a step was done.
  void finish_oldest(std::deque<Frame>& replies, int k) {
    for (int mb = 0; mb < k; ++mb) {
      WireError err;
      bool done = false;
      ASSERT_TRUE(edge.on_backward(replies.front(), err, done)) << err.text;
      replies.pop_front();
      EXPECT_EQ(done, mb == k - 1);
    }
  }
};

std::vector<Tensor> snapshot(Network& net) {
  std::vector<Tensor> out;
  for (Param* p : net.params()) out.push_back(p->value().clone());
  return out;
}

// The cut gradient in a Backward frame.
Tensor gradient_of(const Frame& f, const Shape& shape) {
  WireError err;
  const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
  return read_tensor(f, m->payload_as_Backward()->gradients(), shape, "gradients", err).clone();
}

TEST(AsyncPipeline, EachMicroBatchBacksUpOnTheWeightsItsForwardUsed) {
  const QuadrantData d = quadrant_data(32, 5);
  constexpr int kSteps = 6, kK = 4;
  AsyncSplit s(/*async=*/true);
  // The weights before each update, and what each step sent and got back.
  std::vector<std::vector<Tensor>> weights{snapshot(s.front)};
  std::vector<std::vector<Tensor>> sent(kSteps);
  std::vector<std::vector<Frame>> backwards(kSteps);
  std::vector<std::vector<Tensor>> forward_weights(kSteps);
  std::deque<Frame> replies;
  forward_weights[0] = snapshot(s.front);
  s.begin(d.images, d.labels.data(), replies, &sent[0]);
  for (int t = 0; t < kSteps; ++t) {
    if (t + 1 < kSteps) {  // the next step goes out before this one's gradients are handled
      ASSERT_EQ(s.edge.steps_in_flight(), 1);
      forward_weights[t + 1] = snapshot(s.front);
      s.begin(d.images, d.labels.data(), replies, &sent[t + 1]);
      ASSERT_EQ(s.edge.steps_in_flight(), 2);
    }
    for (int mb = 0; mb < kK; ++mb) backwards[t].push_back(replies[static_cast<std::size_t>(mb)]);
    s.finish_oldest(replies, kK);
    weights.push_back(snapshot(s.front));
  }
  EXPECT_EQ(s.edge.step(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ(s.edge.steps_in_flight(), 0);

  // The replay: step t's forward on forward_weights[t] (one update old from step 1 on), its
  // backward with the cloud's gradients on the same weights, applied to weights[t].
  Network replay(s.shards.first, *s.edge_backend, 0);
  for (int t = 0; t < kSteps; ++t) {
    if (t >= 1) {
      EXPECT_GT(max_abs_diff(forward_weights[t][0], weights[t][0]), 1e-6f) << "step " << t << " is not stale";
    }
    for (std::size_t i = 0; i < replay.params().size(); ++i) {
      replay.params()[i]->value().copy_from(forward_weights[static_cast<std::size_t>(t)][i]);
      replay.params()[i]->bump_version();
    }
    replay.zero_grad();
    replay.set_training(true);
    for (int mb = 0; mb < kK; ++mb) {
      const auto [begin, count] = microbatch_range(32, kK, mb);
      const Tensor& out = replay.forward(d.images.slice_batch(begin, count), mb);
      EXPECT_LE(max_abs_diff(out, sent[static_cast<std::size_t>(t)][static_cast<std::size_t>(mb)]), 1e-5f)
          << "step " << t << " micro-batch " << mb << " was not forwarded on the weights one update old";
      replay.backward(gradient_of(backwards[static_cast<std::size_t>(t)][static_cast<std::size_t>(mb)], out.shape()), mb,
                      false);
    }
    for (std::size_t i = 0; i < replay.params().size(); ++i) {
      const Tensor& before = weights[static_cast<std::size_t>(t)][i];
      const Tensor& after = weights[static_cast<std::size_t>(t) + 1][i];
      const Tensor& g = replay.params()[i]->grad();
      float worst = 0.0f;
      for (int64_t j = 0; j < before.numel(); ++j)
        worst = std::max(worst, std::fabs(after[j] - (before[j] - kLr * g[j])));
      EXPECT_LE(worst, 1e-5f) << "step " << t << ", " << replay.params()[i]->name();
    }
  }

  // The same data synchronously ends elsewhere: the staleness is real.
  AsyncSplit sync(/*async=*/false);
  std::deque<Frame> sync_replies;
  for (int t = 0; t < kSteps; ++t) {
    sync.begin(d.images, d.labels.data(), sync_replies, nullptr);
    sync.finish_oldest(sync_replies, kK);
  }
  EXPECT_GT(max_diff(sync.front, s.front), 1e-4f);
}

TEST(AsyncPipelineBadInput, OutOfOrderAndRefusedCombinations) {
  const QuadrantData d = quadrant_data(32, 6);
  AsyncSplit s(/*async=*/true);
  std::deque<Frame> replies;
  s.begin(d.images, d.labels.data(), replies, nullptr);
  s.begin(d.images, d.labels.data(), replies, nullptr);
  EXPECT_EQ(error_of([&] { s.edge.begin_step(d.images, d.labels.data()); }), "[edge session] step 1 is still in flight");
  // Step 1's gradient before step 0's: refused, and step 0 goes on.
  WireError err;
  bool done = false;
  EXPECT_FALSE(s.edge.on_backward(replies[4], err, done));
  EXPECT_EQ(err.text, "Backward for step 1 micro-batch 0 was not expected (step 0)");
  s.finish_oldest(replies, 4);
  s.finish_oldest(replies, 4);

  // A checkpointing step is a step boundary: nothing begins ahead of it.
  AsyncSplit c(/*async=*/true);
  std::deque<Frame> ignored;
  c.edge.begin_step(d.images, d.labels.data(), 1.0f, /*checkpoint=*/true);
  EXPECT_EQ(error_of([&] { c.edge.begin_step(d.images, d.labels.data()); }),
            "[edge session] step 0 saves a checkpoint: the next step waits until it is done");

  AsyncSplit n(/*async=*/true);
  n.edge.set_nopeek(0.5f);
  EXPECT_EQ(error_of([&] { n.edge.begin_step(d.images, d.labels.data()); }),
            "[edge session] the asynchronous schedule is for plain split training, not with NoPeek (its penalty reads "
            "a whole step's activations)");
}

}  // namespace
}  // namespace tandem::test
