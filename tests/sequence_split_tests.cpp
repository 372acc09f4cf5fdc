// A transformer encoder split inside its layers (cut "ln1"), in-process: the edge runs the
// embeddings and the first layer on token ids and a padding mask, the cloud the second layer
// and the head. The mask is the one input that goes up (the cloud's attention reads it), the
// ids never do; the split trains exactly like the whole model; bad masks are refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "backends/registry.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/loss.h"
#include "core/microbatch.h"
#include "pipeline/local_pipeline.h"
#include "data/epoch_order.h"
#include "edge/session/edge_session.h"
#include "edge/session/event_edge.h"
#include "core/interop/safetensors.h"
#include "ports/files/atomic_file.h"
#include "ports/files/tensor_dataset.h"
#include "test_support.h"

namespace tandem::test {
namespace {

// Two post-LayerNorm encoder layers (BERT's order) on 6 tokens of 8 features, 2 heads; the
// first layer at the edge, the second (its attention reads the mask) and the head in the cloud.
constexpr const char* kEncoderSpec = R"({ name: "tiny-encoder",
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
    { name: "q1", op: "linear", inputs: ["ln1"], linear: { out_features: 8 } },
    { name: "k1", op: "linear", inputs: ["ln1"], linear: { out_features: 8 } },
    { name: "v1", op: "linear", inputs: ["ln1"], linear: { out_features: 8 } },
    { name: "att1", op: "attention", inputs: ["q1", "k1", "v1", "mask"], attention: { heads: 2 } },
    { name: "o1", op: "linear", inputs: ["att1"], linear: { out_features: 8 } },
    { name: "res1", op: "add", inputs: ["ln1", "o1"] },
    { name: "ln2", op: "layer_norm", inputs: ["res1"] },
    { name: "ff1", op: "linear", inputs: ["ln2"], linear: { out_features: 16 } },
    { name: "act", op: "gelu", inputs: ["ff1"] },
    { name: "ff2", op: "linear", inputs: ["act"], linear: { out_features: 8 } },
    { name: "res2", op: "add", inputs: ["ln2", "ff2"] },
    { name: "ln3", op: "layer_norm", inputs: ["res2"] },
    { name: "cls", op: "token_pool", inputs: ["ln3", "mask"], token_pool: { mode: "mean" } },
    { name: "fc", op: "linear", inputs: ["cls"], linear: { out_features: 3 } } ], output: "fc", cut: "ln1" })";

OptimizerOptions sgd() { return {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false}; }

Frame frame_of(std::span<const uint8_t> bytes) { return Frame::copy_of(bytes.data(), bytes.size()); }

CloudReply deliver(CloudSession& cloud, std::span<const uint8_t> bytes) {
  CloudReply r = cloud.handle(frame_of(bytes));
  cloud.finish_step();
  return r;
}

// Sequences of 6 tokens: ids in [0, 20), padding id 0 with mask 0; the label is the first
// token's id mod 3.
struct Sequences {
  Tensor ids, mask;
  std::vector<int32_t> labels;
  std::vector<Tensor> inputs() const { return {ids, mask}; }
};

// Sequence b keeps its first lengths[b] tokens.
Sequences sequences_of_lengths(const std::vector<int64_t>& lengths, uint64_t seed) {
  Rng rng(seed);
  const auto n = static_cast<int64_t>(lengths.size());
  Sequences s{Tensor::zeros({n, 6}), Tensor::zeros({n, 6}), {}};
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t) {
      s.ids[b * 6 + t] = static_cast<float>(rng.below(20));
      s.mask[b * 6 + t] = 1.0f;
    }
    s.labels.push_back(static_cast<int32_t>(s.ids[b * 6]) % 3);
  }
  return s;
}

// `n` sequences, b keeping its first 6 - b % 4 tokens.
Sequences sequences(int64_t n, uint64_t seed) {
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < n; ++b) lengths.push_back(6 - b % 4);
  return sequences_of_lengths(lengths, seed);
}

// The encoder with length buckets 2 and 4 (and 6, its length).
std::string bucketed_spec() {
  std::string json = kEncoderSpec;
  const std::string from = R"({ name: "mask", shape: [6], mask: true })";
  json.replace(json.find(from), from.size(), R"({ name: "mask", shape: [6], mask: true, length_buckets: [2, 4] })");
  return json;
}

struct EncoderSplit {
  std::string json;
  ModelSpec spec = parse_model_json(json);
  Graph graph = Graph::build(spec);
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network whole{graph, *backend, 5};
  Network front{graph.split("ln1").first, *backend, 0}, back{graph.split("ln1").second, *backend, 0};
  Sgd front_opt{front.params(), sgd()}, back_opt{back.params(), sgd()};
  BackShardTrainer trainer{back, back_opt};
  CloudSession cloud;
  EdgeSession edge;

  explicit EncoderSplit(uint32_t k, std::string spec_json = kEncoderSpec)
      : json(std::move(spec_json)),
        cloud(trainer, {model_hash(spec, "ln1"), 32, k, 3, 1, kDefaultMaxMessageBytes, CloudSessionConfig{}.dtypes, "ln1"}),
        edge(front, front_opt, k, model_hash(spec, "ln1"), "edge-seq") {
    copy_params(front, whole);
    copy_params(back, whole);
    edge.set_mask_input(1);
    CloudReply r = deliver(cloud, edge.hello());
    WireError err;
    EXPECT_TRUE(!r.close && edge.on_welcome(frame_of(r.bytes), err)) << err.text;
  }
};

// The cloud's answer to `ev`, an EvalForward of d's `count` sequences: it scores them as the
// whole model `whole` does.
void expect_scored_like(EncoderSplit& s, std::span<const uint8_t> ev, Network& whole, const Sequences& d, int64_t count) {
  CloudReply r = deliver(s.cloud, ev);
  ASSERT_FALSE(r.close);
  WireError err;
  EdgeSession::EvalResult result;
  ASSERT_TRUE(s.edge.on_eval_result(frame_of(r.bytes), err, result)) << err.text;
  whole.set_training(false);
  EXPECT_EQ(result.correct, count_correct(whole.forward(d.inputs(), 0), d.labels.data()));
  EXPECT_EQ(result.count, count);
}

// Hands the cloud's Backward replies to the edge, the last first; they end its step.
void deliver_backwards(EdgeSession& edge, const std::vector<Frame>& replies) {
  bool done = false;
  for (std::size_t i = replies.size(); i-- > 0;) {
    WireError err;
    ASSERT_TRUE(edge.on_backward(replies[i], err, done)) << err.text;
  }
  ASSERT_TRUE(done);
}

// The split chain (K=3) and the whole model (K=`whole_k`) trained `steps` steps on `d`: the
// same losses, and then the same weights (s's front and back against `whole_net`).
void expect_trains_alike(LocalPipeline& chain, LocalPipeline& whole, EncoderSplit& s, Network& whole_net,
                         const Sequences& d, int steps, int whole_k) {
  for (int step = 0; step < steps; ++step) {
    const double got = chain.train_step(d.inputs(), d.labels.data(), 3).loss_sum;
    const double want = whole.train_step(d.inputs(), d.labels.data(), whole_k).loss_sum;
    EXPECT_NEAR(got, want, 1e-4 * std::max(1.0, std::fabs(want))) << "step " << step;
  }
  EXPECT_LE(max_diff(s.front, whole_net), 1e-5f);
  EXPECT_LE(max_diff(s.back, whole_net), 1e-5f);
}

TEST(SequenceSplit, TheMaskTravelsAndTheSplitTrainsLikeTheWholeModel) {
  const Sequences d = sequences(12, 3);
  EncoderSplit s(3);
  EXPECT_EQ(s.back.graph().inputs().size(), 2u);  // ln1's output and the mask
  Sgd whole_opt(s.whole.params(), sgd());
  Tensor dlogits;
  for (int step = 0; step < 10; ++step) {
    const int k = s.edge.begin_step(d.inputs(), d.labels.data());
    std::vector<Frame> replies;
    for (int mb = 0; mb < k; ++mb) {
      const std::span<const uint8_t> fwd = s.edge.forward(mb);
      const wire::Forward* f = wire::GetMessage(fwd.data())->payload_as_Forward();
      const auto [begin, count] = microbatch_range(12, k, mb);
      ASSERT_NE(f->mask(), nullptr);
      ASSERT_EQ(f->mask()->size(), static_cast<uint32_t>(count * 6));
      for (int64_t i = 0; i < count * 6; ++i) EXPECT_EQ(f->mask()->Get(static_cast<uint32_t>(i)), d.mask[begin * 6 + i]);
      EXPECT_EQ(f->activations()->shape()->size(), 3u);  // [count, 6, 8]: ln1's output, not the ids
      CloudReply r = deliver(s.cloud, fwd);
      ASSERT_FALSE(r.close) << "the cloud closed the session";
      replies.push_back(frame_of(r.bytes));
    }
    ASSERT_NO_FATAL_FAILURE(deliver_backwards(s.edge, replies));
    // The whole model on the whole batch, one step of the same optimizer.
    s.whole.zero_grad();
    const Tensor& logits = s.whole.forward(d.inputs(), 0);
    if (!dlogits.defined()) dlogits = Tensor::empty(logits.shape());
    const double want = compute_loss(s.graph.loss(), logits, d.labels.data(), 1.0f / 12.0f, &dlogits);
    s.whole.backward(dlogits, 0, false);
    whole_opt.step();
    EXPECT_NEAR(s.edge.step_loss_sum(), want, 1e-4 * std::max(1.0, std::fabs(want))) << "step " << step;
  }
  EXPECT_LE(max_diff(s.front, s.whole), 1e-5f);
  EXPECT_LE(max_diff(s.back, s.whole), 1e-5f);
  Network start(s.graph, *s.backend, 5);
  EXPECT_GT(max_diff(s.back, start), 1e-3f);
}

// Local training (tandem train's LocalPipeline) feeds the back stage the mask's rows too: the
// split chain trains exactly as the whole model does.
TEST(SequenceSplit, TheLocalChainFeedsTheMaskToTheBackStage) {
  const Sequences d = sequences(12, 6);
  EncoderSplit s(3);
  Sgd whole_opt(s.whole.params(), sgd());
  LocalPipeline chain({&s.front, &s.back}, {&s.front_opt, &s.back_opt}), whole({&s.whole}, {&whole_opt});
  expect_trains_alike(chain, whole, s, s.whole, d, 5, 1);
  EXPECT_EQ(chain.evaluate(d.inputs(), d.labels.data(), 5).correct, whole.evaluate(d.inputs(), d.labels.data(), 12).correct);
}

// The evaluation batch carries the mask too, and the cloud scores it like the whole model.
TEST(SequenceSplit, EvaluationCarriesTheMask) {
  const Sequences d = sequences(8, 4);
  EncoderSplit s(2);
  const std::span<const uint8_t> ev = s.edge.eval_forward(1, d.inputs(), d.labels.data(), 8);
  const wire::EvalForward* e = wire::GetMessage(ev.data())->payload_as_EvalForward();
  ASSERT_NE(e->mask(), nullptr);
  EXPECT_EQ(e->mask()->size(), 48u);
  expect_scored_like(s, ev, s.whole, d, 8);
}

// The encoder with LoRA adapters (dropout 0.1) on its queries and values and every other
// weight frozen but the classifier's.
std::string lora_encoder_spec() {
  std::string json = kEncoderSpec;
  for (const char* q : {"q0", "v0", "q1", "v1"}) {
    const std::string from = cat("{ name: \"", q, "\", op: \"linear\", inputs: [\"");
    const std::size_t at = json.find(from);
    const std::size_t end = json.find("} }", at) + 1;
    json.insert(end, ", lora: { rank: 2, alpha: 4, dropout: 0.1 }");
  }
  for (const char* f : {"tok", "pos", "ln0", "k0", "o0", "ln1", "k1", "o1", "ln2", "ff1", "ff2", "ln3"}) {
    const std::size_t at = json.find(cat("{ name: \"", f, "\""));
    const std::size_t end = json.find(" },", at);
    json.insert(end, ", freeze: true");
  }
  return json;
}

// The cloud evaluates a chunk larger than its micro-batch (ceil(32 / 3) = 11 at this cloud's
// limits) in pieces: 12 sequences as 11 and 1, scored as the whole model scores them, loss
// included.
TEST(SequenceSplit, TheCloudEvaluatesAChunkInPieces) {
  const Sequences d = sequences(12, 8);
  EncoderSplit s(3);
  const std::span<const uint8_t> ev = s.edge.eval_forward(1, d.inputs(), d.labels.data(), 12);
  CloudReply r = deliver(s.cloud, ev);
  ASSERT_FALSE(r.close);
  const wire::EvalResult* got = wire::GetMessage(r.bytes.data())->payload_as_EvalResult();
  ASSERT_NE(got, nullptr);
  s.whole.set_training(false);
  const Tensor& logits = s.whole.forward(d.inputs(), 0);
  const double want = compute_loss(s.graph.loss(), logits, d.labels.data(), 1.0f, nullptr);
  EXPECT_NEAR(got->loss_sum(), want, 1e-5 * std::max(1.0, std::fabs(want)));
  EXPECT_EQ(got->correct(), static_cast<uint32_t>(count_correct(logits, d.labels.data())));
  EXPECT_EQ(got->count(), 12u);
}

// A training forward keeps only what a backward reads (Layer::backward_reads); the rest of
// each micro-batch's tensors give their storage to the next forward's. So three micro-batches
// forwarded before any is backed up must train exactly as the same three backed up one at a
// time, bit for bit: a layer that read a tensor it said it would not would read another
// micro-batch's values here. With every weight training, and with LoRA (frozen linears keep
// no input, gelu's output goes, the adds keep nothing).
// With recompute (an edge's default), the micro-batches in flight keep no attention
// probabilities and compute them again in backward: the same gradients bit for bit.
TEST(SequenceSplit, MicroBatchesInFlightBackUpAsOneAtATime) {
  for (const bool lora : {false, true})
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(lora ? "LoRA on the queries and values, the rest frozen" : "every weight trains");
    SCOPED_TRACE(recompute ? "in flight: attention computed again in backward" : "in flight: probabilities stashed");
    const Graph graph = Graph::build(parse_model_json(lora ? lora_encoder_spec() : std::string(kEncoderSpec)));
    auto backend = make_test_backend(backend_under_test());
    Network one_at_a_time(graph, *backend, 5), in_flight(graph, *backend, 5);
    in_flight.set_recompute(recompute);
    if (lora) {
      EXPECT_EQ(in_flight.params().size(), 4u * 2u + 2u) << "the adapters and the classifier train";
    }
    // What a sample's forward does not keep for backward: the token embeddings (the position
    // embedding reads nothing), o0, o1 and ff2 (the adds read nothing) and ln3 (the token
    // pool reads the mask only), 48 floats each; with LoRA also att0 and att1 (o0 and o1 are
    // frozen), ln2 (ff1 is) and gelu's 96 (ff2 is).
    const Network::ActivationFloats floats = in_flight.activation_floats();
    EXPECT_EQ(floats.all - floats.kept, lora ? 5 * 48 + 3 * 48 + 96 : 5 * 48);
    const Sequences d = sequences(9, 3);
    std::vector<std::vector<Tensor>> mbs;
    for (int64_t mb = 0; mb < 3; ++mb) mbs.push_back({d.ids.slice_batch(3 * mb, 3), d.mask.slice_batch(3 * mb, 3)});
    Rng rng(7);
    std::vector<Tensor> grads;
    for (int step = 0; step < 3; ++step) {
      one_at_a_time.zero_grad();
      in_flight.zero_grad();
      for (int mb = 0; mb < 3; ++mb) {
        const Tensor& y = one_at_a_time.forward(mbs[static_cast<std::size_t>(mb)], mb);
        if (grads.size() <= static_cast<std::size_t>(mb)) grads.push_back(random_tensor(y.shape(), rng));
        one_at_a_time.backward(grads[static_cast<std::size_t>(mb)], mb, false);
      }
      for (int mb = 0; mb < 3; ++mb) {
        const Tensor& y = in_flight.forward(mbs[static_cast<std::size_t>(mb)], mb);
        const Tensor& want = one_at_a_time.output(mb);
        ASSERT_EQ(std::memcmp(y.data(), want.data(), y.bytes()), 0) << "step " << step << ", micro-batch " << mb;
      }
      for (int mb = 0; mb < 3; ++mb) in_flight.backward(grads[static_cast<std::size_t>(mb)], mb, false);
      for (Param* p : one_at_a_time.params()) {
        const Tensor& got = in_flight.param(p->name()).grad();
        ASSERT_EQ(std::memcmp(got.data(), p->grad().data(), got.bytes()), 0) << "step " << step << ": " << p->name();
      }
      for (Network* net : {&one_at_a_time, &in_flight})  // a step, so the next one runs on new weights
        for (Param* p : net->params()) {
          float* w = p->value().data();
          const float* g = p->grad().data();
          for (int64_t i = 0; i < p->value().numel(); ++i) w[i] -= 0.1f * g[i];
          p->bump_version();
        }
    }
  }
}

// An evaluation chunk forwarded a training micro-batch at a time (set_eval_microbatch: no
// kernel or buffer is made at the chunk's size) sends what one forward of the whole chunk
// sends, mask included, and the cloud scores it alike.
TEST(SequenceSplit, EvaluationInPiecesSendsWhatOneForwardDoes) {
  const Sequences d = sequences(8, 4);
  EncoderSplit at_once(2), in_pieces(2);
  in_pieces.edge.set_eval_microbatch(3);  // 3 + 3 + 2
  auto sent = [&](EncoderSplit& s) {
    const std::span<const uint8_t> ev = s.edge.eval_forward(1, d.inputs(), d.labels.data(), 8);
    return std::vector<uint8_t>(ev.begin(), ev.end());
  };
  const std::vector<uint8_t> one = sent(at_once), pieces = sent(in_pieces);
  const wire::EvalForward* a = wire::GetMessage(one.data())->payload_as_EvalForward();
  const wire::EvalForward* b = wire::GetMessage(pieces.data())->payload_as_EvalForward();
  ASSERT_EQ(b->activations()->data()->size(), a->activations()->data()->size());
  ASSERT_EQ(b->activations()->data()->size() % sizeof(float), 0u);
  const auto* x = reinterpret_cast<const float*>(a->activations()->data()->data());
  const auto* y = reinterpret_cast<const float*>(b->activations()->data()->data());
  for (std::size_t i = 0, n = a->activations()->data()->size() / sizeof(float); i < n; ++i)
    ASSERT_NEAR(y[i], x[i], 1e-5f * std::max(1.0f, std::fabs(x[i]))) << "value " << i;
  ASSERT_NE(b->mask(), nullptr);
  EXPECT_TRUE(std::equal(a->mask()->begin(), a->mask()->end(), b->mask()->begin(), b->mask()->end()));
  expect_scored_like(in_pieces, pieces, in_pieces.whole, d, 8);
}

// A Forward whose mask is missing, the wrong size or not 0/1 is refused with the reason; a
// cloud whose shard reads no mask refuses one.
TEST(SequenceSplitBadInput, MasksAreChecked) {
  const Sequences d = sequences(4, 5);
  auto refused = [&](const std::function<void(std::vector<uint8_t>&)>& corrupt, bool with_mask = true) {
    EncoderSplit s(1);
    s.edge.begin_step(d.inputs(), d.labels.data());
    const std::span<const uint8_t> fwd = s.edge.forward(0);
    const wire::Forward* f = wire::GetMessage(fwd.data())->payload_as_Forward();
    std::vector<uint8_t> mask(f->mask()->begin(), f->mask()->end());
    corrupt(mask);
    MessageWriter w;
    const Tensor activations = s.front.output(0);
    Tensor m = Tensor::empty({static_cast<int64_t>(mask.size())});
    for (std::size_t i = 0; i < mask.size(); ++i) m[static_cast<int64_t>(i)] = mask[i];
    const std::span<const uint8_t> bad =
        w.forward(0, 0, 0, activations, d.labels, 4, 1, wire::DType::F32, 1.0f, false, with_mask ? &m : nullptr);
    CloudReply r = deliver(s.cloud, bad);
    EXPECT_TRUE(r.close);
    const wire::Error* e = wire::GetMessage(r.bytes.data())->payload_as_Error();
    return e ? e->text()->str() : std::string("(not an Error)");
  };
  EXPECT_EQ(refused([](std::vector<uint8_t>&) {}, false), "mask: 0 bytes given for 4 samples of 6 tokens");
  EXPECT_EQ(refused([](std::vector<uint8_t>& m) { m.pop_back(); }), "mask: 23 bytes given for 4 samples of 6 tokens");
  // (a mask value of 2 is written as 1 by the writer, so corrupt the frame's byte instead)
  EncoderSplit s(1);
  s.edge.begin_step(d.inputs(), d.labels.data());
  const std::span<const uint8_t> fwd = s.edge.forward(0);
  std::vector<uint8_t> bytes(fwd.begin(), fwd.end());
  const wire::Forward* f = wire::GetMessage(bytes.data())->payload_as_Forward();
  const std::size_t at = static_cast<std::size_t>(f->mask()->Data() + 5 - bytes.data());
  bytes[at] = 2;
  CloudReply r = deliver(s.cloud, bytes);
  EXPECT_TRUE(r.close);
  EXPECT_EQ(wire::GetMessage(r.bytes.data())->payload_as_Error()->text()->str(), "mask: 2 at 5 is neither 0 nor 1");
}

// One rule for an input's values (GraphInput::accepts), where an edge's data arrives: a data
// set file and EventEdge::set_data refuse a mask of 2 or a fractional id with the same words.
TEST(SequenceSplitBadInput, DataSetsAndTheEdgeCheckValuesAlike) {
  const Graph g = Graph::build(parse_model_json(kEncoderSpec));
  const GraphInput& ids = g.inputs()[0];
  const GraphInput& mask = g.inputs()[1];
  EXPECT_TRUE(ids.accepts(7.0));
  EXPECT_FALSE(ids.accepts(3.5));
  EXPECT_FALSE(ids.accepts(16777218.0));
  EXPECT_TRUE(mask.accepts(1.0));
  EXPECT_FALSE(mask.accepts(2.0));

  const Sequences d = sequences(4, 5);
  std::vector<int32_t> id_values(24);
  std::vector<uint8_t> mask_values(24);
  for (int64_t i = 0; i < 24; ++i) {
    id_values[static_cast<std::size_t>(i)] = static_cast<int32_t>(d.ids[i]);
    mask_values[static_cast<std::size_t>(i)] = static_cast<uint8_t>(d.mask[i]);
  }
  mask_values[3] = 2;
  // One file per process: ctest runs this binary once per backend, side by side.
  const std::string path = cat(::testing::TempDir(), "/bad-mask-", ::getpid(), ".safetensors");
  write_file_atomic(path, write_safetensors({i32_tensor("ids", {4, 6}, id_values.data()),
                                             u8_tensor("mask", {4, 6}, mask_values.data()),
                                             i32_tensor("labels", {4}, d.labels.data())}));
  EXPECT_EQ(error_of([&] { read_tensor_dataset(path, g.inputs()); }),
            cat("[data set] ", path, ": 'mask' holds 2 at element 3, not 0 or 1 (a mask)"));
  // Half-precision tensors are weights (Hugging Face's), never a data set's.
  write_file_atomic(path, write_safetensors({i32_tensor("ids", {4, 6}, id_values.data()),
                                             SafeTensor{"mask", "F16", {4, 6}, std::vector<uint8_t>(48, 0)},
                                             i32_tensor("labels", {4}, d.labels.data())}));
  EXPECT_EQ(error_of([&] { read_tensor_dataset(path, g.inputs()); }),
            "[data set] 'mask' is F16: a data set's tensors are F32, I32, I64, U8 or BOOL");
  std::remove(path.c_str());

  EventEdgeConfig c;
  c.cut = "ln1";
  c.backend = "reference";
  EventEdge edge(parse_model_json(kEncoderSpec), c, [](std::span<const uint8_t>) {}, [](const EdgeEvent&) {});
  Tensor bad_mask = d.mask.clone(), bad_ids = d.ids.clone();
  bad_mask[3] = 2.0f;
  bad_ids[5] = 3.5f;
  std::vector<int32_t> labels(d.labels.begin(), d.labels.end());
  EXPECT_EQ(error_of([&] { edge.set_data(false, {d.ids, bad_mask}, labels); }),
            "[edge] input 'mask': 2 at element 3 is not 0 or 1 (a mask)");
  EXPECT_EQ(error_of([&] { edge.set_data(false, {bad_ids, d.mask}, labels); }),
            "[edge] input 'ids': 3.5 at element 5 is not an integer below 2^24 (ids and coordinates)");
}

// torch's key_padding_mask (True = padding) saved as BOOL: a spec whose mask marks padding
// reads it as tandem's 1 keep, 0 padding; a spec that does not reads it as given. The flag
// belongs on the mask only.
TEST(SequenceSplitBadInput, AMaskThatMarksPaddingIsReadInverted) {
  std::string json = kEncoderSpec;
  const std::string plain = "mask: true }";
  json.replace(json.find(plain), plain.size(), "mask: true, marks_padding: true }");
  const Graph g = Graph::build(parse_model_json(json));
  ASSERT_TRUE(g.inputs()[1].marks_padding);
  EXPECT_FALSE(Graph::build(parse_model_json(kEncoderSpec)).inputs()[1].marks_padding);
  EXPECT_NE(model_spec_json(parse_model_json(json)).find("mask: true, marks_padding: true"), std::string::npos);

  const Sequences d = sequences(4, 5);
  std::vector<int32_t> id_values(24);
  std::vector<uint8_t> padding(24);
  for (int64_t i = 0; i < 24; ++i) {
    id_values[static_cast<std::size_t>(i)] = static_cast<int32_t>(d.ids[i]);
    padding[static_cast<std::size_t>(i)] = d.mask[i] == 0.0f ? 1 : 0;
  }
  ASSERT_NE(std::count(padding.begin(), padding.end(), 1), 0);  // some sequences are padded
  const std::string path = cat(::testing::TempDir(), "/padding-mask-", ::getpid(), ".safetensors");
  write_file_atomic(path, write_safetensors({i32_tensor("ids", {4, 6}, id_values.data()),
                                             SafeTensor{"mask", "BOOL", {4, 6}, padding},
                                             i32_tensor("labels", {4}, d.labels.data())}));
  const LabelledInputs read = read_tensor_dataset(path, g.inputs());
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(read.inputs[1][i], d.mask[i]) << "element " << i;
  const LabelledInputs as_given = read_tensor_dataset(path, Graph::build(parse_model_json(kEncoderSpec)).inputs());
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(as_given.inputs[1][i], padding[static_cast<std::size_t>(i)]) << "element " << i;
  std::remove(path.c_str());

  std::string ids_too = json;
  const std::string ids = R"(dtype: "int32" })";
  ids_too.replace(ids_too.find(ids), ids.size(), R"(dtype: "int32", marks_padding: true })");
  EXPECT_EQ(error_of([&] { parse_model_json(ids_too); }),
            "[model spec] input 'ids': field 'marks_padding' belongs on the mask input (mask: true)");
}

TEST(SequenceSplitBadInput, ACloudThatReadsNoMaskRefusesOne) {
  WireError err;
  Tensor decoded;
  EXPECT_FALSE(read_mask(nullptr, 4, 6, decoded, err));
  const std::vector<uint8_t> bytes(24, 1);
  flatbuffers::FlatBufferBuilder b;
  b.Finish(b.CreateVector(bytes));
  const auto* v = flatbuffers::GetRoot<flatbuffers::Vector<uint8_t>>(b.GetBufferPointer());
  EXPECT_TRUE(read_mask(v, 4, 6, decoded, err));
  EXPECT_EQ(decoded.shape(), (Shape{4, 6}));
  EXPECT_FALSE(read_mask(v, 4, 0, decoded, err));
  EXPECT_EQ(err.text, "mask: this split's cloud shard reads no mask, and a message carrying one is refused (nothing "
                      "of the input but a mask the cloud needs may leave)");
}

// Only a mask may cross a cut: a cut the back shard reads the ids across is refused.
TEST(SequenceSplitGraph, OnlyAMaskCrosses) {
  const ModelSpec spec = parse_model_json(kEncoderSpec);
  const Graph g = Graph::build(spec);
  const Graph back = g.split("ln1").second;
  ASSERT_EQ(back.inputs().size(), 2u);
  EXPECT_EQ(back.inputs()[1].name, "mask");
  EXPECT_TRUE(back.inputs()[1].mask);
  std::string json = kEncoderSpec;
  const std::string from = R"({ name: "cls", op: "token_pool", inputs: ["ln3", "mask"])";
  json.replace(json.find(from), from.size(), R"({ name: "cls", op: "token_pool", inputs: ["ln3", "ids"])");
  EXPECT_EQ(error_of([&] { Graph::build(parse_model_json(json)).split("ln1"); }),
            "[split] cut at 'ln1' is crossed by 2 tensors: 'ids' (read by 'cls'), 'ln1' (read by 'q1', 'k1', 'v1', "
            "'res1'); pick a node that every path from the inputs to the output passes through");
}


// Each micro-batch runs at the smallest bucket holding its longest sequence (2, 4 and 6
// here): the activations and the mask go up at that length, and the split trains exactly as
// the whole model without buckets does at the full length (padding is masked everywhere).
TEST(LengthBuckets, MicroBatchesRunAtTheirBucketAndTrainLikeTheFullLength) {
  const Sequences d = sequences_of_lengths({2, 1, 2, 2, 3, 4, 1, 2, 6, 5, 1, 3}, 7);
  EncoderSplit s(3, bucketed_spec());
  EncoderSplit plain(3);  // the same weights (seed 5), no buckets
  EXPECT_EQ(s.graph.length_buckets(), (std::vector<int64_t>{2, 4, 6}));
  Sgd whole_opt(plain.whole.params(), sgd());
  LocalPipeline whole({&plain.whole}, {&whole_opt});
  const int64_t want_length[3] = {2, 4, 6};
  for (int step = 0; step < 6; ++step) {
    const int k = s.edge.begin_step(d.inputs(), d.labels.data());
    ASSERT_EQ(k, 3);
    std::vector<Frame> replies;
    for (int mb = 0; mb < k; ++mb) {
      const std::span<const uint8_t> fwd = s.edge.forward(mb);
      const wire::Forward* f = wire::GetMessage(fwd.data())->payload_as_Forward();
      ASSERT_EQ(f->activations()->shape()->size(), 3u);
      EXPECT_EQ(f->activations()->shape()->Get(1), want_length[mb]) << "micro-batch " << mb;
      EXPECT_EQ(f->mask()->size(), static_cast<uint32_t>(4 * want_length[mb]));
      CloudReply r = deliver(s.cloud, fwd);
      ASSERT_FALSE(r.close) << wire::GetMessage(r.bytes.data())->payload_as_Error()->text()->str();
      replies.push_back(frame_of(r.bytes));
    }
    ASSERT_NO_FATAL_FAILURE(deliver_backwards(s.edge, replies));
    const double want = whole.train_step(d.inputs(), d.labels.data(), 1).loss_sum;
    EXPECT_NEAR(s.edge.step_loss_sum(), want, 1e-4 * std::max(1.0, std::fabs(want))) << "step " << step;
  }
  EXPECT_LE(max_diff(s.front, plain.whole), 1e-5f);
  EXPECT_LE(max_diff(s.back, plain.whole), 1e-5f);

  // Evaluation runs at its batch's bucket too (longest 3: 4 tokens) and scores alike.
  const Sequences e = sequences_of_lengths({3, 1, 2, 3, 2}, 8);
  const std::span<const uint8_t> ev = s.edge.eval_forward(1, e.inputs(), e.labels.data(), 5);
  const wire::EvalForward* m = wire::GetMessage(ev.data())->payload_as_EvalForward();
  EXPECT_EQ(m->activations()->shape()->Get(1), 4);
  EXPECT_EQ(m->mask()->size(), 20u);
  expect_scored_like(s, ev, plain.whole, e, 5);
}

// Local training (tandem train) cuts micro-batches to their buckets too, with the same result.
TEST(LengthBuckets, TheLocalChainRunsAtBucketsLikeTheFullLength) {
  const Sequences d = sequences_of_lengths({2, 1, 2, 2, 3, 4, 1, 2, 6, 5, 1, 3}, 9);
  EncoderSplit s(3, bucketed_spec()), plain(3);
  Sgd whole_opt(plain.whole.params(), sgd());
  LocalPipeline chain({&s.front, &s.back}, {&s.front_opt, &s.back_opt}), whole({&plain.whole}, {&whole_opt});
  expect_trains_alike(chain, whole, s, plain.whole, d, 4, 3);
}

// Each epoch's batches are grouped by length: within megabatches of 50 batches every batch
// holds samples of like length (the megabatch sorted, longest first, then its whole batches
// shuffled), the samples are those of the epoch's order there, and the same (order, lengths,
// seed) give the same grouping.
TEST(LengthBuckets, EpochsGroupBatchesByLength) {
  const int64_t n = 231, batch = 2;  // megabatches of 100: two whole ones and 31 (15 batches and one sample)
  Rng rng(4);
  std::vector<int32_t> lengths;
  for (int64_t i = 0; i < n; ++i) lengths.push_back(1 + static_cast<int32_t>(rng.below(128)));
  const std::vector<int64_t> order = epoch_order(n, 1, 0);
  std::vector<int64_t> grouped = order;
  group_by_length(grouped, lengths, batch, 7);
  auto length_at = [&](int64_t i) { return lengths[static_cast<std::size_t>(grouped[static_cast<std::size_t>(i)])]; };
  for (int64_t first = 0; first < n; first += 100) {
    const int64_t last = std::min(n, first + 100);
    EXPECT_TRUE(std::is_permutation(grouped.begin() + first, grouped.begin() + last, order.begin() + first));
    // Sorted into batches: the batches' length ranges do not overlap, and they are not in
    // sorted order any more (shuffled).
    std::vector<std::pair<int32_t, int32_t>> ranges;  // per whole batch: shortest, longest
    for (int64_t b = first; b + batch <= last; b += batch)
      ranges.emplace_back(std::min(length_at(b), length_at(b + 1)), std::max(length_at(b), length_at(b + 1)));
    bool descending = true;
    for (std::size_t i = 0; i < ranges.size(); ++i)
      for (std::size_t j = 0; j < ranges.size(); ++j) {
        if (i == j) continue;
        EXPECT_TRUE(ranges[i].second <= ranges[j].first || ranges[j].second <= ranges[i].first ||
                    ranges[i].first == ranges[i].second || ranges[j].first == ranges[j].second ||
                    ranges[i] == ranges[j])
            << "batches " << i << " and " << j << " of the megabatch at " << first << " mix lengths";
        if (j == i + 1 && ranges[i].first < ranges[j].second) descending = false;
      }
    EXPECT_FALSE(descending) << "the megabatch at " << first << " was not shuffled";
  }
  EXPECT_EQ(grouped.back(), [&] {  // the epoch's last sample, in a batch of its own, stays last
    std::vector<int64_t> tail(order.begin() + 200, order.end());
    std::stable_sort(tail.begin(), tail.end(), [&](int64_t a, int64_t b) {
      return lengths[static_cast<std::size_t>(a)] > lengths[static_cast<std::size_t>(b)];
    });
    return tail.back();
  }());
  std::vector<int64_t> again = order, other = order;
  group_by_length(again, lengths, batch, 7);
  group_by_length(other, lengths, batch, 8);
  EXPECT_EQ(again, grouped);
  EXPECT_NE(other, grouped);
}

// A Forward at a length that is not a bucket (or longer than the spec's) is refused by name.
TEST(LengthBucketsBadInput, TheCloudTakesBucketLengthsOnly) {
  const Sequences d = sequences_of_lengths({2, 1, 2, 2}, 10);
  for (const int64_t tokens : {3, 7}) {
    EncoderSplit s(1, bucketed_spec());
    s.edge.begin_step(d.inputs(), d.labels.data());
    s.edge.forward(0);  // bucket 2
    MessageWriter w;
    const Tensor activations = Tensor::zeros({4, tokens, 8});
    const Tensor mask = Tensor::zeros({4 * tokens});
    CloudReply r = deliver(s.cloud, w.forward(0, 0, 0, activations, d.labels, 4, 1, wire::DType::F32, 1.0f, false, &mask));
    ASSERT_TRUE(r.close);
    EXPECT_EQ(wire::GetMessage(r.bytes.data())->payload_as_Error()->text()->str(),
              cat("activations of ", tokens, " tokens: this model runs sequences at its length buckets [2, 4, 6] only"));
  }
}

// Buckets belong on the mask, increase within its length, and need a model whose every node
// that reads a sequence takes any length, with an output that is not per token.
TEST(LengthBucketsBadInput, SpecsAreChecked) {
  auto error_for = [](const std::string& from, const std::string& to) {
    std::string json = bucketed_spec();
    json.replace(json.find(from), from.size(), to);
    return error_of([&] { Graph::build(parse_model_json(json)); });
  };
  EXPECT_EQ(error_for("length_buckets: [2, 4]", "length_buckets: [4, 2]"),
            "[model spec] input 'mask': field 'length_buckets' needs increasing lengths in [1, 6], got 2 at position 1");
  EXPECT_EQ(error_for("length_buckets: [2, 4]", "length_buckets: [2, 9]"),
            "[model spec] input 'mask': field 'length_buckets' needs increasing lengths in [1, 6], got 9 at position 1");
  EXPECT_EQ(error_for(R"(dtype: "int32" })", R"(dtype: "int32", length_buckets: [3] })"),
            "[model spec] input 'ids': field 'length_buckets' belongs on the mask input");
  EXPECT_EQ(error_for(R"({ name: "cls", op: "token_pool", inputs: ["ln3", "mask"], token_pool: { mode: "mean" } },
    { name: "fc", op: "linear", inputs: ["cls"], linear: { out_features: 3 } } ], output: "fc")",
                      R"({ name: "flat", op: "flatten", inputs: ["ln3"] },
    { name: "fc", op: "linear", inputs: ["flat"], linear: { out_features: 3 } } ], output: "fc")"),
            "[graph] node 'flat' (flatten) reads 'ln3', a sequence that runs at the length buckets' lengths, but it "
            "needs its inputs' full length; drop field 'length_buckets' or change the node");
  EXPECT_EQ(error_for(R"({ name: "pos", op: "position_embedding", inputs: ["tok"], embedding: { count: 6 } },)",
                      R"({ name: "pos", op: "position_embedding", inputs: ["tok"], embedding: { count: 6 } },
    { name: "idl", op: "linear", inputs: ["ids"], linear: { out_features: 8 } },)"),
            "[graph] node 'idl' (linear) reads 'ids', a sequence that runs at the length buckets' lengths, but it would "
            "work across the tokens; drop field 'length_buckets' or change the node");
  EXPECT_EQ(error_for(R"(output: "fc")", R"(output: "ln3")"),
            "[graph] output node 'ln3' is per token, so its size would follow the length buckets; pool the tokens "
            "(token_pool) before the output, or drop field 'length_buckets'");
}

}  // namespace
}  // namespace tandem::test
