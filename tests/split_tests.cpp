// Split-training sessions in-process: the edge's and the cloud's session logic exchange real
// encoded messages (no transport). K pipelined micro-batches equal one unpipelined step, and
// every kind of bad input ends the session with the exact Error.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "backends/registry.h"
#include "cloud/session/cloud_session.h"
#include "core/checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/loss.h"
#include "core/sha256.h"
#include "pipeline/local_pipeline.h"
#include "edge/session/edge_session.h"
#include "test_support.h"

namespace tandem::test {
namespace {

constexpr const char* kSpec = kSmallSplitSpec;

std::string pick(const char* preferred) {
  const auto names = backend_names();
  return std::find(names.begin(), names.end(), preferred) != names.end() ? preferred : "reference";
}

OptimizerOptions sgd() { return {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f, .nesterov = false}; }


// An edge (xnnpack when built) and a cloud (onednn when built) joined by in-process messages.
struct Split {
  ModelSpec spec = parse_model_json(kSpec);
  Graph graph = Graph::build(spec);
  std::pair<Graph, Graph> shards = graph.split("pool1");
  std::unique_ptr<Backend> edge_backend = make_backend(pick("xnnpack"));
  std::unique_ptr<Backend> cloud_backend = make_backend(pick("onednn"));
  Network whole{graph, *edge_backend, 77};
  Network front{shards.first, *edge_backend, 0}, back{shards.second, *cloud_backend, 0};
  OptimizerOptions front_options;
  Sgd front_opt{front.params(), front_options}, back_opt{back.params(), sgd()};
  std::unique_ptr<BackShardTrainer> trainer;
  CloudSession cloud;
  EdgeSession edge;

  explicit Split(uint32_t k, uint32_t batch = 32, std::vector<wire::DType> offer = {wire::DType::F32},
                 std::vector<wire::DType> takes = CloudSessionConfig{}.dtypes, SessionCheckpoints* store = nullptr,
                 OptimizerOptions front_sgd = sgd(), Federation* federation = nullptr, bool shared_back = false,
                 RoundCheckpoints* rounds = nullptr)
      : front_options(front_sgd),
        trainer(shared_back ? std::make_unique<BackShardTrainer>(back, back_opt, 30.0, 1)
                            : std::make_unique<BackShardTrainer>(back, back_opt)),
        cloud(*trainer, {model_hash(spec, "pool1"), batch, k, 4, 1, kDefaultMaxMessageBytes, std::move(takes), "pool1",
                         store, federation, rounds}),
        edge(front, front_opt, k, model_hash(spec, "pool1"), "edge-test", std::move(offer)) {
    copy_params(front, whole);
    copy_params(back, whole);
  }

  // As the service does: the reply is queued, then the step it completed (if any) is applied.
  CloudReply send(std::span<const uint8_t> bytes) {
    CloudReply r = cloud.handle(Frame::copy_of(bytes.data(), bytes.size()));
    cloud.finish_step();
    return r;
  }

  void handshake() {
    CloudReply r = send(edge.hello());
    ASSERT_FALSE(r.close);
    WireError err;
    ASSERT_TRUE(edge.on_welcome(Frame::copy_of(r.bytes.data(), r.bytes.size()), err)) << err.text;
  }

  // One step, pipelined: every Forward goes out before any Backward is handled.
  void step(const Tensor& images, const int32_t* labels, float lr_scale = 1.0f, bool checkpoint = false) {
    const int k = edge.begin_step(images, labels, lr_scale, checkpoint);
    std::vector<Frame> replies;
    for (int mb = 0; mb < k; ++mb) {
      CloudReply r = send(edge.forward(mb));
      ASSERT_FALSE(r.close) << "cloud closed the session";
      replies.push_back(Frame::copy_of(r.bytes.data(), r.bytes.size()));
    }
    for (std::size_t i = replies.size(); i-- > 0;) {  // in reverse: arrival order must not matter
      WireError err;
      bool done = false;
      ASSERT_TRUE(edge.on_backward(replies[i], err, done)) << err.text;
      EXPECT_EQ(done, i == 0);
    }
  }
};

using Data = QuadrantData;
Data make_data(int64_t n, uint64_t seed) { return quadrant_data(n, seed); }


TEST(SplitSession, PipelinedEqualsUnpipelined) {
  Data d = make_data(32, 1);
  Split pipelined(4), plain(1);
  pipelined.handshake();
  plain.handshake();
  for (int s = 0; s < 20; ++s) {
    pipelined.step(d.images, d.labels.data());
    plain.step(d.images, d.labels.data());
  }
  EXPECT_EQ(pipelined.edge.step(), 20u);
  EXPECT_EQ(pipelined.cloud.step(), 20u);
  EXPECT_LE(max_diff(pipelined.front, plain.front), 1e-5f);
  EXPECT_LE(max_diff(pipelined.back, plain.back), 1e-5f);
  // And both equal local training of the same shards without messages.
  Split local(1);
  LocalPipeline trainer({&local.front, &local.back}, {&local.front_opt, &local.back_opt});
  for (int s = 0; s < 20; ++s) trainer.train_step(d.images, d.labels.data(), 1);
  EXPECT_LE(max_diff(pipelined.front, local.front), 1e-5f);
  EXPECT_LE(max_diff(pipelined.back, local.back), 1e-5f);
}

// The cloud's checkpoints kept in memory, as the service keeps them in its state folder.
class MemoryCheckpoints final : public SessionCheckpoints {
 public:
  void save(const std::string& client, uint64_t step, std::span<const uint8_t> bytes) override {
    files_[{client, step}].assign(bytes.begin(), bytes.end());
  }
  CheckpointData load(const std::string& client, uint64_t step) override {
    const auto it = files_.find({client, step});
    if (it == files_.end()) fail("checkpoint", cat("no checkpoint of step ", step));
    return decode_checkpoint(it->second);
  }
  std::size_t size() const { return files_.size(); }

 private:
  std::map<std::pair<std::string, uint64_t>, std::vector<uint8_t>> files_;
};

// Both sides checkpoint step 3, the run goes on to step 4 and both processes die; fresh ones
// resume from step 3 and finish: the weights equal the uninterrupted run's bit for bit.
TEST(SplitSession, ResumedSessionsContinueExactlyLikeUninterruptedOnes) {
  Data d = make_data(32, 2);
  Split straight(4);
  straight.handshake();
  for (int s = 0; s < 6; ++s) straight.step(d.images, d.labels.data(), 1.0f - 0.1f * static_cast<float>(s));

  MemoryCheckpoints store;
  std::vector<uint8_t> edge_checkpoint;
  {
    Split first(4, 32, {wire::DType::F32}, CloudSessionConfig{}.dtypes, &store);
    first.handshake();
    for (int s = 0; s < 4; ++s) {
      first.step(d.images, d.labels.data(), 1.0f - 0.1f * static_cast<float>(s), s == 2);
      if (s == 2) {
        CheckpointMeta meta;
        meta.role = "edge";
        meta.step = first.edge.step();
        edge_checkpoint = encode_checkpoint(meta, first.front, &first.front_opt);
      }
    }
    EXPECT_EQ(store.size(), 1u);
  }
  Split second(4, 32, {wire::DType::F32}, CloudSessionConfig{}.dtypes, &store);
  const CheckpointData saved = decode_checkpoint(edge_checkpoint);
  EXPECT_EQ(saved.meta.step, 3u);
  restore_checkpoint(saved, second.front, &second.front_opt);
  second.edge.resume_from(3);
  second.handshake();
  EXPECT_EQ(second.cloud.step(), 3u);
  EXPECT_EQ(second.edge.step(), 3u);
  for (int s = 3; s < 6; ++s) second.step(d.images, d.labels.data(), 1.0f - 0.1f * static_cast<float>(s));
  EXPECT_EQ(max_diff(straight.front, second.front), 0.0f);
  EXPECT_EQ(max_diff(straight.back, second.back), 0.0f);
}

TEST(SplitSession, LossFallsAndEvaluationWorks) {
  Data d = make_data(64, 2);
  Split s(4, 64);
  s.handshake();
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    s.step(d.images, d.labels.data());
    (step == 0 ? first : last) = s.edge.step_loss_sum() / 64;
  }
  EXPECT_LT(last, 0.5 * first);
  CloudReply r = s.send(s.edge.eval_forward(9, d.images, d.labels.data(), 64));
  ASSERT_FALSE(r.close);
  Frame f = Frame::copy_of(r.bytes.data(), r.bytes.size());
  WireError err;
  const auto* result = verify_frame(f, kDefaultMaxMessageBytes, err)->payload_as_EvalResult();
  ASSERT_NE(result, nullptr);
  EXPECT_EQ(result->batch_id(), 9u);
  EXPECT_EQ(result->count(), 64u);
  EXPECT_GE(result->correct(), 56u);
  EdgeSession::EvalResult taken;
  ASSERT_TRUE(s.edge.on_eval_result(f, err, taken)) << err.text;
  EXPECT_EQ(taken.count, 64);
  EXPECT_EQ(taken.correct, static_cast<int64_t>(result->correct()));
}

// A cloud Error without text (the field is optional on the wire) is reported by the edge with
// its code, not dereferenced: the native agent crashed on one before.
TEST(SplitSession, CloudErrorWithoutTextIsReported) {
  Split s(1, 8);
  s.handshake();
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreateMessage(fbb, wire::Payload::Error, wire::CreateError(fbb, wire::ErrorCode::Internal).Union()),
             wire::MessageIdentifier());
  const Frame bare = Frame::copy_of(fbb.GetBufferPointer(), fbb.GetSize());
  WireError err;
  EdgeSession::EvalResult taken;
  EXPECT_FALSE(s.edge.on_eval_result(bare, err, taken));
  EXPECT_EQ(err.code, wire::ErrorCode::Internal);
  EXPECT_EQ(err.text, "the cloud refused: (no text)");
  bool done = false;
  EXPECT_FALSE(s.edge.on_backward(bare, err, done));
  EXPECT_EQ(err.text, "the cloud refused: (no text)");
}

// Compressed wire dtypes: negotiated in Hello, and training still works. bf16 rounds element by
// element, so K micro-batches still equal one whole batch; f16 and int8 scale per tensor (per
// micro-batch), so there only the loss is checked.
TEST(SplitSession, CompressedWireDtypesTrain) {
  Data d = make_data(32, 1);
  for (const wire::DType dtype : {wire::DType::F16, wire::DType::BF16, wire::DType::I8}) {
    SCOPED_TRACE(dtype_name(dtype));
    Split s(4, 32, {dtype, wire::DType::F32});
    s.handshake();
    EXPECT_EQ(s.edge.dtype(), dtype);
    EXPECT_EQ(s.cloud.dtype(), dtype);
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      s.step(d.images, d.labels.data());
      (step == 0 ? first : last) = s.edge.step_loss_sum() / 32;
    }
    EXPECT_LT(last, 0.5 * first);
  }
  Split pipelined(4, 32, {wire::DType::BF16}), plain(1, 32, {wire::DType::BF16});
  pipelined.handshake();
  plain.handshake();
  for (int s = 0; s < 20; ++s) {
    pipelined.step(d.images, d.labels.data());
    plain.step(d.images, d.labels.data());
  }
  EXPECT_LE(max_diff(pipelined.front, plain.front), 1e-5f);
  EXPECT_LE(max_diff(pipelined.back, plain.back), 1e-5f);
}

// The edge's schedule factor rides on every Forward and scales the cloud's step too.
TEST(SplitSession, ScheduleFactorScalesBothSides) {
  Data d = make_data(32, 1);
  Split s(2);
  s.handshake();
  auto snapshot = [](Network& n) {
    std::vector<float> all;
    for (Param* p : n.params()) all.insert(all.end(), p->value().data(), p->value().data() + p->value().numel());
    return all;
  };
  const auto front0 = snapshot(s.front), back0 = snapshot(s.back);
  s.step(d.images, d.labels.data(), 0.0f);  // a zero factor: no change anywhere
  EXPECT_EQ(snapshot(s.front), front0);
  EXPECT_EQ(snapshot(s.back), back0);
  s.step(d.images, d.labels.data(), 0.5f);
  EXPECT_NE(snapshot(s.front), front0);
  EXPECT_NE(snapshot(s.back), back0);
  EXPECT_FLOAT_EQ(s.front_opt.lr(), 0.025f);
  EXPECT_FLOAT_EQ(s.back_opt.lr(), 0.025f);
}

TEST(SplitSession, WireDtypeFallsBackToWhatTheCloudTakes) {
  Split s(2, 32, {wire::DType::I8, wire::DType::F32}, {wire::DType::F32, wire::DType::F16});
  s.handshake();
  EXPECT_EQ(s.edge.dtype(), wire::DType::F32);
}

// The model zoo (samples/models): each spec split at its default cut, the front on xnnpack
// and the back on onednn (when built), trained through the two sessions' messages for a few
// steps of K=2 on one fixed batch of 4 random images; the batch's loss must fall (Adam 1e-3).
class Zoo : public ::testing::TestWithParam<const char*> {};

// Each sample model trained split (two micro-batches a step over the wire) takes the same
// steps as the whole model trained on the same backend from the same weights and dropout
// counters: the same losses step by step and the same logits at the end, within 2e-3 (a step
// applied twice misses by 0.46 on vgg5). The backend is the one under test (ctest: reference,
// xnnpack, onednn); the op and gradient tests hold each backend's kernels to the reference's,
// so the whole model on the reference is not run again here for the others. And the loss falls.
TEST_P(Zoo, SplitTrainsLikeTheWholeModel) {
  const ModelSpec spec = load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/models/" + GetParam() + ".json");
  const Graph graph = Graph::build(spec);
  const auto [front_graph, back_graph] = graph.split(graph.default_cut());
  auto edge_backend = make_test_backend(backend_under_test()), cloud_backend = make_test_backend(backend_under_test());
  auto whole_backend = make_test_backend(backend_under_test());
  const double loss_tol = 2e-3;
  const float logit_tol = 2e-3f;
  Network whole(graph, *whole_backend, 3), front(front_graph, *edge_backend, 3), back(back_graph, *cloud_backend, 3);
  for (Network* shard : {&front, &back}) {
    copy_params(*shard, whole);
    auto all = whole.counters();
    for (auto& [name, value] : shard->counters())
      for (auto& [whole_name, whole_value] : all)
        if (whole_name == name) *value = *whole_value;  // dropout draws the same masks
  }
  OptimizerOptions adam;
  adam.kind = "adam";
  adam.lr = 1e-3f;
  auto front_opt = make_optimizer(front.params(), adam), back_opt = make_optimizer(back.params(), adam);
  auto whole_opt = make_optimizer(whole.params(), adam);
  const auto hash = model_hash(spec, graph.default_cut());
  BackShardTrainer shard(back, *back_opt);
  CloudSession cloud(shard, {hash, 4, 2, 10, 1, kDefaultMaxMessageBytes, CloudSessionConfig{}.dtypes, "", nullptr});
  EdgeSession edge(front, *front_opt, 2, hash, "zoo");
  auto send = [&](std::span<const uint8_t> bytes) {
    CloudReply r = cloud.handle(Frame::copy_of(bytes.data(), bytes.size()));
    cloud.finish_step();
    return Frame::copy_of(r.bytes.data(), r.bytes.size());
  };
  WireError err;
  ASSERT_TRUE(edge.on_welcome(send(edge.hello()), err)) << err.text;
  Rng rng(4);
  const Shape& in = graph.inputs()[0].shape;
  const Tensor images = random_tensor(in.batched(4), rng, 0.0f, 1.0f);
  const int32_t labels[4] = {1, 7, 3, 1};
  // The whole model's step as the split one takes it: two micro-batches of two, each loss
  // scaled by 1/4, gradients summed, one optimizer step.
  auto whole_step = [&] {
    whole.set_training(true);
    whole.zero_grad();
    double loss = 0.0;
    for (int mb = 0; mb < 2; ++mb) {
      const Tensor& logits = whole.forward(images.slice_batch(2 * mb, 2), mb);
      Tensor dlogits = Tensor::empty(logits.shape());
      loss += compute_loss(graph.loss(), logits, labels + 2 * mb, 0.25f, &dlogits, graph.output_groups());
      whole.backward(dlogits, mb, false);
    }
    whole_opt->step();
    return loss / 4;
  };
  std::vector<double> losses;
  for (int step = 0; step < 4; ++step) {
    const int k = edge.begin_step(images, labels);
    std::vector<Frame> replies;
    for (int mb = 0; mb < k; ++mb) replies.push_back(send(edge.forward(mb)));
    bool done = false;
    for (Frame& f : replies) ASSERT_TRUE(edge.on_backward(f, err, done)) << err.text;
    ASSERT_TRUE(done);
    losses.push_back(edge.step_loss_sum() / 4);
    ASSERT_TRUE(std::isfinite(losses.back())) << "step " << step;
    const double want = whole_step();
    EXPECT_NEAR(losses.back(), want, loss_tol * (1.0 + std::fabs(want))) << GetParam() << ", step " << step;
  }
  EXPECT_LT(losses.back(), losses.front()) << GetParam() << ": loss " << losses.front() << " -> " << losses.back();

  // The trained weights, seen through their logits on fresh images.
  const Tensor probe = random_tensor(in.batched(4), rng, 0.0f, 1.0f);
  for (Network* n : {&whole, &front, &back}) n->set_training(false);
  const Tensor want = whole.forward(probe, 0).clone();
  const Tensor cut = front.forward(probe, 0).clone();
  const Tensor& got = back.forward(cut, 0);
  ASSERT_EQ(got.shape(), want.shape());
  expect_close(got.data(), want.data(), want.numel(), cat(GetParam(), " logits after training"), logit_tol);
}

INSTANTIATE_TEST_SUITE_P(Models, Zoo,
                         ::testing::Values("vgg5-28", "vgg5-32", "vgg11-28", "vgg11-32", "vgg16-28", "vgg16-32",
                                           "resnet18-28", "resnet18-32", "mobilenetv2-28", "mobilenetv2-32"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Sends `bytes` to a fresh or given session and expects an Error reply that closes it.
void expect_refusal(Split& s, std::span<const uint8_t> bytes, wire::ErrorCode code, const std::string& text) {
  CloudReply r = s.send(bytes);
  EXPECT_TRUE(r.close);
  Frame f = Frame::copy_of(r.bytes.data(), r.bytes.size());
  WireError err;
  const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
  ASSERT_NE(m, nullptr);
  const auto* e = m->payload_as_Error();
  ASSERT_NE(e, nullptr) << "reply is " << payload_name(m->payload_type());
  EXPECT_EQ(e->code(), code);
  EXPECT_EQ(e->text()->str(), text);
  EXPECT_TRUE(s.cloud.closed());
}

// The reference backend's kernels but for linear, which it cannot make: as a cuda backend
// past the GPU's memory budget, or a library's failure.
class NoLinearBackend final : public ForwardingBackend {
 public:
  NoLinearBackend() : ForwardingBackend(make_backend("reference")) {}
  std::string_view name() const override { return "no-linear"; }
  std::unique_ptr<LinearKernel> linear(const LinearGeometry&) override {
    fail("cuda", "the GPU memory budget has 0 MiB left and a kernel's buffers needs 1 MiB more");
  }
};

// What the cloud itself fails at ends that session with the reason (Internal) and closes it;
// it is never an exception out of the session, which would take the service down.
TEST(SplitSessionBadInput, AKernelTheCloudCannotMakeEndsOnlyThatSession) {
  const ModelSpec spec = parse_model_json(kSpec);
  const Graph graph = Graph::build(spec);
  const auto shards = graph.split("pool1");
  auto edge_backend = make_backend("reference");
  NoLinearBackend cloud_backend;
  Network front{shards.first, *edge_backend, 0}, back{shards.second, cloud_backend, 0};
  Sgd front_opt{front.params(), sgd()}, back_opt{back.params(), sgd()};
  BackShardTrainer trainer(back, back_opt);
  CloudSession cloud(trainer, {model_hash(spec, "pool1"), 32, 4, 4, 1, kDefaultMaxMessageBytes,
                               CloudSessionConfig{}.dtypes, "pool1"});
  EdgeSession edge(front, front_opt, 4, model_hash(spec, "pool1"), "edge-test");
  const auto hello = edge.hello();
  CloudReply r = cloud.handle(Frame::copy_of(hello.data(), hello.size()));
  WireError err;
  ASSERT_TRUE(edge.on_welcome(Frame::copy_of(r.bytes.data(), r.bytes.size()), err)) << err.text;
  const Data d = make_data(32, 1);
  edge.begin_step(d.images, d.labels.data(), 1.0f, false);
  const auto forward = edge.forward(0);
  r = cloud.handle(Frame::copy_of(forward.data(), forward.size()));
  EXPECT_TRUE(r.close);
  EXPECT_TRUE(cloud.closed());
  bool done = false;
  EXPECT_FALSE(edge.on_backward(Frame::copy_of(r.bytes.data(), r.bytes.size()), err, done));
  EXPECT_EQ(err.code, wire::ErrorCode::Internal);
  EXPECT_EQ(err.text, "the cloud refused: the cloud failed on this session: [cuda] the GPU memory budget has 0 MiB "
                      "left and a kernel's buffers needs 1 MiB more");
}

TEST(SplitSessionBadInput, WrongModelHash) {
  Split s(2);
  MessageWriter w;
  std::array<uint8_t, 32> other{};
  const std::string cloud_hex = to_hex(model_hash(s.spec, "pool1").data(), 32).substr(0, 16);
  expect_refusal(s, w.hello("e", other), wire::ErrorCode::ModelMismatch,
                 "the edge's model spec or cut differs from the cloud's (hash 0000000000000000... vs " + cloud_hex +
                     "...)");
  // The edge sees the cloud's words.
  Split t(2);
  CloudReply r = t.send(w.hello("e", other));
  WireError err;
  EXPECT_FALSE(t.edge.on_welcome(Frame::copy_of(r.bytes.data(), r.bytes.size()), err));
  EXPECT_EQ(err.code, wire::ErrorCode::ModelMismatch);
  EXPECT_EQ(err.text.rfind("the cloud refused: the edge's model spec or cut differs", 0), 0u) << err.text;
}

TEST(SplitSessionBadInput, ResumeFromAStepTheCloudHasNoCheckpointOf) {
  MemoryCheckpoints store;
  Split s(2, 32, {wire::DType::F32}, CloudSessionConfig{}.dtypes, &store);
  s.edge.resume_from(5);
  expect_refusal(s, s.edge.hello(), wire::ErrorCode::NoCheckpoint,
                 "cannot resume client 'edge-test' at step 5: [checkpoint] no checkpoint of step 5");
  Split none(2);
  none.edge.resume_from(5);
  expect_refusal(none, none.edge.hello(), wire::ErrorCode::NoCheckpoint,
                 "this cloud keeps no checkpoints; start the edge afresh");
}

TEST(SplitSessionBadInput, CheckpointAskedOfACloudWithoutCheckpoints) {
  Data d = make_data(8, 1);
  Split s(2, 8);
  s.handshake();
  s.edge.begin_step(d.images, d.labels.data(), 1.0f, true);
  expect_refusal(s, s.edge.forward(0), wire::ErrorCode::NoCheckpoint,
                 "this cloud keeps no checkpoints (serve it with a state folder)");
}

TEST(SplitSessionBadInput, ClientIdThatCannotNameAFolder) {
  for (const char* id : {"../../etc", "", ".hidden", "a b"}) {
    Split s(2);
    MessageWriter w;
    expect_refusal(s, w.hello(id, model_hash(s.spec, "pool1")), wire::ErrorCode::Malformed,
                   "the client id must be 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'");
  }
}

TEST(SplitSessionBadInput, NoCommonWireDtype) {
  Split s(2, 32, {wire::DType::I8}, {wire::DType::F32});
  expect_refusal(s, s.edge.hello(), wire::ErrorCode::BadTensor,
                 "the edge offers no wire dtype this cloud takes (offered: i8; this cloud takes f32)");
}

TEST(SplitSessionBadInput, ActivationsInADtypeNotNegotiated) {
  Split s(2, 32, {wire::DType::F16});
  s.handshake();
  MessageWriter w;
  Rng rng(5);
  const int32_t labels[16] = {};
  expect_refusal(s, w.forward(0, 0, 0, random_tensor({16, 4, 4, 6}, rng), labels, 32, 2, wire::DType::BF16),
                 wire::ErrorCode::BadTensor, "activations: dtype BF16 was not negotiated (this session uses F16)");
}

TEST(SplitSessionBadInput, WrongProtocolVersion) {
  Split s(2);
  MessageWriter w;
  expect_refusal(s, w.hello("e", model_hash(s.spec, "pool1"), "", 99), wire::ErrorCode::ProtocolVersion,
                 "the edge speaks protocol 99, this cloud speaks 1");
}

TEST(SplitSessionBadInput, ForwardBeforeHelloAndAfterClose) {
  Split s(2);
  MessageWriter w;
  Rng rng(1);
  const int32_t labels[16] = {};
  Tensor a = random_tensor({16, 4, 4, 6}, rng);
  expect_refusal(s, w.forward(0, 0, 0, a, labels, 32, 2), wire::ErrorCode::UnexpectedMessage, "Forward before Hello");
  expect_refusal(s, w.bye("x"), wire::ErrorCode::UnexpectedMessage, "the session is closed");
}

TEST(SplitSessionBadInput, GarbageFrame) {
  Split s(2);
  const std::vector<uint8_t> junk(100, 0x5a);
  expect_refusal(s, junk, wire::ErrorCode::Malformed, "not a tandem wire message (missing identifier 'TDMW')");
}

struct Started : Split {
  Started() : Split(2) { handshake(); }
  MessageWriter w;
  Rng rng{3};
  int32_t labels[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  Tensor act(int64_t n = 16, int64_t c = 6) { return random_tensor({n, 4, 4, c}, rng); }
};

TEST(SplitSessionBadInput, WrongShape) {
  Started s;
  expect_refusal(s, s.w.forward(0, 0, 0, s.act(16, 5), s.labels, 32, 2), wire::ErrorCode::BadTensor,
                 "activations: shape [16, 4, 4, 5] differs from the expected [16, 4, 4, 6]");
}

TEST(SplitSessionBadInput, WrongMicrobatchSize) {
  Started s;
  expect_refusal(s, s.w.forward(0, 0, 0, s.act(16), s.labels, 30, 2), wire::ErrorCode::BadTensor,
                 "labels: 16 given for a micro-batch of 15");
}

TEST(SplitSessionBadInput, NanActivations) {
  Started s;
  Tensor a = s.act();
  a[77] = std::numeric_limits<float>::quiet_NaN();
  expect_refusal(s, s.w.forward(0, 0, 0, a, s.labels, 32, 2), wire::ErrorCode::BadTensor,
                 "activations: non-finite value at element 77");
}

// Found by tests/fuzz (cloud_session; the input is tests/fuzz/regressions/cloud_session/
// i8-activations-overflow-the-back-shard): finite activations near the end of the float range
// overflow the back shard. Its NaN gradient went to the I8 encoder (undefined behaviour), or
// back to an F32 edge that then refused it, and the step would have reached the weights.
TEST(SplitSessionBadInput, ActivationsThatOverflowTheBackShard) {
  for (const wire::DType dtype : {wire::DType::F32, wire::DType::I8}) {
    SCOPED_TRACE(dtype_name(dtype));
    Split s(2, 32, {dtype});
    s.handshake();
    // Each sample near the largest float, signed as fc1's first row of weights: its first unit overflows.
    const Tensor& row = s.back.param("fc1.weight").value();  // [24, 96]
    Tensor a = Tensor::empty({16, 4, 4, 6});
    for (int64_t i = 0; i < a.numel(); ++i) a[i] = std::copysign(3e38f, row[i % 96]);
    MessageWriter w;
    const int32_t labels[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    expect_refusal(s, w.forward(0, 0, 0, a, labels, 32, 2, dtype), wire::ErrorCode::BadTensor,
                   "step 0 micro-batch 0: the activations overflow the back shard (non-finite loss); they are far "
                   "outside any trained range");
  }
}

// A cloud's gradients so large that the front's weights overflow: the edge says so itself
// before it would send non-finite activations (which the I8 encoder cannot carry).
TEST(SplitSessionBadInput, GradientsThatMakeTheFrontDiverge) {
  Data d = make_data(32, 5);
  Split s(2);
  s.handshake();
  ASSERT_EQ(s.edge.begin_step(d.images, d.labels.data()), 2);
  MessageWriter cloud;
  for (int mb = 0; mb < 2; ++mb) {
    (void)s.edge.forward(mb);
    Tensor g = Tensor::empty({16, 4, 4, 6});
    for (int64_t i = 0; i < g.numel(); ++i) g[i] = i % 2 ? 3e38f : -3e38f;
    const auto bytes = cloud.backward(0, static_cast<uint32_t>(mb), g, 1.0f);
    WireError err;
    bool done = false;
    ASSERT_TRUE(s.edge.on_backward(Frame::copy_of(bytes.data(), bytes.size()), err, done)) << err.text;
    EXPECT_EQ(done, mb == 1);
  }
  s.edge.begin_step(d.images, d.labels.data());
  const std::string e = error_of([&] { s.edge.forward(0); });
  const std::string want = "[edge session] the front shard's activations for micro-batch 0 of step 1 are not finite";
  EXPECT_EQ(e.substr(0, want.size()), want) << e;
  EXPECT_NE(e.find("): its weights diverged"), std::string::npos) << e;
}

TEST(SplitSessionBadInput, LearningRateScaleOutOfRange) {
  for (const float scale : {std::numeric_limits<float>::quiet_NaN(), -1.0f, 1000.0f}) {
    Started s;
    expect_refusal(s, s.w.forward(0, 0, 0, s.act(), s.labels, 32, 2, wire::DType::F32, scale), wire::ErrorCode::BadTensor,
                   cat("step 0 asks for a learning-rate scale of ", scale, ", outside [0, 100]"));
  }
  Started t;  // a factor that changes inside a step
  CloudReply r = t.send(t.w.forward(0, 0, 0, t.act(), t.labels, 32, 2, wire::DType::F32, 0.5f));
  ASSERT_FALSE(r.close);
  expect_refusal(t, t.w.forward(0, 1, 0, t.act(), t.labels, 32, 2, wire::DType::F32, 0.25f), wire::ErrorCode::BadTensor,
                 "step 0 changed its size, learning-rate scale or checkpoint flag between micro-batches");
}

TEST(SplitSessionBadInput, LabelOutOfRange) {
  Started s;
  s.labels[5] = 4;
  expect_refusal(s, s.w.forward(0, 0, 0, s.act(), s.labels, 32, 2), wire::ErrorCode::BadTensor,
                 "labels: 4 at 5 is outside [0, 4)");
}

TEST(SplitSessionBadInput, StepOutOfWindow) {
  Started s;
  expect_refusal(s, s.w.forward(3, 0, 0, s.act(), s.labels, 32, 2), wire::ErrorCode::OutOfWindow,
                 "step 3 micro-batch 0 is outside the window (step 0, micro-batches 0..1)");
}

TEST(SplitSessionBadInput, MicrobatchTwiceOrPastK) {
  Started s;
  EXPECT_FALSE(s.send(s.w.forward(0, 0, 0, s.act(), s.labels, 32, 2)).close);
  expect_refusal(s, s.w.forward(0, 0, 0, s.act(), s.labels, 32, 2), wire::ErrorCode::OutOfWindow,
                 "micro-batch 0 of step 0 arrived twice");
  Started t;
  expect_refusal(t, t.w.forward(0, 2, 0, t.act(), t.labels, 32, 2), wire::ErrorCode::OutOfWindow,
                 "step 0 micro-batch 2 is outside the window (step 0, micro-batches 0..1)");
}

TEST(SplitSessionBadInput, StepLargerThanTheSessionBatch) {
  Started s;
  expect_refusal(s, s.w.forward(0, 0, 0, s.act(), s.labels, 64, 2), wire::ErrorCode::BadTensor,
                 "step 0 announces 64 samples in 2 micro-batches (session: batch 32, 2 micro-batches)");
}

TEST(SplitSessionBadInput, EdgeRefusesAStrayBackward) {
  Started s;
  Data d = make_data(32, 4);
  s.edge.begin_step(d.images, d.labels.data());
  CloudReply r = s.send(s.edge.forward(0));
  Frame reply = Frame::copy_of(r.bytes.data(), r.bytes.size());
  WireError err;
  bool done = false;
  ASSERT_TRUE(s.edge.on_backward(reply, err, done)) << err.text;
  EXPECT_FALSE(s.edge.on_backward(reply, err, done));  // the same Backward again
  EXPECT_EQ(err.code, wire::ErrorCode::OutOfWindow);
  EXPECT_EQ(err.text, "Backward for step 0 micro-batch 0 was not expected (step 0)");
}

TEST(SplitSessionBadInput, EdgeRefusesAGradientOfAnotherBackShardVersion) {
  Started s;
  Data d = make_data(32, 4);
  s.edge.begin_step(d.images, d.labels.data());
  s.edge.forward(0);
  MessageWriter w;
  const Tensor grad = Tensor::zeros(s.front.output(0).shape());
  const auto bytes = w.backward(0, 0, grad, 1.0f, wire::DType::F32, /*weight_version=*/7);
  WireError err;
  bool done = false;
  EXPECT_FALSE(s.edge.on_backward(Frame::copy_of(bytes.data(), bytes.size()), err, done));
  EXPECT_EQ(err.code, wire::ErrorCode::OutOfWindow);
  EXPECT_EQ(err.text, "Backward for step 0 was computed with back-shard version 7, expected 0");
}

TEST(SplitSessionBadInput, FederationMessagesToACloudThatDoesNotFederate) {
  NamedTensors front;
  {
    Split probe(2);
    for (Param* p : probe.front.params()) front.emplace_back(p->name(), p->value().clone());
  }
  Started s;
  MessageWriter w;
  expect_refusal(s, w.front_weights(0, 10, front), wire::ErrorCode::UnexpectedMessage,
                 "FrontWeights to a cloud that does not federate");
  Started t;
  expect_refusal(t, w.aggregated(1, 2, 10, front), wire::ErrorCode::UnexpectedMessage,
                 "Aggregated is not a message an edge sends");
}

// One edge of a federation (aggregating every 3 steps) whose front updates per round: the
// front holds still through the round and then takes one step on the sum of the round's
// gradients. The reference is the same run with a frozen front (lr 0) and no federation,
// whose per-step front gradients are summed by hand: the back shards match throughout.
TEST(FederatedSession, PerRoundFrontTakesOneStepOnTheRoundsSummedGradients) {
  constexpr uint32_t kEvery = 3;
  const float lr = 0.02f;
  Data d = make_data(32, 3);
  const OptimizerOptions frozen{.lr = 0.0f, .momentum = 0.0f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false};
  OptimizerOptions plain = frozen;
  plain.lr = lr;
  Split reference(2, 32, {wire::DType::F32}, CloudSessionConfig{}.dtypes, nullptr, frozen);
  NamedTensors start;
  for (Param* p : reference.front.params()) start.emplace_back(p->name(), p->value().clone());
  std::vector<Frame> averages;
  Federation federation(start, {.aggregate_every = kEvery, .min_edges = 1, .deadline_s = 10.0},
                        [&](uint64_t, std::span<const uint8_t> b) { averages.push_back(Frame::copy_of(b.data(), b.size())); });
  Split edge(2, 32, {wire::DType::F32}, CloudSessionConfig{}.dtypes, nullptr, plain, &federation, true);
  edge.edge.set_front_updates(EdgeSession::FrontUpdates::PerRound);
  reference.handshake();
  edge.handshake();
  ASSERT_EQ(edge.edge.aggregate_every(), kEvery);

  std::vector<std::vector<double>> summed(start.size());
  for (std::size_t k = 0; k < start.size(); ++k) summed[k].assign(static_cast<std::size_t>(start[k].second.numel()), 0.0);
  for (uint32_t s = 0; s < kEvery; ++s) {
    reference.step(d.images, d.labels.data());
    edge.step(d.images, d.labels.data());
    for (std::size_t k = 0; k < start.size(); ++k) {
      const Tensor& g = reference.front.params()[k]->grad();
      for (int64_t i = 0; i < g.numel(); ++i) summed[k][static_cast<std::size_t>(i)] += g[i];
    }
    EXPECT_EQ(edge.edge.pending_front_steps(), s + 1);
    EXPECT_EQ(max_diff(edge.front, reference.front), 0.0f) << "the front moved within the round, step " << s;
    EXPECT_LE(max_diff(edge.back, reference.back), 1e-6f) << "step " << s;
  }
  double largest = 0.0;
  for (const auto& g : summed)
    for (double v : g) largest = std::max(largest, std::fabs(v));
  ASSERT_GT(largest, 1e-3) << "the round's gradients are too small to tell an update from none";
  ASSERT_TRUE(edge.edge.aggregate_due());
  const CloudReply r = edge.send(edge.edge.front_weights(kEvery * 32));
  EXPECT_FALSE(r.close);
  EXPECT_EQ(edge.edge.pending_front_steps(), 0u);
  for (std::size_t k = 0; k < start.size(); ++k) {
    std::vector<float> want(summed[k].size());
    for (std::size_t i = 0; i < want.size(); ++i)
      want[i] = start[k].second[static_cast<int64_t>(i)] - static_cast<float>(lr * summed[k][i]);
    expect_close(edge.front.params()[k]->value().data(), want.data(), static_cast<int64_t>(want.size()),
                 start[k].first, 1e-5f);
  }
  // The one edge's weights are the round's average; taking it changes nothing.
  ASSERT_EQ(averages.size(), 1u);
  std::vector<Tensor> before;
  for (Param* p : edge.front.params()) before.push_back(p->value().clone());
  WireError err;
  ASSERT_TRUE(edge.edge.on_aggregated(averages[0], err)) << err.text;
  for (std::size_t k = 0; k < before.size(); ++k)
    expect_close(edge.front.params()[k]->value().data(), before[k].data(), before[k].numel(), "after the average", 0.0f);

  // A last, partial round: its pending step is applied before the final front goes up.
  edge.step(d.images, d.labels.data());
  EXPECT_EQ(edge.edge.pending_front_steps(), 1u);
  const float moved_before = max_diff(edge.front, reference.front);
  edge.send(edge.edge.front_weights(32, /*final=*/true));
  EXPECT_EQ(edge.edge.pending_front_steps(), 0u);
  EXPECT_NE(max_diff(edge.front, reference.front), moved_before);
}

// Records the rounds a federation's sessions checkpoint.
struct RecordedRounds final : RoundCheckpoints {
  std::vector<uint32_t> rounds;
  std::vector<float> first_weight;  // of the average
  void save(uint32_t round, const NamedTensors& average, Network&, Optimizer&) override {
    rounds.push_back(round);
    first_weight.push_back(average.front().second[0]);
  }
};

// A closed round is checkpointed once, after the next step's update (between steps, while
// that session holds the back shard); an edge resuming from its own checkpoint is let in at
// its step and takes the newest average.
TEST(FederatedSession, ClosedRoundsAreCheckpointedOnceAndResumingEdgesRejoin) {
  Data d = make_data(32, 4);
  NamedTensors start;
  Split probe(2);
  for (Param* p : probe.front.params()) start.emplace_back(p->name(), p->value().clone());
  std::vector<Frame> sent;
  Federation federation(start, {.aggregate_every = 2, .min_edges = 1, .deadline_s = 10.0},
                        [&](uint64_t, std::span<const uint8_t> b) { sent.push_back(Frame::copy_of(b.data(), b.size())); });
  RecordedRounds rounds;
  WireError err;
  {
    Split edge(2, 32, {wire::DType::F32}, CloudSessionConfig{}.dtypes, nullptr, sgd(), &federation, true, &rounds);
    edge.handshake();
    edge.step(d.images, d.labels.data());
    edge.step(d.images, d.labels.data());
    edge.send(edge.edge.front_weights(64));
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_TRUE(rounds.rounds.empty());  // not before a step has the back shard's turn
    ASSERT_TRUE(edge.edge.on_aggregated(sent[0], err)) << err.text;
    edge.step(d.images, d.labels.data());
    EXPECT_EQ(rounds.rounds, (std::vector<uint32_t>{1}));
    edge.step(d.images, d.labels.data());
    EXPECT_EQ(rounds.rounds, (std::vector<uint32_t>{1}));  // once a round
  }  // the edge's process ends; its session leaves the federation

  // Restarted from its checkpoint of step 4: let in at step 4, then the newest average.
  Split again(2, 32, {wire::DType::F32}, CloudSessionConfig{}.dtypes, nullptr, sgd(), &federation, true, &rounds);
  again.edge.resume_from(4);
  CloudReply r = again.send(again.edge.hello());
  ASSERT_FALSE(r.close);
  ASSERT_TRUE(again.edge.on_welcome(Frame::copy_of(r.bytes.data(), r.bytes.size()), err)) << err.text;
  EXPECT_EQ(again.edge.step(), 4u);
  EXPECT_TRUE(again.edge.awaiting_aggregate());
  ASSERT_FALSE(r.then.empty());
  ASSERT_TRUE(again.edge.on_aggregated(Frame::copy_of(r.then.data(), r.then.size()), err)) << err.text;
  EXPECT_EQ(again.front.params()[0]->value()[0], rounds.first_weight[0]);  // the round-1 average
  again.step(d.images, d.labels.data());
  EXPECT_EQ(again.edge.step(), 5u);
}

// Per step (the default), the same edge moves its front after every step.
TEST(FederatedSession, PerStepFrontMovesEveryStep) {
  Data d = make_data(32, 3);
  NamedTensors start;
  Split probe(2);
  for (Param* p : probe.front.params()) start.emplace_back(p->name(), p->value().clone());
  Federation federation(start, {.aggregate_every = 3, .min_edges = 1, .deadline_s = 10.0},
                        [](uint64_t, std::span<const uint8_t>) {});
  Split edge(2, 32, {wire::DType::F32}, CloudSessionConfig{}.dtypes, nullptr, sgd(), &federation, true);
  edge.handshake();
  edge.step(d.images, d.labels.data());
  EXPECT_EQ(edge.edge.pending_front_steps(), 0u);
  EXPECT_GT(max_diff(edge.front, probe.front), 0.0f);
}

}  // namespace
}  // namespace tandem::test
