// What the session harnesses and the seed generator (make_seeds.cpp) share: the small split
// model, the cloud and edge set-ups a fuzz input's first byte selects, and the input format.
// Built with TANDEM_FUZZ_USHAPED (the ushaped_* harnesses), the split is U-shaped: the cloud
// runs the middle, the edge the front and the tail, and the messages are theirs. Built with
// TANDEM_FUZZ_SEQUENCE (the sequence_* harnesses), the model is a small encoder on token ids
// and a padding mask, cut inside its layers: the mask travels with the activations.
//
// A session input is one flags byte (Flags below), then frames, each a 4-byte little-endian
// length and that many bytes (a length past the end takes the rest). The cloud harness feeds
// the frames to a CloudSession as the edge's messages; the edge harness feeds them to an
// EventEdge as the cloud's. make_seeds records both directions of a real in-process run, so
// the seeds carry valid Hello / Forward / EvalForward / FrontWeights / Bye and Welcome /
// Backward / Aggregated / EvalResult messages for the fuzzer to mutate.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/registry.h"
#include "cloud/federation/federation.h"
#include "cloud/session/back_shard_trainer.h"
#include "cloud/session/cloud_session.h"
#include "core/checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "pipeline/local_pipeline.h"
#include "core/wire/messages.h"
#include "edge/session/event_edge.h"
#include "../small_split_spec.h"

namespace tandem::fuzz {

// Two attention layers on 6 tokens (ids below 8, a padding mask), cut after the first: the
// cloud's layer and its masked mean pooling read the mask.
inline constexpr const char* kSequenceSpec = R"({ name: "sequence-test", inputs: [
  { name: "ids", shape: [6], dtype: "int32" }, { name: "mask", shape: [6], mask: true, length_buckets: [4, 5] } ], nodes: [
  { name: "emb", op: "embedding", inputs: ["ids"], embedding: { count: 8, features: 8 } },
  { name: "pos", op: "position_embedding", inputs: ["emb"], embedding: { count: 6 } },
  { name: "q0", op: "linear", inputs: ["pos"], linear: { out_features: 8 } },
  { name: "k0", op: "linear", inputs: ["pos"], linear: { out_features: 8 } },
  { name: "v0", op: "linear", inputs: ["pos"], linear: { out_features: 8 } },
  { name: "att0", op: "attention", inputs: ["q0", "k0", "v0", "mask"], attention: { heads: 2 } },
  { name: "res0", op: "add", inputs: ["pos", "att0"] },
  { name: "enc0", op: "layer_norm", inputs: ["res0"] },
  { name: "q1", op: "linear", inputs: ["enc0"], linear: { out_features: 8 } },
  { name: "k1", op: "linear", inputs: ["enc0"], linear: { out_features: 8 } },
  { name: "v1", op: "linear", inputs: ["enc0"], linear: { out_features: 8 } },
  { name: "att1", op: "attention", inputs: ["q1", "k1", "v1", "mask"], attention: { heads: 2 } },
  { name: "res1", op: "add", inputs: ["enc0", "att1"] },
  { name: "pool", op: "token_pool", inputs: ["res1", "mask"], token_pool: { mode: "mean" } },
  { name: "fc", op: "linear", inputs: ["pool"], linear: { out_features: 4 } } ], cut: "enc0" })";

#if defined(TANDEM_FUZZ_SEQUENCE)
inline constexpr const char* kSplitSpec = kSequenceSpec;
inline constexpr const char* kCut = "enc0";
inline constexpr const char* kHarnessPrefix = "sequence_";
#else
inline constexpr const char* kSplitSpec = test::kSmallSplitSpec;  // 8x8 images, 4 classes
#endif
#if defined(TANDEM_FUZZ_SEQUENCE)
#elif defined(TANDEM_FUZZ_USHAPED)
inline constexpr const char* kCut = "pool1,fc1";
inline constexpr const char* kHarnessPrefix = "ushaped_";  // corpus/<prefix><harness>
#else
inline constexpr const char* kCut = "pool1";
inline constexpr const char* kHarnessPrefix = "";
#endif
inline constexpr const char* kClient = "edge-fuzz";
inline constexpr const char* kToken = "fuzz-token";
inline constexpr uint32_t kBatch = 8, kMicrobatches = 2, kClasses = 4, kAggregateEvery = 2;
inline constexpr int64_t kTrainImages = 16, kTestImages = 8, kSteps = 3;
inline constexpr uint64_t kSeed = 5;

// The flags byte.
enum Flags : uint8_t {
  kDtypeMask = 3,          // the edge offers 0: F32; 1: F16, F32; 2: BF16, F32; 3: I8, F32
  kFederation = 1 << 2,    // the cloud federates (every kAggregateEvery steps, one edge)
  kCheckpoints = 1 << 3,   // both keep checkpoints (the cloud's holds step 1 of kClient)
  kResume = 1 << 4,        // the edge resumes from its step 1
  kPerRound = 1 << 5,      // the edge's front updates once a round
  kAuthorize = 1 << 6,     // the cloud wants the enrolment token kToken (the edge sends it)
  kPeerIdentity = 1 << 7,  // the cloud's connection proved kClient
};

inline std::vector<wire::DType> offered_dtypes(uint8_t flags) {
  switch (flags & kDtypeMask) {
    case 1: return {wire::DType::F16, wire::DType::F32};
    case 2: return {wire::DType::BF16, wire::DType::F32};
    case 3: return {wire::DType::I8, wire::DType::F32};
    default: return {wire::DType::F32};
  }
}

struct Input {
  uint8_t flags = 0;
  std::vector<std::span<const uint8_t>> frames;
};

inline Input split_input(const uint8_t* data, std::size_t size) {
  Input in;
  if (size == 0) return in;
  in.flags = data[0];
  std::size_t at = 1;
  while (at < size) {
    uint32_t n = 0;
    const std::size_t have = std::min<std::size_t>(4, size - at);
    for (std::size_t i = 0; i < have; ++i) n |= static_cast<uint32_t>(data[at + i]) << (8 * i);
    at += have;
    const std::size_t take = std::min<std::size_t>(n, size - at);
    in.frames.emplace_back(data + at, take);
    at += take;
  }
  return in;
}

inline std::vector<uint8_t> join_input(uint8_t flags, const std::vector<std::vector<uint8_t>>& frames) {
  std::vector<uint8_t> out{flags};
  for (const auto& f : frames) {
    const auto n = static_cast<uint32_t>(f.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

// Grey 8x8 images with a bright quadrant per class (as tests/test_support.h's quadrant_data).
struct Pixels {
  std::vector<uint8_t> bytes;
  std::vector<int32_t> labels;
};
inline Pixels pixels(int64_t n) {
  Pixels p{std::vector<uint8_t>(static_cast<std::size_t>(n * 64)), std::vector<int32_t>(static_cast<std::size_t>(n))};
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<int32_t>((i * 7 + 3) % kClasses);
    p.labels[static_cast<std::size_t>(i)] = label;
    for (int64_t y = 0; y < 8; ++y)
      for (int64_t x = 0; x < 8; ++x) {
        const bool bright = (y / 4) == label / 2 && (x / 4) == label % 2;
        p.bytes[static_cast<std::size_t>(i * 64 + y * 8 + x)] =
            static_cast<uint8_t>((bright ? 160 : 0) + (i * 31 + y * 7 + x * 13) % 90);
      }
  }
  return p;
}

inline Tensor images(int64_t n) {
  const Pixels p = pixels(n);
  Tensor t = Tensor::empty({n, 8, 8, 1});
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(p.bytes[static_cast<std::size_t>(i)]) / 255.0f;
  return t;
}

// kSequenceSpec's inputs for pixels(n)'s labels: [CLS] (id 1), the label's key word (2 + label)
// and filler words (6, 7), then padding to 6 tokens (mask 0 from a length of 3 to 6).
inline std::vector<Tensor> sequences(int64_t n) {
  const Pixels p = pixels(n);
  Tensor ids = Tensor::zeros({n, 6}), mask = Tensor::zeros({n, 6});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t length = 3 + i % 4;
    for (int64_t t = 0; t < length; ++t) {
      ids[i * 6 + t] = static_cast<float>(t == 0 ? 1 : t == 1 + i % (length - 1) ? 2 + p.labels[static_cast<std::size_t>(i)]
                                                                                 : 6 + (i + t) % 2);
      mask[i * 6 + t] = 1.0f;
    }
  }
  return {ids, mask};
}

// What the model reads: images, or (TANDEM_FUZZ_SEQUENCE) ids and mask.
inline std::vector<Tensor> model_inputs(int64_t n) {
#ifdef TANDEM_FUZZ_SEQUENCE
  return sequences(n);
#else
  return {images(n)};
#endif
}

// The model, its shards and what every run starts from (built once).
struct Model {
  ModelSpec spec = parse_model_json(kSplitSpec);
  Graph graph = Graph::build(spec);
  std::pair<Graph, Graph> shards = graph.split(kCut);
  std::unique_ptr<Backend> backend = make_backend("reference");
  std::array<uint8_t, 32> hash = model_hash(spec, kCut);
  NamedTensors front_start;             // a federation's starting average (and the tail's, U-shaped)
  std::vector<uint8_t> cloud_step1;     // the cloud's checkpoint of kClient's step 1

  Model() {
    Network front(shards.first, *backend, kSeed);
    std::unique_ptr<Network> tail;
    if (u_shaped_cut(kCut)) tail = std::make_unique<Network>(graph.tail(kCut), *backend, kSeed);
    for (Param* p : front.params()) front_start.emplace_back(p->name(), p->value().clone());
    if (tail)
      for (Param* p : tail->params()) front_start.emplace_back(p->name(), p->value().clone());
    // The cloud's state after a real first step (its optimizer has taken one step).
    Network whole_front(shards.first, *backend, kSeed), back(shards.second, *backend, kSeed);
    Sgd front_opt(whole_front.params(), sgd()), opt(back.params(), sgd());
    std::vector<Network*> stages = {&whole_front, &back};
    std::vector<Optimizer*> optimizers = {&front_opt, &opt};
    std::unique_ptr<Sgd> tail_opt;
    if (tail) {
      tail_opt = std::make_unique<Sgd>(tail->params(), sgd());
      stages.push_back(tail.get());
      optimizers.push_back(tail_opt.get());
    }
    const std::vector<Tensor> inputs = model_inputs(kBatch);
    LocalPipeline(stages, optimizers).train_step(inputs, pixels(kBatch).labels.data(), kMicrobatches);
    CheckpointMeta meta;
    meta.role = "cloud";
    meta.client_id = kClient;
    meta.cut = kCut;
    meta.model_hash = hash;
    meta.step = 1;
    cloud_step1 = encode_checkpoint(meta, back, &opt);
  }
  static OptimizerOptions sgd() {
    return {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false};
  }
};

inline Model& model() {
  static Model m;
  return m;
}

// The cloud's checkpoints in memory.
struct MemoryCheckpoints final : SessionCheckpoints {
  std::map<std::pair<std::string, uint64_t>, std::vector<uint8_t>> kept;
  void save(const std::string& client_id, uint64_t step, std::span<const uint8_t> checkpoint) override {
    kept[{client_id, step}].assign(checkpoint.begin(), checkpoint.end());
  }
  CheckpointData load(const std::string& client_id, uint64_t step) override {
    const auto it = kept.find({client_id, step});
    if (it == kept.end()) fail("checkpoint", cat("no checkpoint of step ", step));
    return decode_checkpoint(it->second);
  }
};

// A round's checkpoint, encoded and dropped.
struct DroppedRounds final : RoundCheckpoints {
  void save(uint32_t, const NamedTensors&, Network& back, Optimizer& optimizer) override {
    CheckpointMeta meta;
    meta.role = "cloud";
    (void)encode_checkpoint(meta, back, &optimizer);
  }
};

// One cloud session as the service would run it for one connection, set up from the flags.
// `on_aggregated` gets the federation's Aggregated messages.
struct Cloud {
  Model& m = model();
  Network back{m.shards.second, *m.backend, kSeed};
  Sgd optimizer{back.params(), Model::sgd()};
  std::unique_ptr<BackShardTrainer> shard;
  std::unique_ptr<Federation> federation;
  MemoryCheckpoints checkpoints;
  DroppedRounds rounds;
  std::unique_ptr<CloudSession> session;

  Cloud(uint8_t flags, std::function<void(std::span<const uint8_t>)> on_aggregated) {
    CloudSessionConfig cc;
    cc.model_hash = m.hash;
    cc.batch_size = kBatch;
    cc.microbatches = kMicrobatches;
    cc.classes = kClasses;
    cc.cut = kCut;
    if (flags & kFederation) {
      shard = std::make_unique<BackShardTrainer>(back, optimizer, 30.0, 1);
      federation = std::make_unique<Federation>(
          m.front_start, FederationOptions{.aggregate_every = kAggregateEvery, .min_edges = 1, .deadline_s = 30.0},
          [cb = std::move(on_aggregated)](uint64_t, std::span<const uint8_t> bytes) {
            if (cb) cb(bytes);
          });
      cc.federation = federation.get();
      cc.rounds = &rounds;
    } else {
      shard = std::make_unique<BackShardTrainer>(back, optimizer);
    }
    if (flags & kCheckpoints) {
      checkpoints.kept[{kClient, 1}] = m.cloud_step1;
      cc.checkpoints = &checkpoints;
    }
    if (flags & kAuthorize) {
      cc.authorize = [](const std::string& token, const std::string&) {
        return token == kToken ? std::string() : std::string("not the fuzz token");
      };
      // The Welcome's fresh token (the edge's next Hello after a lost link) is in the seeds.
      cc.next_token = [](const std::string& client) { return std::string(kToken) + "-next-for-" + client; };
    }
    if (flags & kPeerIdentity) cc.peer_identity = kClient;
    session = std::make_unique<CloudSession>(*shard, cc);
  }
  ~Cloud() { session.reset(); }  // before the federation and the shard it refers to
};

// The edge's checkpoints in memory: encoded on save; resume (kResume) says step 1.
struct EdgeMemoryCheckpoints final : EdgeCheckpointer {
  bool resume_at_1 = false;
  std::vector<uint8_t> last;
  std::optional<CheckpointMeta> resume(const std::array<uint8_t, 32>&, std::span<Network* const>, Optimizer&) override {
    if (!resume_at_1) return std::nullopt;
    CheckpointMeta meta;
    meta.role = "edge";
    meta.client_id = kClient;
    meta.cut = kCut;
    meta.step = 1;
    meta.epoch = 1;
    meta.cursor = kBatch;
    return meta;
  }
  bool due(uint64_t, bool) const override { return true; }
  void save(const CheckpointMeta& position, std::span<Network* const> model, Optimizer& optimizer) override {
    last = encode_checkpoint(position, model, &optimizer);
  }
};

inline EventEdgeConfig edge_config(uint8_t flags, EdgeMemoryCheckpoints* checkpoints) {
  EventEdgeConfig c;
  c.cut = kCut;
  c.client_id = kClient;
  if (flags & kAuthorize) c.token = kToken;
  c.batch = kBatch;
  c.microbatches = kMicrobatches;
  c.steps = kSteps;
  c.optimizer = Model::sgd();
  c.seed = kSeed;
  c.backend = "reference";
  c.dtypes = offered_dtypes(flags);
  c.eval_chunk = 4;
  c.front_updates_per_round = flags & kPerRound;
#ifdef TANDEM_FUZZ_SEQUENCE
  c.group_by_length = true;  // micro-batches at 4, 5 and 6 tokens: the cloud's length checks in the seeds
#endif
  c.proximal_mu = (flags & kPerRound) ? 0.0f : 0.01f;
  if (flags & (kCheckpoints | kResume)) {
    checkpoints->resume_at_1 = flags & kResume;
    c.checkpoints = checkpoints;
  }
  return c;
}

inline void give_data(EventEdge& edge) {
  static const Pixels train = pixels(kTrainImages), test = pixels(kTestImages);
#ifdef TANDEM_FUZZ_SEQUENCE
  edge.set_data(false, sequences(kTrainImages), train.labels);
  edge.set_data(true, sequences(kTestImages), test.labels);
#else
  edge.set_data(false, train.bytes.data(), train.labels.data(), kTrainImages, 8, 8);
  edge.set_data(true, test.bytes.data(), test.labels.data(), kTestImages, 8, 8);
#endif
}

// Every message a peer sends must verify (a cheap oracle for the writers).
inline void check_outgoing(std::span<const uint8_t> bytes, const char* who) {
  if (bytes.empty()) return;
  WireError err;
  const Frame f = Frame::copy_of(bytes.data(), bytes.size());
  if (!verify_frame(f, kDefaultMaxMessageBytes, err)) {
    std::fprintf(stderr, "%s sent a message that does not verify: %s\n", who, err.text.c_str());
    std::abort();
  }
}

}  // namespace tandem::fuzz
