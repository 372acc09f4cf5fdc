// U-shaped split training in-process (cut "pool1,fc1"): the edge runs the front and the tail
// with the loss, the cloud the middle. It trains exactly like the whole model, no label
// leaves the edge, and a cloud that trains U-shaped refuses labels and stray gradients.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/registry.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/loss.h"
#include "core/privacy/cut_noise.h"
#include "pipeline/local_pipeline.h"
#include "edge/session/edge_session.h"
#include "test_support.h"

namespace tandem::test {
namespace {

constexpr const char* kCut = "pool1,fc1";

OptimizerOptions sgd() { return {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f, .nesterov = false}; }

std::vector<Param*> joined(Network& a, Network& b) {
  std::vector<Param*> out = a.params();
  out.insert(out.end(), b.params().begin(), b.params().end());
  return out;
}

CloudReply deliver(CloudSession& cloud, std::span<const uint8_t> bytes) {
  CloudReply r = cloud.handle(Frame::copy_of(bytes.data(), bytes.size()));
  cloud.finish_step();  // as the service does, once the reply is queued
  return r;
}

Frame frame_of(std::span<const uint8_t> bytes) { return Frame::copy_of(bytes.data(), bytes.size()); }

// The edge (front and tail) and the cloud (the middle), all on the backend under test,
// starting from the whole model's weights.
// The small model with a square linear in its middle (fcm: 24 to 24), so a middle can start
// with a layer whose backward reads its input and give out its input's shape.
constexpr const char* kSquareMiddleSpec = R"({ name: "square-middle", inputs: [ { name: "image", shape: [8, 8, 1] } ], nodes: [
  { name: "conv1", op: "conv2d", inputs: ["image"], conv2d: { out_channels: 6, kernel: [3], padding: [1] } },
  { name: "relu1", op: "relu", inputs: ["conv1"] },
  { name: "pool1", op: "max_pool2d", inputs: ["relu1"], pool: { kernel: [2] } },
  { name: "flatten", op: "flatten", inputs: ["pool1"] },
  { name: "fc1", op: "linear", inputs: ["flatten"], linear: { out_features: 24 } },
  { name: "relu2", op: "relu", inputs: ["fc1"] },
  { name: "fcm", op: "linear", inputs: ["relu2"], linear: { out_features: 24 } },
  { name: "relu3", op: "relu", inputs: ["fcm"] },
  { name: "fc2", op: "linear", inputs: ["relu3"], linear: { out_features: 4 } } ], cut: "relu2,fcm" })";

struct UShaped {
  ModelSpec spec;
  Graph graph = Graph::build(spec);
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network whole{graph, *backend, 77};
  std::string cut = kCut;
  Network front{graph.split(cut).first, *backend, 0}, middle{graph.split(cut).second, *backend, 0},
      tail{graph.tail(cut), *backend, 0};
  Sgd edge_opt{joined(front, tail), sgd()}, middle_opt{middle.params(), sgd()};
  BackShardTrainer trainer{middle, middle_opt};
  CloudSession cloud;
  EdgeSession edge;

  explicit UShaped(uint32_t k, wire::DType dtype = wire::DType::F32, std::string cut_at = kCut,
                   const char* spec_json = kSmallSplitSpec)
      : spec(parse_model_json(spec_json)), cut(std::move(cut_at)),
        cloud(trainer, {model_hash(spec, cut), 32, k, 4, 1, kDefaultMaxMessageBytes, CloudSessionConfig{}.dtypes, cut}),
        edge(front, edge_opt, k, model_hash(spec, cut), "edge-u", {dtype}) {
    for (Network* n : {&front, &middle, &tail}) copy_params(*n, whole);
    edge.set_tail(&tail);
  }

  void handshake() {
    CloudReply r = deliver(cloud, edge.hello());
    ASSERT_FALSE(r.close);
    WireError err;
    ASSERT_TRUE(edge.on_welcome(frame_of(r.bytes), err)) << err.text;
  }

  // One pipelined step: every Forward first, the middle outputs handled in reverse order, then
  // the Backwards in reverse order (arrival order must not matter).
  void step(const Tensor& images, const int32_t* labels) {
    const int k = edge.begin_step(images, labels);
    std::vector<Frame> outputs, backwards;
    for (int mb = 0; mb < k; ++mb) {
      const std::span<const uint8_t> fwd = edge.forward(mb);
      const wire::Message* m = wire::GetMessage(fwd.data());
      ASSERT_EQ(m->payload_as_Forward()->labels(), nullptr) << "a label left the edge";
      CloudReply r = deliver(cloud, fwd);
      ASSERT_FALSE(r.close) << "the cloud closed the session";
      outputs.push_back(frame_of(r.bytes));
    }
    for (std::size_t i = outputs.size(); i-- > 0;) {
      WireError err;
      bool done = true;
      std::span<const uint8_t> reply;
      ASSERT_TRUE(edge.on_step_message(outputs[i], err, done, reply)) << err.text;
      ASSERT_FALSE(done);
      ASSERT_FALSE(reply.empty());
      CloudReply r = deliver(cloud, reply);
      ASSERT_FALSE(r.close) << "the cloud closed the session";
      backwards.push_back(frame_of(r.bytes));
    }
    for (std::size_t i = backwards.size(); i-- > 0;) {
      WireError err;
      bool done = false;
      std::span<const uint8_t> reply;
      ASSERT_TRUE(edge.on_step_message(backwards[i], err, done, reply)) << err.text;
      EXPECT_TRUE(reply.empty());
      EXPECT_EQ(done, i == 0);
    }
  }
};

TEST(UShapedSession, TrainsLikeTheWholeModel) {
  const QuadrantData d = quadrant_data(32, 1);
  UShaped u(4);
  u.handshake();
  Network& whole = u.whole;
  Sgd whole_opt(whole.params(), sgd());
  LocalPipeline local({&whole}, {&whole_opt});
  for (int s = 0; s < 20; ++s) {
    u.step(d.images, d.labels.data());
    const double want = local.train_step(d.images, d.labels.data(), 1).loss_sum;
    EXPECT_NEAR(u.edge.step_loss_sum(), want, 1e-3 * std::max(1.0, std::fabs(want))) << "step " << s;
  }
  EXPECT_EQ(u.edge.step(), 20u);
  EXPECT_EQ(u.cloud.step(), 20u);
  EXPECT_LE(max_diff(u.front, whole), 1e-5f);
  EXPECT_LE(max_diff(u.middle, whole), 1e-5f);
  EXPECT_LE(max_diff(u.tail, whole), 1e-5f);
  Network start(u.graph, *u.backend, 77);  // and the weights did move
  for (Network* n : {&u.front, &u.middle, &u.tail}) EXPECT_GT(max_diff(*n, start), 1e-3f) << n->graph().name();
}

// A middle whose output has its input's shape and whose first layer's backward reads its input
// (a square linear), with a dtype the cloud decodes: the gradient coming up must not be
// decoded over the activations the middle's backward still needs. Against the whole model
// within f16's rounding.
TEST(UShapedSession, ADecodedGradientLeavesTheMiddlesInputsAlone) {
  const QuadrantData d = quadrant_data(32, 1);
  UShaped u(4, wire::DType::F16, "relu2,fcm", kSquareMiddleSpec);
  u.handshake();
  ASSERT_EQ(u.edge.dtype(), wire::DType::F16);
  Sgd whole_opt(u.whole.params(), sgd());
  LocalPipeline local({&u.whole}, {&whole_opt});
  for (int s = 0; s < 5; ++s) {
    u.step(d.images, d.labels.data());
    local.train_step(d.images, d.labels.data(), 1);
  }
  EXPECT_LE(max_diff(u.front, u.whole), 1e-3f);
  EXPECT_LE(max_diff(u.middle, u.whole), 1e-3f);  // 6.7e-3 when the gradient was decoded over the inputs
  EXPECT_LE(max_diff(u.tail, u.whole), 1e-3f);
}

// Evaluation: the cloud returns the middle's output and the edge's tail scores it, so the
// evaluation labels stay at the edge too; the count equals the whole model's.
TEST(UShapedSession, EvaluationIsScoredAtTheEdge) {
  const QuadrantData train = quadrant_data(32, 1), test = quadrant_data(64, 2);
  UShaped u(4);
  u.handshake();
  for (int s = 0; s < 5; ++s) u.step(train.images, train.labels.data());
  const std::span<const uint8_t> eval = u.edge.eval_forward(7, test.images, test.labels.data(), 64);
  ASSERT_EQ(wire::GetMessage(eval.data())->payload_as_EvalForward()->labels(), nullptr);
  CloudReply r = deliver(u.cloud, eval);
  ASSERT_FALSE(r.close);
  ASSERT_EQ(wire::GetMessage(r.bytes.data())->payload_type(), wire::Payload::EvalMiddleOutput);
  WireError err;
  EdgeSession::EvalResult result;
  ASSERT_TRUE(u.edge.on_eval_result(frame_of(r.bytes), err, result)) << err.text;
  for (Network* n : {&u.front, &u.middle, &u.tail}) n->set_training(false);
  const Tensor& logits = u.tail.forward(u.middle.forward(u.front.forward(test.images, 0), 0), 0);
  EXPECT_EQ(result.count, 64);
  EXPECT_EQ(result.correct, count_correct(logits, test.labels.data()));
}

// Noise on the gradient sent up (the labels' protection): with no noise each sample's
// gradient of its own loss leaves clipped to C (rows times the step's samples); with noise
// the rows differ from the exact ones; the tail's own update stays the exact one either way.
TEST(UShapedSession, GradientNoiseClipsAndNoisesWhatLeaves) {
  const QuadrantData d = quadrant_data(32, 1);
  for (const float sigma : {0.0f, 1.0f}) {
    UShaped exact(4), noised(4);
    CutNoise noise(0.05f, sigma, 7);
    noised.edge.set_gradient_noise(&noise);
    for (UShaped* u : {&exact, &noised}) {
      u->handshake();
      u->edge.begin_step(d.images, d.labels.data());
    }
    std::vector<Tensor> sent[2];
    for (int which = 0; which < 2; ++which) {
      UShaped& u = which ? noised : exact;
      for (int mb = 0; mb < 4; ++mb) {
        CloudReply r = deliver(u.cloud, u.edge.forward(mb));
        WireError err;
        bool done = false;
        std::span<const uint8_t> reply;
        ASSERT_TRUE(u.edge.on_step_message(frame_of(r.bytes), err, done, reply)) << err.text;
        const Frame f = frame_of(reply);
        Tensor g = read_tensor(f, wire::GetMessage(f.data())->payload_as_MiddleGradient()->gradients(),
                               Shape({8, 24}), "gradients", err);
        ASSERT_TRUE(g.defined()) << err.text;
        sent[which].push_back(g.clone());
      }
    }
    float largest_row = 0.0f, largest_difference = 0.0f;
    for (int mb = 0; mb < 4; ++mb)
      for (int i = 0; i < 8; ++i) {
        double sq = 0.0;
        for (int j = 0; j < 24; ++j) {
          const float v = sent[1][mb][i * 24 + j] * 32.0f;
          sq += static_cast<double>(v) * v;
          largest_difference = std::max(largest_difference, std::fabs(sent[1][mb][i * 24 + j] - sent[0][mb][i * 24 + j]));
        }
        largest_row = std::max(largest_row, static_cast<float>(std::sqrt(sq)));
      }
    if (sigma == 0.0f)
      EXPECT_LE(largest_row, 0.05f * 1.0001f) << "a sample's gradient left unclipped";
    else
      EXPECT_GT(largest_row, 0.05f * 2) << "no noise on the gradient";
    EXPECT_GT(largest_difference, 1e-5f);
    for (int which = 0; which < 2; ++which)  // the tail's gradients are the exact ones either way
      EXPECT_EQ((which ? noised : exact).tail.param("fc2.weight").grad()[5], exact.tail.param("fc2.weight").grad()[5]);
  }
}

void expect_refusal(CloudReply r, wire::ErrorCode code, const std::string& text) {
  ASSERT_TRUE(r.close);
  const wire::Message* m = wire::GetMessage(r.bytes.data());
  ASSERT_EQ(m->payload_type(), wire::Payload::Error);
  EXPECT_EQ(m->payload_as_Error()->code(), code);
  EXPECT_EQ(m->payload_as_Error()->text()->str(), text);
}

// An edge that sends labels (one that is not U-shaped) to a cloud started U-shaped.
TEST(UShapedSessionBadInput, ForwardCarryingLabels) {
  const QuadrantData d = quadrant_data(32, 1);
  UShaped u(4);
  u.handshake();
  MessageWriter w;
  const Tensor act = u.front.forward(d.images.slice_batch(0, 8), 0).clone();
  expect_refusal(deliver(u.cloud, w.forward(0, 0, 0, act, std::span<const int32_t>(d.labels.data(), 8), 32, 4)),
                 wire::ErrorCode::BadTensor,
                 "this cloud runs the middle of a U-shaped split (cut 'pool1,fc1'): the labels stay at the edge, and a "
                 "message carrying them is refused");
}

TEST(UShapedSessionBadInput, MiddleGradientBeforeItsForward) {
  UShaped u(4);
  u.handshake();
  MessageWriter w;
  expect_refusal(deliver(u.cloud, w.middle_gradient(0, 1, Tensor::zeros(Shape({8, 24})), 1.0f)),
                 wire::ErrorCode::OutOfWindow,
                 "MiddleGradient for step 0 micro-batch 1 was not expected (the middle's output for it has not left, "
                 "or its gradient came already; step 0)");
}

TEST(UShapedSessionBadInput, MiddleGradientTwiceAndOfTheWrongShape) {
  const QuadrantData d = quadrant_data(32, 1);
  for (const bool twice : {true, false}) {
    UShaped u(4);
    u.handshake();
    u.edge.begin_step(d.images, d.labels.data());
    CloudReply out = deliver(u.cloud, u.edge.forward(0));
    ASSERT_FALSE(out.close);
    MessageWriter w;
    if (twice) {
      ASSERT_FALSE(deliver(u.cloud, w.middle_gradient(0, 0, Tensor::zeros(Shape({8, 24})), 1.0f)).close);
      expect_refusal(deliver(u.cloud, w.middle_gradient(0, 0, Tensor::zeros(Shape({8, 24})), 1.0f)),
                     wire::ErrorCode::OutOfWindow,
                     "MiddleGradient for step 0 micro-batch 0 was not expected (the middle's output for it has not "
                     "left, or its gradient came already; step 0)");
    } else {
      expect_refusal(deliver(u.cloud, w.middle_gradient(0, 0, Tensor::zeros(Shape({8, 23})), 1.0f)),
                     wire::ErrorCode::BadTensor, "gradients: shape [8, 23] differs from the expected [8, 24]");
    }
  }
}

TEST(UShapedSessionBadInput, NonFiniteLoss) {
  const QuadrantData d = quadrant_data(32, 1);
  UShaped u(4);
  u.handshake();
  u.edge.begin_step(d.images, d.labels.data());
  ASSERT_FALSE(deliver(u.cloud, u.edge.forward(0)).close);
  MessageWriter w;
  expect_refusal(deliver(u.cloud, w.middle_gradient(0, 0, Tensor::zeros(Shape({8, 24})), NAN)),
                 wire::ErrorCode::BadTensor, "step 0 micro-batch 0: the loss is not finite");
}

// A cloud that runs the back shard and the loss has no middle output to take a gradient of.
TEST(UShapedSessionBadInput, MiddleGradientToAnOrdinaryCloud) {
  ModelSpec spec = parse_model_json(kSmallSplitSpec);
  Graph graph = Graph::build(spec);
  auto backend = make_backend("reference");
  Network back(graph.split("pool1").second, *backend, 1);
  Sgd opt(back.params(), sgd());
  BackShardTrainer trainer(back, opt);
  CloudSession cloud(trainer, {model_hash(spec, "pool1"), 32, 4, 4, 1, kDefaultMaxMessageBytes,
                               CloudSessionConfig{}.dtypes, "pool1"});
  MessageWriter w;
  ASSERT_FALSE(deliver(cloud, w.hello("edge-u", model_hash(spec, "pool1"))).close);
  expect_refusal(deliver(cloud, w.middle_gradient(0, 0, Tensor::zeros(Shape({8, 24})), 1.0f)),
                 wire::ErrorCode::UnexpectedMessage,
                 "MiddleGradient to a cloud that runs the back shard and the loss (not a U-shaped split)");
}

// The edge checks what comes down as the cloud checks what goes up.
TEST(UShapedSessionBadInput, EdgeRefusesAMiddleOutputItDidNotAskFor) {
  const QuadrantData d = quadrant_data(32, 1);
  UShaped u(4);
  u.handshake();
  u.edge.begin_step(d.images, d.labels.data());
  MessageWriter w;
  WireError err;
  bool done = false;
  std::span<const uint8_t> reply;
  EXPECT_FALSE(u.edge.on_step_message(frame_of(w.middle_output(0, 2, Tensor::zeros(Shape({8, 24})))), err, done, reply));
  EXPECT_EQ(err.code, wire::ErrorCode::OutOfWindow);
  EXPECT_EQ(err.text, "MiddleOutput for step 0 micro-batch 2 was not expected (step 0)");
  (void)u.edge.forward(2);
  EXPECT_FALSE(u.edge.on_step_message(frame_of(w.middle_output(0, 2, Tensor::zeros(Shape({8, 25})))), err, done, reply));
  EXPECT_EQ(err.text, "activations: shape [8, 25] differs from the expected [8, 24]");
}

// An evaluation answer for another batch, or of the wrong shape, is refused with the reason.
TEST(UShapedSessionBadInput, EdgeRefusesAStrayEvalMiddleOutput) {
  const QuadrantData test = quadrant_data(8, 2);
  UShaped u(4);
  u.handshake();
  (void)u.edge.eval_forward(3, test.images, test.labels.data(), 8);
  MessageWriter w;
  WireError err;
  EdgeSession::EvalResult result;
  EXPECT_FALSE(u.edge.on_eval_result(frame_of(w.eval_middle_output(4, Tensor::zeros(Shape({8, 24})))), err, result));
  EXPECT_EQ(err.code, wire::ErrorCode::OutOfWindow);
  EXPECT_EQ(err.text, "EvalMiddleOutput for batch 4 was not expected");
  EXPECT_FALSE(u.edge.on_eval_result(frame_of(w.eval_middle_output(3, Tensor::zeros(Shape({7, 24})))), err, result));
  EXPECT_EQ(err.text, "activations: shape [7, 24] differs from the expected [8, 24]");
}

TEST(UShapedGraph, CutsAreCheckedAndNamed) {
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  const auto [front, middle] = graph.split(kCut);
  const Graph tail = graph.tail(kCut);
  EXPECT_EQ(front.nodes().back().spec.name, "pool1");
  EXPECT_EQ(middle.inputs()[0].name, "pool1");
  EXPECT_EQ(middle.nodes().back().spec.name, "fc1");
  EXPECT_EQ(tail.inputs()[0].name, "fc1");
  EXPECT_EQ(tail.nodes().back().spec.name, "fc2");
  EXPECT_EQ(tail.loss(), graph.loss());
  EXPECT_EQ(front.param_names().size() + middle.param_names().size() + tail.param_names().size(),
            graph.param_names().size());
  auto message = [&](const char* cut) { return error_of([&] { (void)graph.split(cut); }); };
  EXPECT_EQ(message("fc1,pool1"), "[split] cut 'pool1' must come after 'fc1': cuts are listed in the order the data "
                                  "flows through them");
  EXPECT_EQ(message("pool1,"), "[split] a U-shaped cut names two nodes, \"FRONT_CUT,TAIL_CUT\", not 'pool1,'");
  EXPECT_EQ(message("pool1,fc2"), "[split] cut node 'fc2' is the output: nothing would be left for the back shard");
  // A spec's own cut may be U-shaped; both nodes must exist.
  ModelSpec spec = parse_model_json(kSmallSplitSpec);
  spec.cut = "pool1,fc1";
  EXPECT_EQ(Graph::build(spec).default_cut(), "pool1,fc1");
  spec.cut = "pool1,fc9";
  EXPECT_EQ(error_of([&] { (void)Graph::build(spec); }), "[graph] field 'cut' names unknown node 'fc9'");
}

}  // namespace
}  // namespace tandem::test
