// A federation's round checkpoints: the newest round restores the back shard, its optimizer
// and the average; a bit-flipped, truncated or foreign newest round is refused with the
// reason and the previous one used; and a session in a federation saves each closed round
// once, between steps, while it holds the back shard.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "cloud/federation/round_checkpoints.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/sha256.h"
#include "test_support.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;

struct Shards {
  ModelSpec spec = parse_model_json(kSmallSplitSpec);
  Graph graph = Graph::build(spec);
  std::pair<Graph, Graph> shards = graph.split("pool1");
  std::unique_ptr<Backend> backend = make_test_backend("reference");
  Network front{shards.first, *backend, 1}, back{shards.second, *backend, 2};
  std::unique_ptr<Optimizer> opt =
      make_optimizer(back.params(), {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f});
  std::array<uint8_t, 32> hash = model_hash(spec, "pool1");
};

NamedTensors average_of(float v, Network& front) {
  NamedTensors a;
  for (Param* p : front.params()) {
    Tensor t = Tensor::empty(p->value().shape());
    t.fill(v);
    a.emplace_back(p->name(), t);
  }
  return a;
}

// Trains the back one SGD step on random gradients, so its weights and momentum change.
void nudge(Network& back, Optimizer& opt, uint64_t seed) {
  Rng rng(seed);
  for (Param* p : back.params()) fill_uniform(p->grad().data(), p->grad().numel(), rng);
  opt.step();
}

std::vector<float> weights_of(Network& net) {
  std::vector<float> all;
  for (Param* p : net.params()) all.insert(all.end(), p->value().data(), p->value().data() + p->value().numel());
  return all;
}

struct RoundCheckpointsTest : ::testing::Test {
  fs::path dir = fs::temp_directory_path() / cat("tandem-rounds-", ::getpid(), "-", ::testing::UnitTest::GetInstance()->random_seed());
  void SetUp() override { fs::remove_all(dir); }
  void TearDown() override { fs::remove_all(dir); }
};

TEST_F(RoundCheckpointsTest, NewestRoundRestoresTheBackItsOptimizerAndTheAverage) {
  Shards a;
  FolderRoundCheckpoints saved(dir.string(), a.front, a.hash, "pool1");
  nudge(a.back, *a.opt, 1);
  saved.save(1, average_of(0.25f, a.front), a.back, *a.opt);
  nudge(a.back, *a.opt, 2);
  saved.save(2, average_of(0.5f, a.front), a.back, *a.opt);
  const std::vector<float> want = weights_of(a.back);

  Shards b;
  FolderRoundCheckpoints loaded(dir.string(), b.front, b.hash, "pool1");
  auto last = loaded.load_latest(b.back, *b.opt);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->first, 2u);
  EXPECT_EQ(last->second.size(), a.front.params().size());
  for (auto& [name, t] : last->second)
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t[i], 0.5f) << name;
  EXPECT_EQ(weights_of(b.back), want);
  // The momentum came back too: the same next step lands on the same weights.
  nudge(a.back, *a.opt, 3);
  nudge(b.back, *b.opt, 3);
  EXPECT_EQ(weights_of(b.back), weights_of(a.back));
}

TEST_F(RoundCheckpointsTest, ABitFlippedOrTruncatedNewestRoundIsRefusedAndThePreviousUsed) {
  Shards a;
  FolderRoundCheckpoints saved(dir.string(), a.front, a.hash, "pool1");
  for (uint32_t r = 1; r <= 3; ++r) saved.save(r, average_of(static_cast<float>(r), a.front), a.back, *a.opt);
  {  // round 3's back shard: one bit flipped in the middle
    const fs::path p = saved.back_path(3);
    ASSERT_TRUE(fs::exists(p));
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(p) / 2));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(fs::file_size(p) / 2));
    f.put(static_cast<char>(c ^ 0x10));
  }
  fs::resize_file(saved.front_path(2), fs::file_size(saved.front_path(2)) / 2);  // round 2's average torn
  Shards b;
  FolderRoundCheckpoints loaded(dir.string(), b.front, b.hash, "pool1");
  std::vector<std::string> refusals;
  auto last = loaded.load_latest(b.back, *b.opt, &refusals);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->first, 1u);
  EXPECT_EQ(last->second[0].second[0], 1.0f);
  ASSERT_EQ(refusals.size(), 2u);
  EXPECT_NE(refusals[0].find("refused the federation's round 3"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find("trying the previous one"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[1].find("refused the federation's round 2"), std::string::npos) << refusals[1];
}

TEST_F(RoundCheckpointsTest, RoundsOfAnotherModelAreRefused) {
  Shards a;
  FolderRoundCheckpoints saved(dir.string(), a.front, a.hash, "pool1");
  saved.save(1, average_of(1.0f, a.front), a.back, *a.opt);
  Shards b;
  std::array<uint8_t, 32> other = b.hash;
  other[0] ^= 1;
  FolderRoundCheckpoints loaded(dir.string(), b.front, other, "pool1");
  std::vector<std::string> refusals;
  EXPECT_FALSE(loaded.load_latest(b.back, *b.opt, &refusals).has_value());
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_NE(refusals[0].find("was written for another model or cut; none left"), std::string::npos) << refusals[0];
  EXPECT_FALSE(FolderRoundCheckpoints((dir / "empty").string(), b.front, b.hash, "pool1")
                   .load_latest(b.back, *b.opt)
                   .has_value());
}

}  // namespace
}  // namespace tandem::test
