// The event-driven edge (the browser edge's trainer) against an in-process cloud session:
// it trains, evaluates and says goodbye; refusals, lost links and bad data end it with the
// exact reason; in a split-federated cloud it takes part in every round.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <sstream>

#include "backends/registry.h"
#include "cloud/federation/federation.h"
#include "cloud/session/back_shard_trainer.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/privacy/rdp_accountant.h"
#include "edge/session/event_edge.h"
#include "edge/session/in_memory_checkpoints.h"
#include "tools/audit_verify.h"
#include "test_support.h"

namespace tandem::test {
namespace {

constexpr const char* kSpec = kSmallSplitSpec;

struct Pixels {
  std::vector<uint8_t> bytes;
  std::vector<int32_t> labels;
};
Pixels pixels(int64_t n, uint64_t seed) {
  const QuadrantData d = quadrant_data(n, seed);
  Pixels p{std::vector<uint8_t>(static_cast<std::size_t>(n * 64)), d.labels};
  for (int64_t i = 0; i < n * 64; ++i)
    p.bytes[static_cast<std::size_t>(i)] = static_cast<uint8_t>(std::lround(std::min(1.0f, d.images[i]) * 255.0f));
  return p;
}

// The cloud's checkpoints, kept in memory.
struct MemoryCheckpoints final : SessionCheckpoints {
  std::map<std::pair<std::string, uint64_t>, std::vector<uint8_t>> kept;
  void save(const std::string& client_id, uint64_t step, std::span<const uint8_t> checkpoint) override {
    kept[{client_id, step}].assign(checkpoint.begin(), checkpoint.end());
  }
  CheckpointData load(const std::string& client_id, uint64_t step) override {
    const auto& bytes = kept.at({client_id, step});
    return decode_checkpoint(bytes);
  }
};

// The edge's messages go to a cloud session in this process, its replies come back in order.
struct Harness {
  ModelSpec spec = parse_model_json(kSpec);
  Graph graph = Graph::build(spec);
  std::unique_ptr<Backend> backend = make_backend("reference");
  std::string cut = "pool1";  // the edge's config.cut when it names one
  Network back{graph.split(cut).second, *backend, 5};
  Sgd back_opt{back.params(), {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false}};
  BackShardTrainer shard{back, back_opt};
  MemoryCheckpoints cloud_checkpoints;
  CloudSessionConfig cc;
  std::unique_ptr<CloudSession> cloud;
  std::deque<std::vector<uint8_t>> to_edge;
  std::vector<std::vector<uint8_t>> sent;  // every message the edge sent, as it left
  std::vector<std::string> events;
  std::unique_ptr<EventEdge> edge;
  bool cloud_closed = false;

  explicit Harness(EventEdgeConfig config, std::function<std::string(const std::string&, const std::string&)> authorize = nullptr)
      : cut(config.cut.empty() ? "pool1" : config.cut) {
    Network whole(graph, *backend, config.seed);
    for (Param* p : back.params()) {
      p->value().copy_from(whole.param(p->name()).value());
      p->bump_version();
    }
    cc.model_hash = model_hash(spec, cut);
    cc.cut = cut;
    cc.batch_size = 32;
    cc.microbatches = 4;
    cc.classes = 4;
    cc.authorize = std::move(authorize);
    cc.checkpoints = &cloud_checkpoints;
    cloud = std::make_unique<CloudSession>(shard, cc);
    make_edge(config);
  }

  // The run's driver (again: the browser's after a lost link, from its checkpoint in memory).
  void make_edge(const EventEdgeConfig& config) {
    edge.reset();
    edge = std::make_unique<EventEdge>(
        spec, config,
        [this](std::span<const uint8_t> b) {
          sent.emplace_back(b.begin(), b.end());
          if (cloud_closed) return;
          CloudReply r = cloud->handle(Frame::copy_of(b.data(), b.size()));
          cloud->finish_step();
          if (!r.bytes.empty()) to_edge.emplace_back(r.bytes.begin(), r.bytes.end());
          cloud_closed = cloud_closed || r.close;
        },
        [this](const EdgeEvent& e) { events.push_back(e.json()); });
  }

  // A new connection: a fresh cloud session, nothing in flight.
  void reconnect() {
    cloud = std::make_unique<CloudSession>(shard, cc);
    to_edge.clear();
    cloud_closed = false;
  }

  // The 8x8 images' training and test sets given, the run to its end.
  void train_on(const Pixels& train, const Pixels& test) {
    edge->set_data(false, train.bytes.data(), train.labels.data(), static_cast<int64_t>(train.labels.size()), 8, 8);
    edge->set_data(true, test.bytes.data(), test.labels.data(), static_cast<int64_t>(test.labels.size()), 8, 8);
    run();
  }

  void run() {
    edge->on_open();
    while (!to_edge.empty() && !edge->finished()) {
      const std::vector<uint8_t> m = std::move(to_edge.front());
      to_edge.pop_front();
      edge->on_message(Frame::copy_of(m.data(), m.size()));
    }
  }
  int count(const std::string& kind) const {
    int n = 0;
    for (const auto& e : events) n += e.find("\"event\":\"" + kind + "\"") != std::string::npos;
    return n;
  }
  double field(const std::string& json, const std::string& name) const {
    const auto at = json.find("\"" + name + "\":");
    return at == std::string::npos ? NAN : std::atof(json.c_str() + at + name.size() + 3);
  }
};

EventEdgeConfig config(int64_t steps) {
  EventEdgeConfig c;
  c.client_id = "page-1";
  c.batch = 32;
  c.microbatches = 4;
  c.steps = steps;
  c.optimizer = {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false};
  c.seed = 5;
  c.backend = backend_under_test();
  return c;
}

TEST(EventEdge, TrainsEvaluatesAndSaysGoodbye) {
  Harness h(config(40));
  const Pixels train = pixels(512, 1), test = pixels(256, 2);
  h.train_on(train, test);
  ASSERT_TRUE(h.edge->finished());
  ASSERT_FALSE(h.edge->failed()) << h.events.back();
  EXPECT_EQ(h.count("connected"), 1);
  EXPECT_EQ(h.count("welcome"), 1);
  EXPECT_EQ(h.count("step"), 40);
  EXPECT_EQ(h.count("evaluated"), 1);
  ASSERT_EQ(h.count("done"), 1);
  EXPECT_EQ(h.edge->steps_done(), 40);
  EXPECT_EQ(h.cloud->step(), 40u);
  double first = 0, last = 0;
  std::vector<double> losses;
  for (const auto& e : h.events)
    if (e.find("\"event\":\"step\"") != std::string::npos) losses.push_back(h.field(e, "loss"));
  for (int i = 0; i < 5; ++i) first += losses[static_cast<std::size_t>(i)] / 5, last += losses[losses.size() - 1 - i] / 5;
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  EXPECT_GT(h.field(h.events.back(), "test_accuracy"), 0.9) << h.events.back();
  EXPECT_TRUE(h.cloud->closed()) << "the cloud saw no Bye";
}

// The egress log of a real run: it verifies, says what left (activations and labels, never
// the images), and every kind of edit breaks it with the line and the reason.
TEST(EgressAudit, RunLogVerifiesAndEditsAreCaught) {
  std::vector<std::string> lines;
  EgressAudit audit([&](const std::string& line) { lines.push_back(line); });
  EventEdgeConfig c = config(6);
  c.audit = &audit;
  Harness h(c);
  const Pixels train = pixels(256, 1), test = pixels(64, 2);
  h.train_on(train, test);
  ASSERT_TRUE(h.edge->finished() && !h.edge->failed()) << h.events.back();
  const std::string anchor = audit.finish("done");
  ASSERT_EQ(lines.size(), h.sent.size() + 2) << "a run record, one line a message, a summary";
  uint64_t sent_bytes = 0;
  for (const auto& m : h.sent) sent_bytes += m.size();
  EXPECT_EQ(audit.bytes(), sent_bytes);

  auto verify = [](const std::vector<std::string>& log) {
    std::string text;
    for (const auto& l : log) text += l + "\n";
    std::istringstream in(text);
    return verify_egress_log(in);
  };
  const EgressReport ok = verify(lines);
  ASSERT_EQ(ok.error, "");
  EXPECT_EQ(ok.last_hash, anchor);
  EXPECT_EQ(ok.runs, 1u);
  EXPECT_EQ(ok.clients, std::set<std::string>{"page-1"});
  EXPECT_EQ(ok.messages, h.sent.size());
  EXPECT_EQ(ok.bytes, sent_bytes);
  ASSERT_EQ(ok.kinds.count("Forward"), 1u);
  EXPECT_EQ(ok.kinds.at("Forward").messages, 24u) << "6 steps of 4 micro-batches";
  EXPECT_EQ(ok.kinds.at("Forward").labels, 6u * 32u);
  EXPECT_EQ(ok.kinds.at("Forward").tensors, std::set<std::string>{"activations f32 [8,4,4,6]"});
  EXPECT_EQ(ok.kinds.at("Hello").messages, 1u);
  EXPECT_EQ(ok.kinds.at("Bye").messages, 1u);
  EXPECT_EQ(ok.kinds.at("EvalForward").labels, 64u);
  EXPECT_TRUE(ok.notes.empty());
  const std::string text = egress_report_text("log", ok);
  EXPECT_NE(text.find("log verifies: " + std::to_string(lines.size()) + " lines, 1 run (client page-1)"),
            std::string::npos)
      << text;

  // Edited: one digit of a Forward's byte count.
  std::vector<std::string> edited = lines;
  const std::size_t at = edited[5].find("\"bytes\":") + 8;
  edited[5][at] = edited[5][at] == '1' ? '2' : '1';
  EXPECT_EQ(verify(edited).error, "line 6: its text does not give its hash: the line was edited");
  // Re-hashed after the edit: the next line's "prev" no longer matches.
  std::string claimed, computed;
  ASSERT_TRUE(egress_line_hashes(edited[5], claimed, computed));
  edited[5].replace(edited[5].size() - 66, 64, computed);
  EXPECT_EQ(verify(edited).error,
            "line 7: its \"prev\" is not the hash of the line before: a line was removed, inserted or reordered");
  std::vector<std::string> removed = lines;
  removed.erase(removed.begin() + 3);
  EXPECT_EQ(verify(removed).error,
            "line 4: its \"prev\" is not the hash of the line before: a line was removed, inserted or reordered");
  std::vector<std::string> swapped = lines;
  std::swap(swapped[2], swapped[3]);
  EXPECT_EQ(verify(swapped).error,
            "line 3: its \"prev\" is not the hash of the line before: a line was removed, inserted or reordered");
  std::vector<std::string> cut(lines.begin(), lines.end() - 3);  // the end, summary included
  const EgressReport truncated = verify(cut);
  EXPECT_EQ(truncated.error, "");
  ASSERT_EQ(truncated.notes.size(), 1u);
  EXPECT_EQ(truncated.notes[0], "run 1 has no summary: the edge stopped without one, or the log was cut");
  EXPECT_NE(truncated.last_hash, anchor) << "the anchor tells a cut log";
  std::vector<std::string> garbage = lines;
  garbage.insert(garbage.begin() + 2, "{\"not\":\"a log line\"}");
  EXPECT_EQ(verify(garbage).error, "line 3: not an egress log line (no hash at its end)");

  // A second run continues the chain in the same log.
  EgressAudit again([&](const std::string& line) { lines.push_back(line); }, anchor);
  again.begin_run("page-1", "m", "pool1", {});
  again.finish("done");
  const EgressReport two = verify(lines);
  EXPECT_EQ(two.error, "");
  EXPECT_EQ(two.runs, 2u);
}

// What leaves is activations and labels: no row of any training or test image appears in any
// message the edge sent (as the f32 the edge holds it in).
TEST(EgressAudit, NoInputImageLeavesTheEdge) {
  Harness h(config(8));
  const Pixels train = pixels(256, 1), test = pixels(64, 2);
  h.train_on(train, test);
  ASSERT_TRUE(h.edge->finished() && !h.edge->failed()) << h.events.back();
  int rows_checked = 0;
  for (const Pixels* set : {&train, &test})
    for (std::size_t i = 0; i + 8 <= set->bytes.size(); i += 8) {
      float row[8];
      std::set<uint8_t> distinct;
      for (int x = 0; x < 8; ++x) {
        row[x] = static_cast<float>(set->bytes[i + x]) / 255.0f;
        distinct.insert(set->bytes[i + x]);
      }
      if (distinct.size() < 4) continue;  // flat rows (zeros) would match any padding
      ++rows_checked;
      for (const auto& m : h.sent)
        ASSERT_EQ(std::search(m.begin(), m.end(), reinterpret_cast<const uint8_t*>(row),
                              reinterpret_cast<const uint8_t*>(row) + sizeof row),
                  m.end())
            << "an image row left the edge";
    }
  EXPECT_GT(rows_checked, 100);
}

// Noise on the cut, wired: with a clip no sample reaches and no noise, the run is the same
// run bit for bit; with noise, each step reports the accountant's epsilon and a budget stops
// the run before the step that would pass it.
TEST(EventEdgeDp, AnUnreachedClipWithoutNoiseChangesNothing) {
  const Pixels train = pixels(256, 1), test = pixels(64, 2);
  auto run = [&](float clip) {
    EventEdgeConfig c = config(8);
    c.privacy.dp_clip = clip;
    c.privacy.dp_seed = 3;
    auto h = std::make_unique<Harness>(c);
    h->edge->set_data(false, train.bytes.data(), train.labels.data(), 256, 8, 8);
    h->edge->set_data(true, test.bytes.data(), test.labels.data(), 64, 8, 8);
    h->run();
    return h;
  };
  const auto plain = run(0.0f), clipped = run(1e9f);
  ASSERT_TRUE(clipped->edge->finished() && !clipped->edge->failed()) << clipped->events.back();
  const auto a = plain->edge->front().params(), b = clipped->edge->front().params();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    for (int64_t j = 0; j < a[i]->value().numel(); ++j)
      ASSERT_EQ(a[i]->value().data()[j], b[i]->value().data()[j]) << a[i]->name() << " " << j;
  EXPECT_NE(clipped->events.back().find("\"dp_epsilon\":null"), std::string::npos) << clipped->events.back();
}

TEST(EventEdgeDp, EpsilonIsReportedAndTheBudgetStopsTheRun) {
  const Pixels train = pixels(256, 1), test = pixels(64, 2);
  const double q = 32.0 / 256.0;
  EventEdgeConfig c = config(40);
  c.privacy.dp_clip = 1.0f;
  c.privacy.dp_noise = 1.0f;
  c.privacy.dp_seed = 9;
  c.privacy.dp_epsilon_budget = (dp_epsilon(q, 1.0, 5, 1e-5).epsilon + dp_epsilon(q, 1.0, 6, 1e-5).epsilon) / 2;
  Harness h(c);
  h.train_on(train, test);
  ASSERT_TRUE(h.edge->finished() && !h.edge->failed()) << h.events.back();
  EXPECT_EQ(h.edge->steps_done(), 5) << "the sixth step would pass the budget";
  int k = 0;
  for (const auto& e : h.events)
    if (e.find("\"event\":\"step\"") != std::string::npos) {
      ++k;
      EXPECT_NEAR(h.field(e, "dp_epsilon"), dp_epsilon(q, 1.0, static_cast<uint64_t>(k), 1e-5).epsilon, 1e-3) << e;
      EXPECT_TRUE(std::isfinite(h.field(e, "loss"))) << e;
    }
  EXPECT_EQ(k, 5);
  EXPECT_NE(h.events.back().find("\"stopped\":\"the next step would pass the privacy budget"), std::string::npos)
      << h.events.back();
  EXPECT_TRUE(h.cloud->closed()) << "the run ended normally, with Bye";
}

// Epsilon follows the releases, not the steps: an edge whose count (ReleaseCount, durable in
// tandem-edge's checkpoint folder) says a process before it released 3 steps reports epsilon
// after 4 for its first step, and the budget that allowed 5 steps stops it after 2.
TEST(EventEdgeDp, EpsilonCountsTheReleasesOfProcessesBefore) {
  struct Counted final : ReleaseCount {
    uint64_t n = 3;  // released by a process before this one
    uint64_t releases() const override { return n; }
    void count_one() override { ++n; }
    void at_least(uint64_t m) override { n = std::max(n, m); }
  } counted;
  const Pixels train = pixels(256, 1), test = pixels(64, 2);
  const double q = 32.0 / 256.0;
  EventEdgeConfig c = config(40);
  c.privacy.dp_clip = 1.0f;
  c.privacy.dp_noise = 1.0f;
  c.privacy.dp_seed = 9;
  c.privacy.dp_epsilon_budget = (dp_epsilon(q, 1.0, 5, 1e-5).epsilon + dp_epsilon(q, 1.0, 6, 1e-5).epsilon) / 2;
  c.releases = &counted;
  Harness h(c);
  h.train_on(train, test);
  ASSERT_TRUE(h.edge->finished() && !h.edge->failed()) << h.events.back();
  EXPECT_EQ(h.edge->steps_done(), 2) << "releases 4 and 5 fit the budget, a sixth would not";
  EXPECT_EQ(counted.n, 5u);
  int k = 0;
  for (const auto& e : h.events)
    if (e.find("\"event\":\"step\"") != std::string::npos) {
      ++k;
      EXPECT_NEAR(h.field(e, "dp_epsilon"), dp_epsilon(q, 1.0, 3 + static_cast<uint64_t>(k), 1e-5).epsilon, 1e-3) << e;
    }
  EXPECT_EQ(k, 2);
}

// --dp-eval clean: with no step taken, the evaluation batch leaves exactly as it does without
// DP (the same weights, the same images), and noised evaluation changes it.
TEST(EventEdgeDp, CleanEvaluationSendsTheActivationsAsTheyAre) {
  const Pixels train = pixels(64, 1), test = pixels(64, 2);
  auto eval_activations = [&](float noise, bool noised_eval) {
    EventEdgeConfig c = config(0);
    c.epochs = 0;  // evaluate the starting weights only
    if (noise > 0.0f) {
      c.privacy.dp_clip = 1.0f;
      c.privacy.dp_noise = noise;
      c.privacy.dp_seed = 3;
      c.privacy.dp_noise_evaluation = noised_eval;
    }
    Harness h(c);
    h.train_on(train, test);
    EXPECT_TRUE(h.edge->finished() && !h.edge->failed()) << h.events.back();
    for (const auto& bytes : h.sent) {
      const Frame f = Frame::copy_of(bytes.data(), bytes.size());
      WireError err;
      const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
      if (m && m->payload_type() == wire::Payload::EvalForward) {
        const auto* data = m->payload_as_EvalForward()->activations()->data();
        return std::vector<uint8_t>(data->begin(), data->end());
      }
    }
    ADD_FAILURE() << "no EvalForward was sent";
    return std::vector<uint8_t>();
  };
  const auto plain = eval_activations(0.0f, true);
  EXPECT_FALSE(plain.empty());
  EXPECT_EQ(eval_activations(1.0f, false), plain);
  EXPECT_NE(eval_activations(1.0f, true), plain);
}

// NoPeek: the same run with a negligible and with a strong penalty. Every step reports its
// distance correlation; the strong penalty drives the correlation of what leaves well below
// the other run's (0.98 -> 0.84 here; on these quadrant images, where the class is where
// the pixels are, it costs accuracy), and training goes on (finite losses, every step taken).
TEST(EventEdgeNoPeek, ThePenaltyLowersTheCorrelationOfWhatLeaves) {
  const Pixels train = pixels(256, 1), test = pixels(64, 2);
  auto run = [&](float alpha) {
    EventEdgeConfig c = config(40);
    c.privacy.nopeek = alpha;
    Harness h(c);
    h.train_on(train, test);
    EXPECT_TRUE(h.edge->finished() && !h.edge->failed()) << h.events.back();
    EXPECT_EQ(h.cloud->step(), 40u);
    std::vector<double> dcor;
    for (const auto& e : h.events)
      if (e.find("\"event\":\"step\"") != std::string::npos) {
        EXPECT_TRUE(std::isfinite(h.field(e, "loss"))) << e;
        dcor.push_back(h.field(e, "dcor"));
        EXPECT_TRUE(dcor.back() >= 0.0 && dcor.back() <= 1.0) << e;
      }
    EXPECT_EQ(dcor.size(), 40u);
    double last = 0;
    for (std::size_t i = dcor.size() - 10; i < dcor.size(); ++i) last += dcor[i] / 10;
    return last;
  };
  const double weak = run(1e-6f), strong = run(2.0f);
  std::printf("distance correlation over the last 10 steps: alpha 1e-6 %.3f, alpha 2 %.3f\n", weak, strong);
  EXPECT_LT(strong, weak - 0.1);
}

// Counts saves; keeps nothing (resuming is the e2e resume test's).
struct CountingCheckpoints final : EdgeCheckpointer {
  std::vector<CheckpointMeta> saved;
  std::optional<CheckpointMeta> resume(const std::array<uint8_t, 32>&, std::span<Network* const>, Optimizer&) override {
    return std::nullopt;
  }
  bool due(uint64_t step_after, bool epoch_end) const override { return epoch_end || step_after % 2 == 0; }
  void save(const CheckpointMeta& position, std::span<Network* const>, Optimizer&) override { saved.push_back(position); }
};

// The agent's kind of run: whole epochs (a short last batch, never one spanning two epochs),
// evaluated after each, checkpoints where due with the position after the step; the same
// with the asynchronous pipeline (a step ending an epoch or saving waits for the one before).
void expect_whole_epochs_evaluating_each(bool async) {
  EventEdgeConfig c = config(0);
  c.epochs = 2;
  c.eval_each_epoch = true;
  c.async = async;
  CountingCheckpoints checkpoints;
  c.checkpoints = &checkpoints;
  Harness h(c);
  const Pixels train = pixels(80, 1), test = pixels(64, 2);  // 80 = 32 + 32 + 16
  h.train_on(train, test);
  ASSERT_FALSE(h.edge->failed()) << h.events.back();
  EXPECT_EQ(h.count("step"), 6);
  EXPECT_EQ(h.cloud->step(), 6u);
  std::vector<std::string> epochs, evaluated;
  for (const auto& e : h.events) {
    if (e.find(R"("event":"epoch",)") != std::string::npos) epochs.push_back(e);
    if (e.find(R"("event":"evaluated")") != std::string::npos) evaluated.push_back(e);
  }
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_NE(epochs[0].find(R"("epoch":1,"samples":80)"), std::string::npos) << epochs[0];
  EXPECT_NE(epochs[1].find(R"("epoch":2,"samples":80)"), std::string::npos) << epochs[1];
  ASSERT_EQ(evaluated.size(), 2u);
  EXPECT_NE(evaluated[0].find(R"("samples":64,"epoch":1})"), std::string::npos) << evaluated[0];
  EXPECT_NE(evaluated[1].find(R"("samples":64,"epoch":2})"), std::string::npos) << evaluated[1];
  EXPECT_EQ(h.count("done"), 1);
  // Steps 2, 3 (epoch 1's end), 4 and 6 (epoch 2's end), each with the position after it.
  ASSERT_EQ(checkpoints.saved.size(), 4u);
  const std::vector<std::array<int64_t, 3>> want = {{2, 1, 64}, {3, 2, 0}, {4, 2, 32}, {6, 3, 0}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(static_cast<int64_t>(checkpoints.saved[i].step), want[i][0]) << i;
    EXPECT_EQ(checkpoints.saved[i].epoch, want[i][1]) << i;
    EXPECT_EQ(checkpoints.saved[i].cursor, want[i][2]) << i;
    EXPECT_EQ(checkpoints.saved[i].client_id, "page-1");
  }
  EXPECT_EQ(h.edge->position().epoch, 3);
}

TEST(EventEdge, RunsWholeEpochsEvaluatingEach) { expect_whole_epochs_evaluating_each(/*async=*/false); }

// The asynchronous pipeline through the driver: step t+1's Forwards leave before step t's
// Backwards are handled, and it still trains.
TEST(EventEdge, AsyncForwardsTheNextStepAheadAndTrains) {
  EventEdgeConfig c = config(40);
  c.async = true;
  Harness h(c);
  const Pixels train = pixels(512, 1), test = pixels(256, 2);
  h.train_on(train, test);
  ASSERT_TRUE(h.edge->finished());
  ASSERT_FALSE(h.edge->failed()) << h.events.back();
  EXPECT_EQ(h.count("step"), 40);
  EXPECT_EQ(h.cloud->step(), 40u);
  // Hello, then step 0's four Forwards and at once step 1's: before any Backward was handled.
  ASSERT_GE(h.sent.size(), 9u);
  for (std::size_t i = 1; i < 9; ++i) {
    WireError err;
    const Frame f = Frame::copy_of(h.sent[i].data(), h.sent[i].size());
    const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
    ASSERT_NE(m, nullptr) << err.text;
    ASSERT_EQ(m->payload_type(), wire::Payload::Forward) << "message " << i;
    EXPECT_EQ(m->payload_as_Forward()->step(), (i - 1) / 4) << "message " << i;
  }
  EXPECT_GT(h.field(h.events.back(), "test_accuracy"), 0.9) << h.events.back();
}

TEST(EventEdge, AsyncKeepsEpochAndCheckpointBoundaries) { expect_whole_epochs_evaluating_each(/*async=*/true); }

TEST(EventEdge, AsyncRefusesWhatItCannotPipeline) {
  EventEdgeConfig c = config(4);
  c.async = true;
  c.privacy.nopeek = 0.5f;
  EXPECT_EQ(error_of([&] { Harness h(c); }),
            "[edge] --pipeline async is for plain split training, not with --nopeek");
}

TEST(EventEdge, TrainsWithInt8OnTheWire) {
  EventEdgeConfig c = config(40);
  c.dtypes = {wire::DType::I8, wire::DType::F32};
  Harness h(c);
  const Pixels train = pixels(512, 1), test = pixels(256, 2);
  h.train_on(train, test);
  ASSERT_FALSE(h.edge->failed()) << h.events.back();
  EXPECT_NE(h.events[1].find(R"("dtype":"i8")"), std::string::npos) << h.events[1];
  EXPECT_GT(h.field(h.events.back(), "test_accuracy"), 0.9) << h.events.back();
}

TEST(EventEdge, RefusedTokenEndsTheRunWithTheCloudsReason) {
  EventEdgeConfig c = config(5);
  c.token = "tdt1.forged";
  std::string seen_token, seen_client;
  Harness h(c, [&](const std::string& token, const std::string& client) {
    seen_token = token;
    seen_client = client;
    return std::string("the enrolment token is malformed");
  });
  const Pixels train = pixels(64, 1);
  h.edge->set_data(false, train.bytes.data(), train.labels.data(), 64, 8, 8);
  h.run();
  EXPECT_TRUE(h.edge->failed());
  EXPECT_EQ(seen_token, "tdt1.forged");
  EXPECT_EQ(seen_client, "page-1");
  EXPECT_EQ(h.events.back(), R"j({"event":"error","text":"the cloud refused: the enrolment token is malformed"})j");
}

// An edge that came with an enrolment token (spent at its Hello) is given a fresh one in the
// Welcome, for its Hello after a lost link; an edge with a client certificate is given none.
TEST(EventEdge, ATokenEdgeIsGivenAFreshTokenForItsNextHello) {
  const Pixels train = pixels(96, 1), test = pixels(32, 2);
  const auto next = [](const std::string& client) { return "tdt1.next-for-" + client; };
  EventEdgeConfig c = config(3);
  c.token = "tdt1.first";
  std::vector<std::string> presented;
  Harness token_edge(c, [&](const std::string& token, const std::string&) {
    presented.push_back(token);
    return std::string();
  });
  token_edge.cc.next_token = next;
  token_edge.reconnect();
  token_edge.train_on(train, test);
  ASSERT_FALSE(token_edge.edge->failed()) << token_edge.events.back();
  EXPECT_EQ(presented, std::vector<std::string>{"tdt1.first"});
  EXPECT_EQ(token_edge.edge->session().next_token(), "tdt1.next-for-page-1");

  Harness certified(config(3));  // no authorize: the connection's certificate vouched
  certified.cc.next_token = next;
  certified.reconnect();
  certified.train_on(train, test);
  ASSERT_FALSE(certified.edge->failed()) << certified.events.back();
  EXPECT_EQ(certified.edge->session().next_token(), "");
}

// A cloud at its bound on connections answers the Hello with Busy: the run has not started,
// so the owner may say Hello again on a new link (tandem-edge does, after a backoff), and the
// egress log stays one run; if it gives up, the run fails with the cloud's reason.
TEST(EventEdge, BusyCloudLeavesTheRunReadyToSayHelloAgain) {
  std::vector<std::string> lines;
  EgressAudit audit([&](const std::string& line) { lines.push_back(line); });
  EventEdgeConfig c = config(4);
  c.audit = &audit;
  Harness h(c);
  const Pixels train = pixels(128, 1), test = pixels(64, 2);
  h.edge->set_data(false, train.bytes.data(), train.labels.data(), 128, 8, 8);
  h.edge->set_data(true, test.bytes.data(), test.labels.data(), 64, 8, 8);
  const std::string why = "the cloud serves at most 1 connections at once and has no room now: try again later";
  auto hello_answered_busy = [&](Harness& harness) {
    harness.edge->on_open();
    harness.to_edge.clear();  // the cloud's Welcome, replaced by its Busy
    MessageWriter writer;
    const auto error = writer.error(wire::ErrorCode::Busy, why);
    return harness.edge->on_message(Frame::copy_of(error.data(), error.size()));
  };
  EXPECT_FALSE(hello_answered_busy(h)) << "the link must close";
  EXPECT_FALSE(h.edge->finished());
  EXPECT_EQ(h.edge->busy(), "the cloud refused: " + why);
  EXPECT_EQ(h.count("error"), 0);
  h.reconnect();
  h.run();
  ASSERT_TRUE(h.edge->finished() && !h.edge->failed()) << h.events.back();
  EXPECT_EQ(h.edge->busy(), "");
  EXPECT_EQ(h.edge->steps_done(), 4);
  audit.finish("done");
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  std::istringstream in(text);
  const EgressReport report = verify_egress_log(in);
  ASSERT_EQ(report.error, "");
  EXPECT_EQ(report.runs, 1u);
  EXPECT_EQ(report.kinds.at("Hello").messages, 2u);

  // Given up: the run fails with the cloud's reason, not the link's.
  Harness gave_up(config(4));
  gave_up.edge->set_data(false, train.bytes.data(), train.labels.data(), 128, 8, 8);
  EXPECT_FALSE(hello_answered_busy(gave_up));
  gave_up.edge->on_closed("the connection closed (code 1000)");
  EXPECT_TRUE(gave_up.edge->failed());
  EXPECT_EQ(gave_up.events.back(), R"j({"event":"error","text":"the cloud refused: )j" + why + R"j("})j");
}

// A link lost in the middle of a step (what tandem-edge's agent and the browser edge do then):
// the driver made again resumes from the newest checkpoint (here the browser's, in memory),
// the cloud's new session from its own of that step, and the run ends on the weights of a run
// never interrupted, bit for bit.
TEST(EventEdge, MadeAgainAfterALostLinkItEndsOnTheUninterruptedWeights) {
  const Pixels train = pixels(256, 1), test = pixels(64, 2);
  InMemoryEdgeCheckpoints straight_checkpoints(5), healed_checkpoints(5);
  EventEdgeConfig c = config(24);
  c.checkpoints = &straight_checkpoints;
  Harness straight(c);
  straight.train_on(train, test);
  ASSERT_FALSE(straight.edge->failed()) << straight.events.back();

  c.checkpoints = &healed_checkpoints;
  Harness healed(c);
  healed.edge->set_data(false, train.bytes.data(), train.labels.data(), 256, 8, 8);
  healed.edge->set_data(true, test.bytes.data(), test.labels.data(), 64, 8, 8);
  healed.edge->on_open();
  // Steps to 12, and two of step 13's gradients: then the link is gone.
  int gradients_of_13 = 0;
  while (!healed.to_edge.empty() && gradients_of_13 < 2) {
    const std::vector<uint8_t> m = std::move(healed.to_edge.front());
    healed.to_edge.pop_front();
    healed.edge->on_message(Frame::copy_of(m.data(), m.size()));
    gradients_of_13 += healed.edge->steps_done() == 12 &&
                       wire::GetMessage(m.data())->payload_type() == wire::Payload::Backward;
  }
  ASSERT_EQ(healed.edge->steps_done(), 12);
  ASSERT_FALSE(healed_checkpoints.empty());
  healed.reconnect();
  EventEdgeConfig again = c;
  again.steps = 24 - static_cast<int64_t>(healed_checkpoints.step());  // config.steps counts a driver's own
  healed.make_edge(again);
  ASSERT_TRUE(healed.edge->resumed());
  EXPECT_EQ(healed.edge->position().step, 10u);  // the newest checkpoint (every 5 steps)
  healed.train_on(train, test);
  ASSERT_FALSE(healed.edge->failed()) << healed.events.back();
  EXPECT_EQ(healed.cloud->step(), 24u);
  const auto& want_front = straight.edge->front().all_params();
  const auto& got_front = healed.edge->front().all_params();
  ASSERT_EQ(got_front.size(), want_front.size());
  for (std::size_t i = 0; i < want_front.size(); ++i) {
    const Tensor &want = want_front[i]->value(), &got = got_front[i]->value();
    ASSERT_EQ(got.bytes(), want.bytes());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.bytes()), 0) << "edge " << want_front[i]->name();
  }
  for (Param* p : straight.back.params()) {
    const Tensor& got = healed.back.param(p->name()).value();
    EXPECT_EQ(std::memcmp(got.data(), p->value().data(), got.bytes()), 0) << "cloud " << p->name();
  }
}

TEST(EventEdge, LostLinkEndsTheRunWithTheReason) {
  Harness h(config(5));
  const Pixels train = pixels(64, 1);
  h.edge->set_data(false, train.bytes.data(), train.labels.data(), 64, 8, 8);
  h.edge->on_open();
  h.edge->on_closed("the connection closed (code 1006)");
  EXPECT_TRUE(h.edge->failed());
  EXPECT_EQ(h.events.back(), R"j({"event":"error","text":"the connection closed (code 1006)"})j");
  EXPECT_FALSE(h.edge->on_message(Frame::copy_of(h.to_edge.front().data(), h.to_edge.front().size())));
}

TEST(EventEdge, BadDataIsRefusedWithTheReason) {
  Harness h(config(5));
  const Pixels train = pixels(64, 1);
  try {
    h.edge->set_data(false, train.bytes.data(), train.labels.data(), 16, 28, 28);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[edge] images of 28x28 do not fit the model's input [8, 8, 1]");
  }
  std::vector<int32_t> labels = train.labels;
  labels[3] = 7;
  try {
    h.edge->set_data(false, train.bytes.data(), labels.data(), 64, 8, 8);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[edge] label 7 of sample 3 is outside [0, 4)");
  }
  h.edge->on_open();  // still no training data
  EXPECT_EQ(h.events.back(), R"j({"event":"error","text":"no training data was given"})j");
}

}  // namespace
}  // namespace tandem::test

namespace tandem::test {
namespace {

// Event edges of one split-federated cloud in this process, as the service runs them: one
// back shard and optimizer, one Federation, a CloudSession per edge. Each edge's messages are
// handled at once; the cloud's replies and the rounds' averages queue for their edge.
struct Federated {
  struct Link {
    std::unique_ptr<CloudSession> cloud;
    std::unique_ptr<EventEdge> edge;
    std::deque<std::vector<uint8_t>> inbox;
    std::vector<std::string> events;
    bool cloud_closed = false;
  };
  ModelSpec spec = parse_model_json(kSpec);
  Graph graph = Graph::build(spec);
  std::unique_ptr<Backend> backend = make_backend("reference");
  std::string cut;
  Network back{graph.split(cut).second, *backend, 5};
  Sgd back_opt{back.params(),
               {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false}};
  BackShardTrainer shard{back, back_opt, 30.0, 1};  // one back shard, in turns
  std::unique_ptr<Federation> federation;
  std::vector<std::unique_ptr<Link>> links;  // session id i + 1

  // A U-shaped cut: the edges' rounds average the front and the tail.
  Federated(uint32_t every, uint64_t seed, std::string cut_at = "pool1") : cut(std::move(cut_at)) {
    Network whole(graph, *backend, seed), front(graph.split(cut).first, *backend, seed);
    std::unique_ptr<Network> tail;
    std::vector<Network*> edge_model = {&front};
    if (u_shaped_cut(cut)) {
      tail = std::make_unique<Network>(graph.tail(cut), *backend, seed);
      edge_model.push_back(tail.get());
    }
    for (Network* part : edge_model) init_from_whole_model(graph, seed, *part, *make_backend("reference"));
    for (Param* p : back.params()) {
      p->value().copy_from(whole.param(p->name()).value());
      p->bump_version();
    }
    NamedTensors start;
    for (Network* part : edge_model)
      for (Param* p : part->params()) start.emplace_back(p->name(), p->value().clone());
    federation = std::make_unique<Federation>(start, FederationOptions{.aggregate_every = every},
                                              [this](uint64_t session, std::span<const uint8_t> b) {
                                                links.at(session - 1)->inbox.emplace_back(b.begin(), b.end());
                                              });
  }

  Link& connect(EventEdgeConfig config, const Pixels& train, const Pixels& test) {
    auto link = std::make_unique<Link>();
    Link* l = link.get();
    CloudSessionConfig cc;
    cc.model_hash = model_hash(spec, cut);
    cc.cut = cut;
    cc.batch_size = 32;
    cc.microbatches = 4;
    cc.classes = 4;
    cc.session_id = links.size() + 1;
    cc.federation = federation.get();
    l->cloud = std::make_unique<CloudSession>(shard, cc);
    l->edge = std::make_unique<EventEdge>(
        spec, config,
        [l](std::span<const uint8_t> b) {
          if (l->cloud_closed) return;
          CloudReply r = l->cloud->handle(Frame::copy_of(b.data(), b.size()));
          l->cloud->finish_step();
          if (!r.bytes.empty()) l->inbox.emplace_back(r.bytes.begin(), r.bytes.end());
          if (!r.then.empty()) l->inbox.push_back(std::move(r.then));
          l->cloud_closed = l->cloud_closed || r.close;
        },
        [l](const EdgeEvent& e) { l->events.push_back(e.json()); });
    const int64_t n = static_cast<int64_t>(train.labels.size()), m = static_cast<int64_t>(test.labels.size());
    l->edge->set_data(false, train.bytes.data(), train.labels.data(), n, 8, 8);
    l->edge->set_data(true, test.bytes.data(), test.labels.data(), m, 8, 8);
    links.push_back(std::move(link));
    return *l;
  }

  // Delivers queued messages, edge by edge, until none is left.
  void pump() {
    for (bool moved = true; moved;) {
      moved = false;
      for (auto& l : links)
        while (!l->inbox.empty() && !l->edge->finished()) {
          const std::vector<uint8_t> m = std::move(l->inbox.front());
          l->inbox.pop_front();
          l->edge->on_message(Frame::copy_of(m.data(), m.size()));
          moved = true;
        }
    }
  }

  static std::vector<std::string> of_kind(const Link& l, const std::string& kind) {
    std::vector<std::string> out;
    for (const auto& e : l.events)
      if (e.find("\"event\":\"" + kind + "\"") != std::string::npos) out.push_back(e);
    return out;
  }
};

float largest_difference(const Network& a, const NamedTensors& b) {
  float worst = 0.0f;
  for (std::size_t k = 0; k < b.size(); ++k) {
    const Tensor& t = a.params()[k]->value();
    for (int64_t i = 0; i < t.numel(); ++i) worst = std::max(worst, std::fabs(t[i] - b[k].second[i]));
  }
  return worst;
}

// Two browser edges with their own data in a federation averaging every 3 steps, fronts
// updated once a round: rounds at steps 3 and 6 and a last one after step 7; both end on the
// same average, the federation's newest. A third edge that connects afterwards takes that
// average before its first step.
TEST(EventEdge, TakesPartInAFederationsRounds) {
  constexpr uint32_t kEvery = 3;
  EventEdgeConfig c = config(7);
  c.front_updates_per_round = true;
  Federated f(kEvery, c.seed);
  const Pixels test = pixels(128, 9);
  c.client_id = "ward-a";
  Federated::Link& a = f.connect(c, pixels(256, 1), test);
  c.client_id = "ward-b";
  Federated::Link& b = f.connect(c, pixels(256, 2), test);
  a.edge->on_open();  // both join before the first round, so every round waits for both
  b.edge->on_open();
  f.pump();
  for (Federated::Link* l : {&a, &b}) {
    ASSERT_TRUE(l->edge->finished());
    ASSERT_FALSE(l->edge->failed()) << l->events.back();
    EXPECT_NE(l->events[1].find(R"("aggregate_every":3)"), std::string::npos) << l->events[1];
    EXPECT_EQ(Federated::of_kind(*l, "step").size(), 7u);
    const auto rounds = Federated::of_kind(*l, "round");
    ASSERT_EQ(rounds.size(), 3u);
    EXPECT_NE(rounds[0].find(R"("round":1,"step":3)"), std::string::npos) << rounds[0];
    EXPECT_NE(rounds[1].find(R"("round":2,"step":6)"), std::string::npos) << rounds[1];
    EXPECT_NE(rounds[2].find(R"("round":3,"step":7)"), std::string::npos) << rounds[2];
    ASSERT_EQ(Federated::of_kind(*l, "done").size(), 1u);
    EXPECT_NE(l->events.back().find("test_accuracy"), std::string::npos) << l->events.back();
  }
  EXPECT_EQ(f.federation->round(), 3u);
  const auto newest = f.federation->take_unsaved_round();
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->first, 3u);
  EXPECT_EQ(largest_difference(a.edge->front(), newest->second), 0.0f) << "edge a is not on the average";
  EXPECT_EQ(largest_difference(b.edge->front(), newest->second), 0.0f) << "edge b is not on the average";

  a.cloud.reset();  // both connections close
  b.cloud.reset();
  c.client_id = "ward-c";
  c.steps = 2;
  Federated::Link& late = f.connect(c, pixels(256, 3), test);
  late.edge->on_open();
  f.pump();
  ASSERT_FALSE(late.edge->failed()) << late.events.back();
  ASSERT_GE(late.events.size(), 4u);
  EXPECT_NE(late.events[2].find(R"("event":"round","round":3,"step":0)"), std::string::npos)
      << "the newest average was not taken first: " << late.events[2];
  const auto rounds = Federated::of_kind(late, "round");
  ASSERT_EQ(rounds.size(), 2u);  // the newest on joining, and its own last round alone
  EXPECT_NE(rounds[1].find(R"("round":4,"step":2)"), std::string::npos) << rounds[1];
}

// U-shaped (cut "pool1,fc1"): the edge runs the tail and the loss too. It trains, evaluates
// through the middle, and no label leaves: the egress log counts none, and every Forward and
// EvalForward it sent has no labels field. Its checkpoints hold the tail with the front.
TEST(EventEdgeUShaped, TrainsAndNoLabelLeaves) {
  struct Keeper final : EdgeCheckpointer {
    std::vector<uint8_t> last;
    std::optional<CheckpointMeta> resume(const std::array<uint8_t, 32>&, std::span<Network* const>, Optimizer&) override {
      return std::nullopt;
    }
    bool due(uint64_t, bool) const override { return true; }
    void save(const CheckpointMeta& position, std::span<Network* const> model, Optimizer& optimizer) override {
      last = encode_checkpoint(position, model, &optimizer);
    }
  } keeper;
  std::vector<std::string> lines;
  EgressAudit audit([&](const std::string& line) { lines.push_back(line); });
  EventEdgeConfig c = config(24);
  c.cut = "pool1,fc1";
  c.audit = &audit;
  c.checkpoints = &keeper;
  Harness h(c);
  const Pixels train = pixels(256, 1), test = pixels(128, 2);
  h.train_on(train, test);
  ASSERT_TRUE(h.edge->finished());
  ASSERT_FALSE(h.edge->failed()) << h.events.back();
  EXPECT_EQ(h.count("step"), 24);
  EXPECT_EQ(h.cloud->step(), 24u);
  const std::string& done = h.events.back();
  EXPECT_LT(h.field(done, "last_loss"), 0.5 * h.field(done, "first_loss")) << done;
  EXPECT_GT(h.field(done, "test_accuracy"), 0.8) << done;
  audit.finish("done");
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  std::istringstream in(text);
  const EgressReport report = verify_egress_log(in);
  ASSERT_EQ(report.error, "");
  EXPECT_EQ(report.kinds.at("Forward").messages, 24u * 4u);
  EXPECT_EQ(report.kinds.at("Forward").labels, 0u);
  EXPECT_EQ(report.kinds.at("EvalForward").labels, 0u);
  ASSERT_EQ(report.kinds.count("MiddleGradient"), 1u);
  EXPECT_EQ(report.kinds.at("MiddleGradient").messages, 24u * 4u);
  EXPECT_EQ(report.kinds.at("MiddleGradient").tensors, std::set<std::string>{"gradients f32 [8,24]"});
  for (const auto& m : h.sent) {
    const wire::Message* msg = wire::GetMessage(m.data());
    if (msg->payload_type() == wire::Payload::Forward) {
      ASSERT_EQ(msg->payload_as_Forward()->labels(), nullptr);
    }
    if (msg->payload_type() == wire::Payload::EvalForward) {
      ASSERT_EQ(msg->payload_as_EvalForward()->labels(), nullptr);
    }
  }
  const CheckpointData saved = decode_checkpoint(keeper.last);
  std::set<std::string> names;
  for (const auto& t : saved.params) names.insert(t.name);
  EXPECT_EQ(names, (std::set<std::string>{"conv1.weight", "conv1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(saved.meta.cut, "pool1,fc1");
}

// Noise on the loss gradient (--label-noise): noise 0 changes nothing (its clip, at the
// gradient's bound, never bites); noise changes what goes up, so the front trains otherwise,
// while the tail's first step is the exact one; the loss the cloud hears of is 0. Asked of an
// ordinary cut, it is refused with the reason.
TEST(EventEdgeUShaped, LabelNoiseChangesOnlyWhatGoesUpAndHidesTheLoss) {
  const Pixels train = pixels(256, 1), test = pixels(64, 2);
  auto run = [&](float sigma, int64_t steps = 8) {
    EventEdgeConfig c = config(steps);
    c.cut = "pool1,fc1";
    c.privacy.label_noise = sigma;
    c.privacy.dp_seed = 5;
    auto h = std::make_unique<Harness>(c);
    h->edge->set_data(false, train.bytes.data(), train.labels.data(), 256, 8, 8);
    h->edge->set_data(true, test.bytes.data(), test.labels.data(), 64, 8, 8);
    h->run();
    EXPECT_TRUE(h->edge->finished() && !h->edge->failed()) << h->events.back();
    return h;
  };
  auto plain = run(0.0f), zero = run(1e-30f), noised = run(4.0f);
  auto largest = [](const Network& a, const Network& b) {
    float worst = 0.0f;
    for (std::size_t k = 0; k < a.params().size(); ++k)
      for (int64_t i = 0; i < a.params()[k]->value().numel(); ++i)
        worst = std::max(worst, std::fabs(a.params()[k]->value()[i] - b.params()[k]->value()[i]));
    return worst;
  };
  EXPECT_EQ(largest(plain->edge->front(), zero->edge->front()), 0.0f) << "a clip at the bound changed the gradient";
  EXPECT_EQ(largest(*plain->edge->tail(), *zero->edge->tail()), 0.0f);
  EXPECT_GT(largest(plain->edge->front(), noised->edge->front()), 1e-3f) << "no noise went up";
  auto one_plain = run(0.0f, 1), one_noised = run(4.0f, 1);  // after one step: the same inputs to the tail
  EXPECT_EQ(largest(*one_plain->edge->tail(), *one_noised->edge->tail()), 0.0f) << "the tail trained on the noise";
  EXPECT_GT(largest(one_plain->edge->front(), one_noised->edge->front()), 1e-4f);
  int gradients = 0;
  for (const auto& m : noised->sent) {
    const wire::Message* msg = wire::GetMessage(m.data());
    if (msg->payload_type() != wire::Payload::MiddleGradient) continue;
    ++gradients;
    EXPECT_EQ(msg->payload_as_MiddleGradient()->loss(), 0.0f);
  }
  EXPECT_EQ(gradients, 8 * 4);

  EventEdgeConfig ordinary = config(8);
  ordinary.privacy.label_noise = 2.0f;
  try {
    Harness h(ordinary);
    ADD_FAILURE() << "label noise on an ordinary cut was taken";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[edge] --label-noise protects the labels of a U-shaped split (a cut \"A,B\"); cut "
                                     "'pool1' sends the labels themselves");
  }
}

float largest_difference_by_name(const Network& a, const NamedTensors& b) {
  float worst = 0.0f;
  for (const Param* p : a.params()) {
    const auto it = std::find_if(b.begin(), b.end(), [&](const auto& t) { return t.first == p->name(); });
    if (it == b.end()) return INFINITY;
    for (int64_t i = 0; i < p->value().numel(); ++i) worst = std::max(worst, std::fabs(p->value()[i] - it->second[i]));
  }
  return worst;
}

// A U-shaped federation: the rounds average the edges' fronts and tails, and both edges end
// on the average of both.
TEST(EventEdgeUShaped, TakesPartInAFederationsRounds) {
  EventEdgeConfig c = config(7);
  c.cut = "pool1,fc1";
  c.front_updates_per_round = true;
  Federated f(3, c.seed, c.cut);
  const Pixels test = pixels(128, 9);
  c.client_id = "ward-a";
  Federated::Link& a = f.connect(c, pixels(256, 1), test);
  c.client_id = "ward-b";
  Federated::Link& b = f.connect(c, pixels(256, 2), test);
  a.edge->on_open();
  b.edge->on_open();
  f.pump();
  for (Federated::Link* l : {&a, &b}) {
    ASSERT_TRUE(l->edge->finished());
    ASSERT_FALSE(l->edge->failed()) << l->events.back();
    EXPECT_EQ(Federated::of_kind(*l, "round").size(), 3u);
  }
  const auto newest = f.federation->take_unsaved_round();
  ASSERT_TRUE(newest.has_value());
  ASSERT_EQ(newest->second.size(), 4u) << "conv1's and fc2's weight and bias";
  for (Federated::Link* l : {&a, &b}) {
    ASSERT_NE(l->edge->tail(), nullptr);
    EXPECT_EQ(largest_difference_by_name(l->edge->front(), newest->second), 0.0f);
    EXPECT_EQ(largest_difference_by_name(*l->edge->tail(), newest->second), 0.0f);
  }
}

}  // namespace
}  // namespace tandem::test
