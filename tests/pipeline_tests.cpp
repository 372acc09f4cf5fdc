// The pipeline layer (pipeline/): Graph::partition into N stages, the schedules' orders
// (each checked by simulation), and the in-process pipeline: N stages under every schedule,
// on one thread or a thread a stage, train exactly like the whole model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/graph.h"
#include "core/microbatch.h"
#include "core/optimizer.h"
#include "pipeline/local_pipeline.h"
#include "pipeline/partitioner.h"
#include "pipeline/schedule.h"
#include "test_support.h"

namespace tandem::test {
// A tiny masked encoder (ids and a padding mask): the pipeline tests' and the stage peer's.
extern const char* const kTinyEncoderSpec;
const char* const kTinyEncoderSpec = R"({ name: "tiny-encoder",
  inputs: [ { name: "ids", shape: [6], dtype: "int32" }, { name: "mask", shape: [6], mask: true } ],
  nodes: [
    { name: "tok", op: "embedding", inputs: ["ids"], embedding: { count: 20, features: 8 } },
    { name: "pos", op: "position_embedding", inputs: ["tok"], embedding: { count: 6 } },
    { name: "ln0", op: "layer_norm", inputs: ["pos"] },
    { name: "q0", op: "linear", inputs: ["ln0"], linear: { out_features: 8 } },
    { name: "k0", op: "linear", inputs: ["ln0"], linear: { out_features: 8 } },
    { name: "v0", op: "linear", inputs: ["ln0"], linear: { out_features: 8 } },
    { name: "att0", op: "attention", inputs: ["q0", "k0", "v0", "mask"], attention: { heads: 2 } },
    { name: "o0", op: "linear", inputs: ["att0"], linear: { out_features: 8 } },
    { name: "res0", op: "add", inputs: ["ln0", "o0"] },
    { name: "ln1", op: "layer_norm", inputs: ["res0"] },
    { name: "ff1", op: "linear", inputs: ["ln1"], linear: { out_features: 16 } },
    { name: "act", op: "gelu", inputs: ["ff1"] },
    { name: "ff2", op: "linear", inputs: ["act"], linear: { out_features: 8 } },
    { name: "res1", op: "add", inputs: ["ln1", "ff2"] },
    { name: "ln2", op: "layer_norm", inputs: ["res1"] },
    { name: "cls", op: "token_pool", inputs: ["ln2", "mask"], token_pool: { mode: "mean" } },
    { name: "fc", op: "linear", inputs: ["cls"], linear: { out_features: 3 } } ], output: "fc" })";
}  // namespace tandem::test

namespace tandem::test {
namespace {

using Kind = PipelineAction::Kind;

std::string orders(const PipelineSchedule& s, int stages, int k) {
  std::string out;
  for (int i = 0; i < stages; ++i) {
    for (const PipelineAction& a : s.actions(i, stages, k)) out += action_text(a) + " ";
    out += "| ";
  }
  return out;
}

TEST(PipelineSchedules, OrdersAreTheKnownOnes) {
  EXPECT_EQ(orders(GPipeSchedule(), 2, 3), "F0 F1 F2 B0 B1 B2 | F0 F1 F2 B0 B1 B2 | ");
  // torch.distributed.pipelining's Schedule1F1B: stages - index - 1 forwards of warm-up.
  EXPECT_EQ(orders(OneFOneBSchedule(), 3, 4),
            "F0 F1 F2 B0 F3 B1 B2 B3 | F0 F1 B0 F2 B1 F3 B2 B3 | F0 B0 F1 B1 F2 B2 F3 B3 | ");
  // Input gradients at the backward's place; stage i holds back i weight halves.
  EXPECT_EQ(orders(ZeroBubbleSchedule(), 2, 3), "F0 F1 I0 W0 F2 I1 W1 I2 W2 | F0 I0 F1 I1 W0 F2 I2 W1 W2 | ");
  // This step's forwards and the step before's backwards in turn; the loss stage synchronous.
  EXPECT_EQ(orders(AsyncStashSchedule(), 3, 2), "F0 B0' F1 B1' | B0' F0 B1' F1 | F0 B0 F1 B1 | ");
}

TEST(PipelineSchedules, EveryScheduleRunsEveryShape) {
  for (const char* name : {"gpipe", "1f1b", "zero-bubble", "async"}) {
    const auto schedule = make_pipeline_schedule(name);
    for (int n = 1; n <= 6; ++n)
      for (int k = 1; k <= 9; ++k) {
        SCOPED_TRACE(cat(name, " stages ", n, " micro-batches ", k));
        const ScheduleSimulation sim = simulate(*schedule, n, k);
        for (int s = 0; s < n; ++s) {
          const int peak = sim.peak_in_flight[static_cast<std::size_t>(s)];
          if (std::string(name) == "gpipe") {
            EXPECT_EQ(peak, k);
          } else if (std::string(name) == "1f1b") {
            EXPECT_EQ(peak, std::min(n - s, k));  // its memory bound
          }
        }
        EXPECT_GE(sim.bubble, 0.0);
        EXPECT_LT(sim.bubble, 1.0);
        if (n == 1) {
          EXPECT_EQ(sim.bubble, 0.0);
        }
      }
  }
}

TEST(PipelineSchedules, ZeroBubbleFillsTheBubble) {
  // Unit forwards, backwards of two units (or two halves of one): GPipe and 1F1B idle alike,
  // (n - 1) / (k + n - 1) of the time; input gradients first idle less.
  for (int n = 2; n <= 5; ++n)
    for (int k = n; k <= 2 * n; ++k) {
      const double gpipe = simulate(GPipeSchedule(), n, k).bubble, one = simulate(OneFOneBSchedule(), n, k).bubble,
                   zb = simulate(ZeroBubbleSchedule(), n, k).bubble;
      EXPECT_NEAR(gpipe, static_cast<double>(n - 1) / (k + n - 1), 1e-12) << n << " " << k;
      EXPECT_NEAR(one, gpipe, 1e-12) << n << " " << k;
      EXPECT_LT(zb, 0.6 * one) << n << " " << k;
      // Asynchronous: the step before's backwards fill the drain of the stages before the
      // last (two stages: the last one's synchronous order is 1F1B's).
      const double async = simulate(AsyncStashSchedule(), n, k).bubble;
      if (n > 2) {
        EXPECT_LT(async, one) << n << " " << k;
      } else {
        EXPECT_NEAR(async, one, 1e-12) << n << " " << k;
      }
    }
}

// A schedule whose stages disagree (the last backs up before it forwards), and one that
// forgets a micro-batch: both refused by name.
class BrokenSchedule final : public PipelineSchedule {
 public:
  explicit BrokenSchedule(bool forget) : forget_(forget) {}
  const char* name() const override { return "broken"; }
  std::vector<PipelineAction> actions(int stage, int stages, int k) const override {
    std::vector<PipelineAction> out = GPipeSchedule().actions(stage, stages, k);
    if (forget_) out.pop_back();
    if (!forget_ && stage == stages - 1) std::swap(out.front(), out.back());
    return out;
  }

 private:
  bool forget_;
};

TEST(PipelineSchedules, BrokenOrdersAreRefused) {
  EXPECT_EQ(error_of([] { simulate(BrokenSchedule(false), 3, 2); }),
            "[schedule] broken: stage 0 waits forever at B0 (its input never comes: the stages' orders disagree)");
  EXPECT_EQ(error_of([] { simulate(BrokenSchedule(true), 3, 2); }),
            "[schedule] broken: stage 0 does not forward and back up micro-batch 1 exactly once (1 forwards, 0 "
            "backwards, 0 input and 0 weight halves)");
  EXPECT_EQ(error_of([] { make_pipeline_schedule("interleaved"); }),
            "[schedule] unknown pipeline schedule 'interleaved': use one of gpipe, 1f1b, zero-bubble, async");
}

constexpr const char* kCnnCuts = "pool1, pool2,fc1";

ModelSpec fashion_cnn() { return load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json"); }

TEST(PipelinePartition, FourStagesHoldTheModelOnce) {
  const Graph graph = Graph::build(fashion_cnn());
  const std::vector<Graph> stages = graph.partition(cut_list(kCnnCuts));
  ASSERT_EQ(stages.size(), 4u);
  std::vector<std::string> names;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    EXPECT_EQ(stages[i].name(), cat("fashion-mnist-cnn.stage", i));
    EXPECT_EQ(stages[i].loss(), graph.loss());
    for (const std::string& p : stages[i].param_names()) names.push_back(p);
  }
  EXPECT_EQ(names, graph.param_names());
  EXPECT_EQ(stages[1].inputs()[0].name, "pool1");
  EXPECT_EQ(stages[3].inputs()[0].name, "fc1");
  EXPECT_EQ(stages[3].nodes().back().spec.name, "fc2");
  // The U-shaped split is the three-stage case.
  EXPECT_EQ(graph.tail("pool2,fc1").param_names(), stages[3].param_names());
  auto message = [&](const char* cuts) { return error_of([&] { (void)graph.partition(cut_list(cuts)); }); };
  EXPECT_EQ(message("pool2,pool1"),
            "[split] cut 'pool1' must come after 'pool2': cuts are listed in the order the data flows through them");
  EXPECT_EQ(message("pool1,,fc1"), "[split] cut list 'pool1,,fc1' has an empty name: give node names separated by commas");
  EXPECT_EQ(message("pool1,conv9"), "[split] cut node 'conv9' is not in the graph");
  EXPECT_EQ(message("pool1,fc2"), "[split] cut node 'fc2' is the output: nothing would be left for the back shard");
}

// Each stage starts on the whole model's initial weights (the same draws whatever the cuts),
// made layer by layer without building the whole model: bit for bit what the whole model has.
TEST(PipelinePartition, EachStageStartsOnTheWholeModelsWeightsBitForBit) {
  std::unique_ptr<Backend> reference = make_backend("reference");
  for (const auto& [spec, cuts] : {std::pair{fashion_cnn(), std::string(kCnnCuts)},
                                   std::pair{parse_model_json(kTinyEncoderSpec), std::string("ln0,ln1,ln2")}}) {
    SCOPED_TRACE(cuts);
    const Graph graph = Graph::build(spec);
    for (uint64_t seed : {0u, 7u}) {
      Network whole(graph, *reference, seed);
      std::vector<std::unique_ptr<Network>> nets;
      std::vector<Network*> stages;
      for (const Graph& g : graph.partition(cut_list(cuts))) {
        nets.push_back(std::make_unique<Network>(g, *reference, seed + 1));  // other draws first
        stages.push_back(nets.back().get());
      }
      init_from_whole_model(graph, seed, stages, *reference);
      std::size_t params = 0;
      for (Network* stage : stages)
        for (Param* p : stage->all_params()) {
          ++params;
          const Tensor& want = whole.param(p->name()).value();
          ASSERT_EQ(p->value().shape(), want.shape()) << p->name();
          EXPECT_EQ(std::memcmp(p->value().data(), want.data(), static_cast<std::size_t>(want.numel()) * sizeof(float)), 0)
              << p->name() << " (seed " << seed << ")";
        }
      EXPECT_EQ(params, whole.all_params().size());
    }
  }
  // A shard of another model has parameters the whole model does not.
  const Graph cnn = Graph::build(fashion_cnn());
  Network encoder(Graph::build(parse_model_json(kTinyEncoderSpec)), *reference, 0);
  const std::string error = error_of([&] { init_from_whole_model(cnn, 0, encoder, *reference); });
  EXPECT_EQ(error.rfind("[network] no parameter named '", 0), 0u) << error;
  EXPECT_NE(error.find("' in fashion-mnist-cnn"), std::string::npos) << error;
}

// N stages on the backend under test, from the whole model's weights, with SGD and momentum.
struct Chain {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Network>> nets;
  std::vector<std::unique_ptr<Optimizer>> opts;
  std::unique_ptr<LocalPipeline> pipeline;
  Chain(const std::vector<Graph>& graphs, Network& whole, const LocalPipeline::Options& options) {
    std::vector<Network*> n;
    std::vector<Optimizer*> o;
    for (const Graph& g : graphs) {
      backends.push_back(make_test_backend(backend_under_test()));  // a backend a stage: threads never share one
      nets.push_back(std::make_unique<Network>(g, *backends.back(), 0));
      copy_params(*nets.back(), whole);
      opts.push_back(make_optimizer(nets.back()->params(),
                                    {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f}));
      n.push_back(nets.back().get());
      o.push_back(opts.back().get());
    }
    pipeline = std::make_unique<LocalPipeline>(n, o, options);
  }
  float max_diff_from(Network& whole) {
    float worst = 0;
    for (auto& net : nets) worst = std::max(worst, test::max_diff(*net, whole));
    return worst;
  }
};

// Step t's rows of a small data set, taken round robin.
struct StepRows {
  const std::vector<Tensor>& inputs;
  const std::vector<int32_t>& labels;
  int64_t batch;
  std::vector<Tensor> inputs_of(int step) const {
    std::vector<Tensor> out;
    const int64_t n = inputs[0].shape()[0];
    for (const Tensor& t : inputs) out.push_back(t.slice_batch((step * batch) % n, batch));
    return out;
  }
  const int32_t* labels_of(int step) const {
    return labels.data() + (step * batch) % static_cast<int64_t>(labels.size());
  }
};

// Trains the model whole (one stage) and as a pipeline cut at `cuts`, under every schedule,
// on one thread and on a thread a stage, `steps` steps of `batch` in K micro-batches each.
void expect_pipelines_train_like_the_whole_model(const ModelSpec& spec, const std::string& cuts, int steps,
                                                 int64_t batch, int k, const std::vector<Tensor>& inputs,
                                                 const std::vector<int32_t>& labels, float tolerance) {
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition(cut_list(cuts));
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network init(graph, *backend, 11);
  Chain whole({graph}, init, {});
  std::vector<double> whole_loss;
  const StepRows rows{inputs, labels, batch};
  for (int step = 0; step < steps; ++step)
    whole_loss.push_back(whole.pipeline->train_step(rows.inputs_of(step), rows.labels_of(step), k).loss_sum);
  for (const char* schedule : {"gpipe", "1f1b", "zero-bubble"})
    for (bool threads : {false, true}) {
      SCOPED_TRACE(cat(schedule, threads ? ", a thread a stage" : ", one thread"));
      Chain chain(parts, init, {.schedule = schedule, .threads = threads});
      for (int step = 0; step < steps; ++step) {
        const StepStats s = chain.pipeline->train_step(rows.inputs_of(step), rows.labels_of(step), k);
        EXPECT_NEAR(s.loss_sum, whole_loss[static_cast<std::size_t>(step)], 1e-3 * std::max(1.0, whole_loss[0]))
            << "step " << step;
        EXPECT_EQ(s.samples, batch);
      }
      EXPECT_LE(chain.max_diff_from(*whole.nets[0]), tolerance);
      const StageTimes& t = chain.pipeline->times();
      ASSERT_EQ(t.busy_s.size(), parts.size());
      for (double b : t.busy_s) EXPECT_GT(b, 0.0);
      EXPECT_GE(t.bubble(), threads ? -1e-3 : -1e9);  // idle time is measured with threads
      EXPECT_LT(t.bubble(), 1.0);
    }
}

// The asynchronous schedule against a replay of its rule on the whole model. Step t's
// forwards see C[t] and its backwards run on them (the stash); its update applies after the
// next step's forwards: C[0] = C[1] = the initial weights, C[t+2] = C[t+1] - lr g_t(C[t]);
// except on the last stage, which holds the loss and is synchronous: L[t+1] = L[t] - lr g_t(L[t]).
void expect_async_pipeline_follows_its_rule(const ModelSpec& spec, const std::string& cuts, int steps, int64_t batch,
                                            int k, const std::vector<Tensor>& inputs,
                                            const std::vector<int32_t>& labels, float tolerance) {
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition(cut_list(cuts));
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network init(graph, *backend, 11);
  const StepRows rows{inputs, labels, batch};
  Chain replay({graph}, init, {});
  Network& net = *replay.nets[0];
  Stage stage(net, replay.opts[0].get());
  std::vector<Tensor> seen, current;  // C[t] (the forwards'), C[t+1] (the parameters')
  for (Param* p : net.params()) {
    seen.push_back(p->value().clone());
    current.push_back(p->value().clone());
  }
  std::vector<bool> last_stage;  // per parameter: the loss stage's (never stale)
  for (Param* p : net.params()) {
    const auto& names = parts.back().param_names();
    last_stage.push_back(std::find(names.begin(), names.end(), p->name()) != names.end());
  }
  auto load = [&](const std::vector<Tensor>& from) {
    for (std::size_t i = 0; i < from.size(); ++i) {
      if (last_stage[i] && &from == &seen) continue;
      net.params()[i]->value().copy_from(from[i]);
      net.params()[i]->bump_version();
    }
  };
  std::vector<double> replay_loss;
  for (int step = 0; step < steps; ++step) {
    for (std::size_t i = 0; i < current.size(); ++i) current[i].copy_from(net.params()[i]->value());
    load(seen);
    net.zero_grad();
    double loss = 0;
    const std::vector<Tensor> x = rows.inputs_of(step);
    for (int mb = 0; mb < k; ++mb) {
      const auto [begin, count] = microbatch_range(batch, k, mb);
      std::vector<Tensor> in;
      for (const Tensor& t : x) in.push_back(t.slice_batch(begin, count));
      loss += stage.train_loss(in, mb, rows.labels_of(step) + begin, 1.0f / static_cast<float>(batch), false).loss;
    }
    replay_loss.push_back(loss);
    load(current);
    for (std::size_t i = 0; i < current.size(); ++i) seen[i].copy_from(current[i]);
    stage.step();
  }
  for (bool threads : {false, true}) {
    SCOPED_TRACE(threads ? "a thread a stage" : "one thread");
    Chain chain(parts, init, {.schedule = "async", .threads = threads});
    std::vector<Tensor> buffer;  // refilled every step, as a training loop does: the stash must not read it
    for (const Tensor& t : inputs) buffer.push_back(t.slice_batch(0, batch).clone());
    for (int step = 0; step < steps; ++step) {
      const std::vector<Tensor> x = rows.inputs_of(step);
      for (std::size_t i = 0; i < x.size(); ++i) buffer[i].copy_from(x[i]);
      const StepStats s = chain.pipeline->train_step(buffer, rows.labels_of(step), k);
      EXPECT_NEAR(s.loss_sum, replay_loss[static_cast<std::size_t>(step)], 1e-4 * std::max(1.0, replay_loss[0]))
          << "step " << step;
    }
    chain.pipeline->flush();
    EXPECT_LE(chain.max_diff_from(net), tolerance);
    EXPECT_GT(chain.max_diff_from(init), 100 * tolerance) << "the weights moved";
  }
}

TEST(LocalPipeline, FourStageCnnTrainsLikeTheWholeModelUnderEverySchedule) {
  const ModelSpec spec = fashion_cnn();
  Rng rng(5);
  const int64_t n = 32;
  std::vector<Tensor> inputs{random_tensor(Shape{n, 28, 28, 1}, rng, 0.0f, 1.0f)};
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>(rng.below(10)));
  expect_pipelines_train_like_the_whole_model(spec, kCnnCuts, 20, 8, 4, inputs, labels, 1e-5f);
  expect_async_pipeline_follows_its_rule(spec, kCnnCuts, 20, 8, 4, inputs, labels, 1e-5f);
}

// A step that throws (a label out of range, at the loss stage) is lost and leaves nothing
// behind: the pipeline then trains as one that never saw it. Asynchronous, the step before's
// pending backwards are dropped with it (its synchronous loss stage had updated already): the
// stages before the last keep their weights, and the next steps train.
TEST(LocalPipeline, AStepThatFailsLeavesTheNextOneClean) {
  const ModelSpec spec = fashion_cnn();
  const Graph graph = Graph::build(spec);
  const std::vector<Graph> parts = graph.partition(cut_list(kCnnCuts));
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network init(graph, *backend, 11);
  Rng rng(4);
  const Tensor images = random_tensor(Shape{8, 28, 28, 1}, rng, 0.0f, 1.0f);
  std::vector<int32_t> good(8), bad(8);
  for (int i = 0; i < 8; ++i) good[static_cast<std::size_t>(i)] = static_cast<int32_t>(rng.below(10));
  bad = good;
  bad[5] = 12;
  for (const char* schedule : {"1f1b", "zero-bubble", "async"})
    for (bool threads : {false, true}) {
      SCOPED_TRACE(cat(schedule, threads ? ", a thread a stage" : ", one thread"));
      const bool async = std::string(schedule) == "async";
      Chain failing(parts, init, {.schedule = schedule, .threads = threads});
      Chain clean(parts, init, {.schedule = schedule, .threads = threads});
      failing.pipeline->train_step(images, good.data(), 4);
      EXPECT_EQ(error_of([&] { failing.pipeline->train_step(images, bad.data(), 4); }),
                "[loss] label 12 at row 1 is outside [0, 10)");
      if (async) {
        failing.pipeline->flush();  // nothing pending: a no-op
        for (std::size_t i = 0; i + 1 < parts.size(); ++i) EXPECT_EQ(max_diff(*failing.nets[i], init), 0.0f) << i;
        for (int step = 0; step < 3; ++step) failing.pipeline->train_step(images, good.data(), 4);
        failing.pipeline->flush();
        EXPECT_GT(failing.max_diff_from(init), 1e-4f);
        EXPECT_TRUE(std::isfinite(failing.max_diff_from(init)));
        continue;
      }
      clean.pipeline->train_step(images, good.data(), 4);
      for (auto* c : {&failing, &clean}) {
        c->pipeline->train_step(images, good.data(), 4);
        c->pipeline->flush();
      }
      float worst = 0;
      for (std::size_t i = 0; i < parts.size(); ++i) worst = std::max(worst, max_diff(*failing.nets[i], *clean.nets[i]));
      EXPECT_EQ(worst, 0.0f);
    }
}

// A transformer cut inside its encoder at three places: the mask crosses every cut.
const char* const kEncoder = kTinyEncoderSpec;

TEST(LocalPipeline, FourStageEncoderTrainsLikeTheWholeModelWithTheMaskAtEveryCut) {
  const ModelSpec spec = parse_model_json(kEncoder);
  const std::vector<Graph> parts = Graph::build(spec).partition(cut_list("ln0,ln1,ln2"));
  for (std::size_t i = 1; i < parts.size(); ++i) {
    ASSERT_EQ(parts[i].inputs().size(), 2u) << i;
    EXPECT_EQ(parts[i].inputs()[1].name, "mask");
  }
  Rng rng(9);
  const int64_t n = 16;
  Tensor ids = Tensor::empty(Shape{n, 6}), mask = Tensor::empty(Shape{n, 6});
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 2 + static_cast<int64_t>(rng.below(5));  // padded sequences of 2 to 6 tokens
    for (int64_t t = 0; t < 6; ++t) {
      ids.data()[i * 6 + t] = static_cast<float>(t < len ? 1 + rng.below(19) : 0);
      mask.data()[i * 6 + t] = t < len ? 1.0f : 0.0f;
    }
    labels.push_back(static_cast<int32_t>(rng.below(3)));
  }
  expect_pipelines_train_like_the_whole_model(spec, "ln0,ln1,ln2", 20, 8, 4, {ids, mask}, labels, 1e-5f);
  expect_async_pipeline_follows_its_rule(spec, "ln0,ln1,ln2", 20, 8, 4, {ids, mask}, labels, 1e-5f);
}

// ResNet18 (batch norm: statistics per micro-batch, as in every pipeline) in four stages.
TEST(LocalPipeline, FourStageResNetTrainsLikeTheWholeModel) {
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/models/resnet18-32.json");
  const Graph graph = Graph::build(spec);
  Rng rng(3);
  const int64_t n = 8;
  std::vector<Tensor> inputs{random_tensor(graph.inputs()[0].shape.batched(n), rng, 0.0f, 1.0f)};
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(graph.classes()))));
  expect_pipelines_train_like_the_whole_model(spec, "relu10,relu26,relu42",
                                              2, 4, 2, inputs, labels, 1e-5f);
  expect_async_pipeline_follows_its_rule(spec, "relu10,relu26,relu42", 3, 4, 2, inputs, labels, 1e-5f);
}

}  // namespace
}  // namespace tandem::test

namespace tandem::test {
namespace {

TEST(PipelineSchedules, CostsAndLinksSetTheLength) {
  // Two stages, one micro-batch: F on the first, the hop, F and a whole backward on the
  // second, the hop back, the first's backward.
  std::vector<StageCost> costs{{1, 1, 1, 0.5}, {1, 1, 1, 0}};
  EXPECT_DOUBLE_EQ(simulate(GPipeSchedule(), costs, 1).length, 1 + 0.5 + 3 + 0.5 + 2);
  // A link slower than the stages bounds the step: each hop carries one message at a time.
  // Activations arrive at 11, 21, 31; the second stage is done with them at 32 and backs up
  // until 38, its gradients leaving at 34, 36, 38 and arriving at 44, 54, 64; the first
  // stage's last backward ends at 66.
  costs[0].link = 10;
  EXPECT_DOUBLE_EQ(simulate(GPipeSchedule(), costs, 3).length, 66);
}

// Eight equal linear layers of 64 and a small head: a chain of cuts anywhere.
std::string layer_stack() {
  std::string nodes;
  std::string prev = "x";
  for (int i = 1; i <= 8; ++i) {
    nodes += cat(R"({ name: "fc)", i, R"(", op: "linear", inputs: [")", prev, R"("], linear: { out_features: 64 } },)");
    nodes += cat(R"({ name: "relu)", i, R"(", op: "relu", inputs: ["fc)", i, R"("] },)");
    prev = cat("relu", i);
  }
  nodes += cat(R"({ name: "head", op: "linear", inputs: [")", prev, R"("], linear: { out_features: 4 } })");
  return cat(R"({ name: "stack", inputs: [ { name: "x", shape: [64] } ], nodes: [ )", nodes, " ] }");
}

struct Partitioning {
  ModelSpec spec = parse_model_json(layer_stack());
  Graph graph = Graph::build(spec);
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network whole{graph, *backend, 1};
  Partitioning() { whole.set_input_gradient(false); }
  // The linears a stage holds.
  static int linears(const PipelinePlan& p, std::size_t s) {
    const auto number = [](const std::string& n) { return n == "head" ? 9 : std::stoi(n.substr(n.find_first_of("0123456789"))); };
    return number(p.stages[s].last) - (s == 0 ? 0 : number(p.stages[s - 1].last));
  }
};

std::vector<PipelineNode> machines(std::vector<double> gflops, double memory_mb = 0) {
  std::vector<PipelineNode> out;
  for (std::size_t i = 0; i < gflops.size(); ++i) out.push_back({cat("m", i), gflops[i], memory_mb, 10000});
  return out;
}

TEST(PipelinePartitioner, EqualMachinesGetEqualShares) {
  Partitioning p;
  const std::vector<PipelinePlan> plans = plan_pipeline(p.whole, machines({10, 10, 10, 10}), {.batch = 64});
  const PipelinePlan& best = plans.front();
  ASSERT_EQ(best.cuts.size(), 3u);
  for (std::size_t s = 0; s < 4; ++s) EXPECT_NEAR(Partitioning::linears(best, s), 2.25, 0.8) << s;
  EXPECT_EQ(best.microbatches, 16);  // the most micro-batches: the least bubble when links are fast
  for (std::size_t i = 1; i < plans.size(); ++i) EXPECT_LE(plans[i].samples_per_s, best.samples_per_s);
  // C(16 legal cuts, 3) choices x 5 values of K.
  EXPECT_EQ(plans.size(), 560u * 5u);
}

TEST(PipelinePartitioner, ASlowMachineGetsLessAndMemoryBoundsAShare) {
  Partitioning p;
  const PipelinePlan slow = plan_pipeline(p.whole, machines({10, 2.5, 10}), {.batch = 64}).front();
  EXPECT_LT(Partitioning::linears(slow, 1), Partitioning::linears(slow, 0));
  EXPECT_LT(Partitioning::linears(slow, 1), Partitioning::linears(slow, 2));
  // The first machine's memory: only plans whose first stage fits come first.
  const PipelinePlan free = plan_pipeline(p.whole, machines({10, 10}), {.batch = 64}).front();
  std::vector<PipelineNode> tight = machines({10, 10});
  tight[0].memory_mb = 0.9 * free.stages[0].memory_mb;
  const PipelinePlan bounded = plan_pipeline(p.whole, tight, {.batch = 64}).front();
  EXPECT_TRUE(bounded.fits);
  EXPECT_LE(bounded.stages[0].memory_mb, tight[0].memory_mb);
  EXPECT_LT(Partitioning::linears(bounded, 0), Partitioning::linears(free, 0));
  tight[0].memory_mb = 1e-3;
  EXPECT_FALSE(plan_pipeline(p.whole, tight, {.batch = 64}).front().fits);
}

TEST(PipelinePartitioner, BadChainsAreRefused) {
  Partitioning p;
  EXPECT_EQ(error_of([&] { plan_pipeline(p.whole, machines({10, 0}), {}); }),
            "[partitioner] node 'm1': gflops must be > 0 (what it sustains in training; `tandem profile` measures it)");
  std::vector<PipelineNode> no_link = machines({10, 10});
  no_link[0].link_mbps = 0;
  EXPECT_EQ(error_of([&] { plan_pipeline(p.whole, no_link, {}); }),
            "[partitioner] node 'm0': link_mbps (to 'm1') must be > 0");
  EXPECT_EQ(error_of([&] { plan_pipeline(p.whole, machines(std::vector<double>(18, 1.0)), {}); }),
            "[partitioner] 18 machines need 17 cuts, and stack has 16 legal ones: use fewer machines");
  EXPECT_EQ(error_of([&] { predict_pipeline(p.whole, machines({1, 1, 1}), {"fc3", "fc2"}, 4, {}); }),
            "[partitioner] cut 'fc2' must come after 'fc3'");
  EXPECT_EQ(error_of([&] { predict_pipeline(p.whole, machines({1, 1, 1}), {"fc3"}, 4, {}); }),
            "[partitioner] 1 cuts make 2 stages for 3 machines");
  EXPECT_EQ(error_of([&] { predict_pipeline(p.whole, machines({1, 1}), {"nope"}, 4, {}); }),
            "[partitioner] 'nope' is not a legal cut of stack");
}

}  // namespace
}  // namespace tandem::test
