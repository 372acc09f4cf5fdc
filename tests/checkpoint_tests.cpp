// Checkpoints: a restored shard continues bitwise like the one that never stopped; truncated,
// bit-flipped, foreign and wrongly keyed files are refused with the error that says why, and
// the folder falls back to the previous checkpoint.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/graph.h"
#include "pipeline/local_pipeline.h"
#include "ports/crypto/aes_gcm.h"
#include "ports/files/atomic_file.h"
#include "ports/files/checkpoint_store.h"
#include "ports/files/release_ledger.h"
#include "tests/test_support.h"

namespace tandem {
namespace {

using test::quadrant_data;

// conv -> batch norm -> relu -> pool -> flatten -> dropout -> linear: every kind of state.
ModelSpec stateful_cnn() {
  return parse_model_json(R"({"name": "ckpt", "inputs": [{"name": "image", "shape": [8, 8, 1]}],
    "nodes": [
      {"name": "conv1", "op": "conv2d", "inputs": ["image"], "conv2d": {"out_channels": 4, "kernel": [3], "padding": [1]}},
      {"name": "bn1", "op": "batch_norm", "inputs": ["conv1"]},
      {"name": "relu1", "op": "relu", "inputs": ["bn1"]},
      {"name": "pool1", "op": "max_pool2d", "inputs": ["relu1"], "pool": {"kernel": [2]}},
      {"name": "flat", "op": "flatten", "inputs": ["pool1"]},
      {"name": "drop", "op": "dropout", "inputs": ["flat"], "dropout": {"p": 0.25}},
      {"name": "fc", "op": "linear", "inputs": ["drop"], "linear": {"out_features": 4}}],
    "loss": "softmax_cross_entropy"})");
}

struct Shard {
  explicit Shard(uint64_t seed, const std::string& kind = "adam")
      : backend(test::make_test_backend(test::backend_under_test())), net(Graph::build(stateful_cnn()), *backend, seed),
        optimizer(make_optimizer(net.params(), options(kind))), trainer({&net}, {optimizer.get()}) {}
  static OptimizerOptions options(const std::string& kind) {
    OptimizerOptions o;
    o.kind = kind;
    o.lr = 0.01f;
    o.momentum = kind == "sgd" ? 0.9f : 0.0f;
    return o;
  }
  void steps(int n, const test::QuadrantData& d) {
    for (int i = 0; i < n; ++i) trainer.train_step(d.images, d.labels.data(), 2);
  }
  std::vector<float> weights() {
    std::vector<float> out;
    for (Param* p : net.params()) out.insert(out.end(), p->value().data(), p->value().data() + p->value().numel());
    for (auto& [name, t] : net.buffers()) out.insert(out.end(), t->data(), t->data() + t->numel());
    return out;
  }
  std::unique_ptr<Backend> backend;
  Network net;
  std::unique_ptr<Optimizer> optimizer;
  LocalPipeline trainer;
};

CheckpointMeta meta_at(uint64_t step) {
  CheckpointMeta m;
  m.role = "whole";
  m.client_id = "test";
  m.step = step;
  m.epoch = 2;
  m.cursor = 96;
  m.model_hash[0] = 7;
  return m;
}

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-ckpt-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(Checkpoint, RestoredShardContinuesBitwiseLikeTheUninterruptedOne) {
  const auto d = quadrant_data(32, 3);
  for (const char* kind : {"adam", "sgd"}) {
    Shard a(1, kind);
    a.steps(5, d);
    const std::vector<uint8_t> bytes = encode_checkpoint(meta_at(5), a.net, a.optimizer.get());
    a.steps(5, d);

    Shard b(99, kind);  // other weights, statistics, counters and optimizer state
    b.steps(2, d);
    const CheckpointData data = decode_checkpoint(bytes);
    EXPECT_EQ(data.meta.step, 5u);
    EXPECT_EQ(data.meta.epoch, 2);
    EXPECT_EQ(data.meta.cursor, 96);
    EXPECT_EQ(data.meta.model_hash[0], 7);
    EXPECT_EQ(data.optimizer_steps, 5);
    restore_checkpoint(data, b.net, b.optimizer.get());
    b.steps(5, d);
    const auto wa = a.weights(), wb = b.weights();
    ASSERT_EQ(wa.size(), wb.size());
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0) << kind;
  }
}

TEST(Checkpoint, TruncatedBitFlippedAndForeignFilesAreRefused) {
  Shard a(1);
  const std::vector<uint8_t> bytes = encode_checkpoint(meta_at(1), a.net, a.optimizer.get());
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 5);
  EXPECT_NE(test::error_of([&] { decode_checkpoint(cut); }).find("truncated"), std::string::npos);
  std::vector<uint8_t> flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  EXPECT_NE(test::error_of([&] { decode_checkpoint(flipped); }).find("checksum mismatch"), std::string::npos);
  std::vector<uint8_t> foreign = {'n', 'o', 't', ' ', 'o', 'u', 'r', 's', 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_NE(test::error_of([&] { decode_checkpoint(foreign); }).find("bad magic"), std::string::npos);
}

TEST(Checkpoint, AnotherModelOrOptimizerIsRefusedBeforeAnythingChanges) {
  Shard a(1);
  const CheckpointData data = decode_checkpoint(encode_checkpoint(meta_at(1), a.net, a.optimizer.get()));
  Shard sgd(2, "sgd");
  const auto before = sgd.weights();
  EXPECT_NE(test::error_of([&] { restore_checkpoint(data, sgd.net, sgd.optimizer.get()); }).find("optimizer is 'adam'"),
            std::string::npos);
  EXPECT_EQ(sgd.weights(), before);

  CheckpointData wrong = data;
  wrong.params[0].value = Tensor::zeros({3});
  Shard c(3);
  EXPECT_NE(test::error_of([&] { restore_checkpoint(wrong, c.net, c.optimizer.get()); }).find("'conv1.weight' is [3]"),
            std::string::npos);
  wrong = data;
  wrong.buffers.clear();
  EXPECT_NE(test::error_of([&] { restore_checkpoint(wrong, c.net, c.optimizer.get()); }).find("no buffer 'bn1.running_mean'"),
            std::string::npos);
}

TEST(CheckpointStore, KeepsTheNewestAndFallsBackPastACorruptOne) {
  const std::string dir = temp_dir("store");
  CheckpointStore store(dir, "edge", std::nullopt, 3);
  Shard a(1);
  for (uint64_t s = 1; s <= 5; ++s) store.save(s, encode_checkpoint(meta_at(s), a.net, a.optimizer.get()));
  EXPECT_EQ(store.steps(), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(store.load_latest()->meta.step, 5u);

  std::vector<uint8_t> newest = read_file(store.path_of(5));
  newest[newest.size() - 40] ^= 1;  // a bit flip inside the payload
  write_file_atomic(store.path_of(5), newest);
  std::vector<uint8_t> four = read_file(store.path_of(4));
  four.resize(four.size() / 2);  // a torn write
  write_file_atomic(store.path_of(4), four);
  std::vector<std::string> refusals;
  const auto latest = store.load_latest(&refusals);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->meta.step, 3u);
  ASSERT_EQ(refusals.size(), 2u);
  EXPECT_NE(refusals[0].find("checksum mismatch"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[1].find("truncated"), std::string::npos) << refusals[1];
  EXPECT_NE(test::error_of([&] { store.load_step(2); }).find("no checkpoint of step 2"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(CheckpointStore, SealedFilesNeedTheirKeyAndRefuseTampering) {
  const std::string dir = temp_dir("sealed");
  const AesKey key = random_key();
  CheckpointStore store(dir, "edge", key);
  Shard a(1);
  const std::vector<uint8_t> plain = encode_checkpoint(meta_at(1), a.net, a.optimizer.get());
  store.save(1, plain);
  store.save(2, encode_checkpoint(meta_at(2), a.net, a.optimizer.get()));
  const std::vector<uint8_t> on_disk = read_file(store.path_of(1));
  EXPECT_TRUE(is_sealed(on_disk));
  // No plaintext run of the weights is visible on disk.
  const float* w = a.net.params()[0]->value().data();
  EXPECT_EQ(std::search(on_disk.begin(), on_disk.end(), reinterpret_cast<const uint8_t*>(w),
                        reinterpret_cast<const uint8_t*>(w + 8)),
            on_disk.end());
  EXPECT_EQ(store.load_step(1).meta.step, 1u);

  std::vector<uint8_t> tampered = read_file(store.path_of(2));
  tampered[30] ^= 0x80;
  write_file_atomic(store.path_of(2), tampered);
  std::vector<std::string> refusals;
  EXPECT_EQ(store.load_latest(&refusals)->meta.step, 1u);
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_NE(refusals[0].find("authentication failed"), std::string::npos) << refusals[0];

  CheckpointStore wrong_key(dir, "edge", random_key());
  EXPECT_FALSE(wrong_key.load_latest().has_value());
  CheckpointStore no_key(dir, "edge");
  EXPECT_NE(test::error_of([&] { no_key.load_step(1); }).find("encrypted and no key"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(AesGcm, KeyFileIsCreatedOnceAndReadBack) {
  const std::string dir = temp_dir("key");
  make_dirs(dir);
  const AesKey k1 = load_key(dir + "/checkpoint.key", true);
  const AesKey k2 = load_key(dir + "/checkpoint.key", false);
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(std::filesystem::status(dir + "/checkpoint.key").permissions() & std::filesystem::perms::group_read,
            std::filesystem::perms::none);
  EXPECT_NE(test::error_of([&] { load_key(dir + "/missing.key", false); }).find("no key file"), std::string::npos);
  const std::vector<uint8_t> msg = {1, 2, 3};
  const auto sealed = seal_aes_gcm(k1, msg);
  EXPECT_EQ(open_aes_gcm(k1, sealed), msg);
  EXPECT_NE(seal_aes_gcm(k1, msg), sealed);  // a fresh nonce each time
  std::filesystem::remove_all(dir);
}

// The durable count of noised releases: a new ledger on the same folder goes on from it;
// at_least only raises it; another plan's count, or a file that is not exactly what it
// writes, is refused by name.
TEST(ReleaseLedger, CountsAcrossProcessesAndRefusesAnotherPlanOrAnAlteredFile) {
  const std::string dir = temp_dir("ledger");
  const std::string plan(64, 'a'), other(64, 'b');
  {
    ReleaseLedger ledger(dir, plan);
    EXPECT_EQ(ledger.releases(), 0u);
    ledger.count_one();
    ledger.count_one();
    ledger.at_least(1);
    EXPECT_EQ(ledger.releases(), 2u);
  }
  {
    ReleaseLedger again(dir, plan);  // a new process
    EXPECT_EQ(again.releases(), 2u);
    again.at_least(7);
    EXPECT_EQ(again.releases(), 7u);
  }
  EXPECT_EQ(ReleaseLedger(dir, plan).releases(), 7u);
  EXPECT_EQ(test::error_of([&] { ReleaseLedger(dir, other); }),
            cat("[privacy] ", dir, "/dp-releases counts the releases of another plan (another noise, batch or data: its "
                "epsilon does not simply add up): start in another checkpoint folder"));
  const std::vector<uint8_t> bytes = read_file(dir + "/dp-releases");
  std::string text(bytes.begin(), bytes.end());
  text.replace(text.find("releases 7"), 10, "releases 07");
  write_file_atomic(dir + "/dp-releases", std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  EXPECT_EQ(test::error_of([&] { ReleaseLedger(dir, plan); }),
            cat("[privacy] ", dir, "/dp-releases is not a release count tandem wrote: move it away (its epsilon is then "
                "unknown)"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem
