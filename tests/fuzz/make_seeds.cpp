// Writes the fuzzers' seed corpora (tests/fuzz/corpus/<harness>/) from real runs and real
// files, so they can be regenerated when a format changes:
//   build/fuzz/tests/fuzz/tandem_fuzz_seeds <source dir> <corpus dir>
//   cloud_session, edge_session: both directions of an EventEdge split-training against a
//     CloudSession in this process (fuzz_setup.h's model and flags), one file per set-up;
//   model_spec: sample and test specs in JSON and in the binary form;
//   checkpoint: real checkpoints (Sgd with momentum; batch norm, dropout and Adam; the cloud's);
//   safetensors: PyTorch-layout exports of those models;
//   token: a real token (from a CA of its own), payloads for the harness to sign, a --ttl.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>

#include "cloud/pki/pki.h"
#include "cloud/pki/token.h"
#include "core/interop/safetensors.h"
#include "core/interop/torch_layout.h"
#include "pipeline/local_pipeline.h"
#include "tests/fuzz/fuzz_setup.h"
#include "tests/fuzz/stage_setup.h"

using namespace tandem;
using namespace tandem::fuzz;

namespace {

std::string out_dir;

void write(const std::string& harness, const std::string& name, std::span<const uint8_t> bytes) {
  const std::string dir = out_dir + "/" + harness;
  ::mkdir(out_dir.c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail("seeds", cat("cannot write ", dir, "/", name));
}
void write(const std::string& harness, const std::string& name, const std::string& text) {
  write(harness, name, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("seeds", cat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// One run of the edge against the cloud with `flags`: what each side received, in order.
void session_seeds(uint8_t flags, const std::string& name) {
  std::vector<std::vector<uint8_t>> to_cloud, to_edge_log;
  std::deque<std::vector<uint8_t>> to_edge;
  Cloud cloud(flags, [&](std::span<const uint8_t> b) { to_edge.emplace_back(b.begin(), b.end()); });
  bool closed = false;
  EdgeMemoryCheckpoints checkpoints;
  std::string last_event;
  EventEdge edge(
      model().spec, edge_config(flags, &checkpoints),
      [&](std::span<const uint8_t> b) {
        if (closed) return;
        to_cloud.emplace_back(b.begin(), b.end());
        const CloudReply r = cloud.session->handle(Frame::copy_of(b.data(), b.size()));
        cloud.session->finish_step();
        if (!r.bytes.empty()) to_edge.emplace_back(r.bytes.begin(), r.bytes.end());
        if (!r.then.empty()) to_edge.push_back(r.then);
        closed = closed || r.close;
      },
      [&](const EdgeEvent& e) { last_event = e.json(); });
  give_data(edge);
  edge.on_open();
  while (!to_edge.empty() && !edge.finished()) {
    std::vector<uint8_t> m = std::move(to_edge.front());
    to_edge.pop_front();
    to_edge_log.push_back(m);
    edge.on_message(Frame::copy_of(m.data(), m.size()));
  }
  if (!edge.finished() || edge.failed()) fail("seeds", cat(name, ": the run did not finish: ", last_event));
  write(cat(kHarnessPrefix, "cloud_session"), name, join_input(flags, to_cloud));
  write(cat(kHarnessPrefix, "edge_session"), name, join_input(flags, to_edge_log));
  std::printf("session %-22s %zu messages to the cloud, %zu to the edge\n", name.c_str(), to_cloud.size(),
              to_edge_log.size());
}

constexpr const char* kBnSpec = R"({ name: "fuzz-bn", inputs: [ { name: "image", shape: [8, 8, 1] } ], nodes: [
  { name: "conv1", op: "conv2d", inputs: ["image"], conv2d: { out_channels: 4, kernel: [3], padding: [1] } },
  { name: "bn1", op: "batch_norm", inputs: ["conv1"] },
  { name: "relu1", op: "relu", inputs: ["bn1"] },
  { name: "pool1", op: "max_pool2d", inputs: ["relu1"], pool: { kernel: [2] } },
  { name: "flatten", op: "flatten", inputs: ["pool1"] },
  { name: "drop", op: "dropout", inputs: ["flatten"], dropout: { p: 0.25 } },
  { name: "fc1", op: "linear", inputs: ["drop"], linear: { out_features: 4 } } ], cut: "pool1" })";

void checkpoint_and_safetensors_seeds() {
  Model& m = model();
  const Tensor x = images(kBatch);
  const Pixels p = pixels(kBatch);
  {  // the split model, whole, two Sgd steps with momentum
    Network net(m.graph, *m.backend, kSeed);
    Sgd opt(net.params(), Model::sgd());
    LocalPipeline trainer({&net}, {&opt});
    for (int s = 0; s < 2; ++s) trainer.train_step(x, p.labels.data(), 2);
    CheckpointMeta meta;
    meta.role = "whole";
    meta.cut = kCut;
    meta.model_hash = m.hash;
    meta.step = 2;
    meta.epoch = 1;
    meta.cursor = 16;
    write("checkpoint", "split-whole-sgd", encode_checkpoint(meta, net, &opt));
    write("safetensors", "split-whole", write_safetensors(shard_to_torch(m.graph, net, 2), {{"format", "pt"}}));
    Network front(m.shards.first, *m.backend, kSeed);
    write("safetensors", "split-front", write_safetensors(shard_to_torch(m.graph, front, 0)));
  }
  write("checkpoint", "cloud-step1", m.cloud_step1);
  {  // batch norm, dropout and Adam
    const ModelSpec spec = parse_model_json(kBnSpec);
    const Graph graph = Graph::build(spec);
    Network net(graph, *m.backend, kSeed);
    OptimizerOptions adam;
    adam.kind = "adam";
    adam.lr = 0.001f;
    auto opt = make_optimizer(net.params(), adam);
    LocalPipeline trainer({&net}, {opt.get()});
    trainer.train_step(x, p.labels.data(), 1);
    CheckpointMeta meta;
    meta.role = "whole";
    meta.step = 1;
    write("checkpoint", "bn-dropout-adam", encode_checkpoint(meta, net, opt.get()));
    write("checkpoint", "bn-no-optimizer", encode_checkpoint(meta, net, nullptr));
    write("safetensors", "bn-dropout", write_safetensors(shard_to_torch(graph, net, 1)));
  }
}

void spec_seeds(const std::string& source) {
  const std::pair<const char*, std::string> specs[] = {
      {"split-test", kSplitSpec},
      {"fashion-mnist", read_text(source + "/samples/fashion-mnist/model.json")},
      {"heads", read_text(source + "/samples/fashion-mnist/heads.json")},
      {"residual-bn", read_text(source + "/tests/interop/residual_bn.json")},
      {"resnet18-28", read_text(source + "/samples/models/resnet18-28.json")},
      {"mobilenetv2-28", read_text(source + "/samples/models/mobilenetv2-28.json")},
      {"packed-attention", read_text(source + "/tests/interop/packed_attention.json")},  // slice, torch_names
      {"views", read_text(source + "/tests/interop/views.json")},  // reshape, transpose, reduce (onnx_check.py's Views, imported)
      {"arith", read_text(source + "/tests/interop/arith.json")},  // binary, matmul, softmax, max and min (onnx_check.py's Arith, imported)
      {"padded-encoder", read_text(source + "/tests/interop/padded_encoder.json")},  // a mask that marks padding (make_onnx_seeds.py's PaddedEncoder, imported)
      {"layoutlm-import", read_text(source + "/tests/interop/layoutlm_import.json")},  // layout_embedding, position_embedding's types (make_onnx_seeds.py's LayoutLM, imported)
      {"gates-import", read_text(source + "/tests/interop/gates_import.json")},  // where (-inf), expand, comparisons (make_onnx_seeds.py's Gates, imported)
  };
  for (const auto& [name, json] : specs) {
    const ModelSpec spec = parse_model_json(json, name);
    write("model_spec", cat(name, ".json"), json);
    write("model_spec", cat(name, ".tdms"), spec.binary);
  }
}

void token_seeds() {
  char tmpl[] = "/tmp/tandem-fuzz-seeds-XXXXXX";
  if (!mkdtemp(tmpl)) fail("seeds", "mkdtemp");
  const std::string dir = tmpl;
  pki::init(dir);
  const int64_t now = 1900000000;  // token_fuzz.cpp's clock
  // Mode 0: a real token (signed by this CA, not the harness's: its signature fails there).
  write("token", "real-token", cat('\0', kClient, "\n", pki::issue_token(dir, kClient, 3600, now - 60)));
  // Mode 1: payloads the harness signs: accepted once, expired, from the future, another client.
  const std::string id = "0123456789abcdef0123456789abcdef";
  write("token", "signed-valid", cat('\1', kClient, "\nclient=", kClient, ";id=", id, ";iat=", now - 60, ";exp=", now + 3600));
  write("token", "signed-expired", cat('\1', kClient, "\nclient=", kClient, ";id=", id, ";iat=", now - 7200, ";exp=", now - 3600));
  write("token", "signed-future", cat('\1', kClient, "\nclient=", kClient, ";id=", id, ";iat=", now + 3600, ";exp=", now + 7200));
  write("token", "signed-other-client", cat('\1', "mallory\nclient=", kClient, ";id=", id, ";iat=", now, ";exp=", now + 60));
  // Mode 2: a --ttl value and a client name.
  write("token", "ttl", cat('\2', kClient, "\n15m"));
  std::system(cat("rm -rf '", dir, "'").c_str());
}

// Three stage peers on three threads train two steps of the sequence model (drained under
// the async schedule) and evaluate a batch; the middle's arriving frames, each after its side's byte (0: from the stage before,
// 1: from the one after, 2: from the second first stage). With kStageShared two first
// stages take turns (a step each) on the middle one, are averaged after the round, and each
// evaluates a batch.
[[maybe_unused]] void stage_seeds(uint8_t flags, const std::string& name) {
  const bool shared = (flags & kStageShared) != 0;
  StageUnderTest first(0, flags, 0), second(0, flags, 1), middle(1, flags), last(2, flags);
  auto [first_down_link, middle_up_link] = test::MemoryLink::pair();
  auto [second_down_link, middle_up2_link] = test::MemoryLink::pair();
  auto [middle_down_link, last_up_link] = test::MemoryLink::pair();
  test::MemoryLink &first_down = *first_down_link, &middle_up = *middle_up_link, &middle_down = *middle_down_link,
                   &last_up = *last_up_link, &second_down = *second_down_link, &middle_up2 = *middle_up2_link;
  std::vector<std::vector<uint8_t>> frames;
  middle_up.on_receive = [&](const std::vector<uint8_t>& m) {
    frames.push_back({0});
    frames.back().insert(frames.back().end(), m.begin(), m.end());
  };
  middle_up2.on_receive = [&](const std::vector<uint8_t>& m) {
    frames.push_back({2});
    frames.back().insert(frames.back().end(), m.begin(), m.end());
  };
  middle_down.on_receive = [&](const std::vector<uint8_t>& m) {
    frames.push_back({1});
    frames.back().insert(frames.back().end(), m.begin(), m.end());
  };
  StagePeer p0(*first.stage, first.schedule, first.plan, nullptr, &first_down);
  std::unique_ptr<StagePeer> p0b;
  if (shared) p0b = std::make_unique<StagePeer>(*second.stage, second.schedule, second.plan, nullptr, &second_down);
  StageLink* const middle_ups[2] = {&middle_up, &middle_up2};
  StagePeer p1(*middle.stage, middle.schedule, middle.plan, std::span<StageLink* const>(middle_ups, shared ? 2 : 1),
               &middle_down);
  if (shared) p1.set_first_stage(StageUnderTest::first_stage(flags));
  StagePeer p2(*last.stage, last.schedule, last.plan, &last_up, nullptr);
  const int64_t n = kStageBatch;
  Tensor ids = Tensor::empty(Shape{n, 6}), mask = Tensor::empty(Shape{n, 6});
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 3 + i % 4;
    for (int64_t t = 0; t < 6; ++t) {
      ids.data()[i * 6 + t] = static_cast<float>(t < len ? 1 + (i + t) % 7 : 0);
      mask.data()[i * 6 + t] = t < len ? 1.0f : 0.0f;
    }
    labels.push_back(static_cast<int32_t>(i % kClasses));
  }
  p2.labels_from([&](uint64_t) { return std::span<const int32_t>(labels); });
  p2.evaluation_labels_from([&](uint64_t begin, uint32_t count) { return std::span<const int32_t>(labels).subspan(begin, count); });
  std::string error;
  std::mutex error_mu;
  auto guarded = [&](auto body) {
    return [&, body] {
      try {
        body();
      } catch (const std::exception& e) {
        std::lock_guard lock(error_mu);
        error += e.what();
        first_down.close();
        second_down.close();
        middle_down.close();
      }
    };
  };
  // kStageEnded: every stage recorded the run's end at step 2 before; linked again, the last
  // answers Bye, and so does the middle (set_ended in the harness too).
  const bool ended = (flags & kStageEnded) != 0;
  if (ended)
    for (StagePeer* p : {&p0, &p1, &p2}) p->set_ended(2, true);
  std::thread t2(guarded([&] {
    p2.connect({});
    StepStats s;
    while (!ended && p2.follow_step(s)) {
    }
  }));
  std::thread t1(guarded([&] {
    p1.connect({});
    StepStats s;
    while (!ended && p1.follow_step(s)) {
    }
  }));
  const std::vector<Tensor> x{ids, mask};
  std::thread t0b;
  if (shared)
    t0b = std::thread(guarded([&] {  // the second first stage: step 1 in its turn, an evaluation, its Bye
      p0b->connect({});
      p0b->train_step({1, kStageBatch, kStageMicrobatches, 1.0f, false}, x, labels.data());
      p0b->evaluate(x, labels.data(), 0);
      p0b->finish("done");
    }));
  guarded([&] {
    p0.connect({});
    if (ended) return;
    for (uint64_t step = 0; step < 2; step += shared ? 2 : 1)
      p0.train_step({step, kStageBatch, kStageMicrobatches, 1.0f, false}, x, labels.data());
    p0.drain();  // the async schedule's step in flight (nothing under gpipe)
    p0.evaluate(x, labels.data(), 0);  // an evaluation batch between steps
    p0.finish("done");
  })();
  if (t0b.joinable()) t0b.join();
  t1.join();
  t2.join();
  if (!error.empty()) fail("seeds", cat("the stage run for ", name, ": ", error));
  write("stage_peer", name, join_input(flags, frames));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <source dir> <corpus dir>\n", argv[0]);
    return 2;
  }
  out_dir = argv[2];
  try {
    session_seeds(0, "f32");
    session_seeds(1, "f16");
    session_seeds(3 | kAuthorize | kPeerIdentity, "i8-token-identity");
    session_seeds(kFederation, "federation");
    session_seeds(2 | kFederation | kPerRound, "bf16-federation-per-round");
    session_seeds(kCheckpoints, "checkpoints");
    session_seeds(kCheckpoints | kResume, "resume");
#if defined(TANDEM_FUZZ_USHAPED) || defined(TANDEM_FUZZ_SEQUENCE)  // these builds write only their sessions' seeds
    (void)argv;
    return 0;
#endif
    stage_seeds(0, "f32");
    stage_seeds(1, "f16");
    stage_seeds(3 | kLabelsAtFirst, "i8-labels-at-first");
    stage_seeds(kStageAsync, "async");
    stage_seeds(kStageShared, "shared");
    stage_seeds(kStageEnded, "ended");
    spec_seeds(argv[1]);
    checkpoint_and_safetensors_seeds();
    token_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
