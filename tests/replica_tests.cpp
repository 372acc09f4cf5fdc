// Replicas of a stage over Gloo (collective/gloo_group.h, pipeline/replicas.h): members of a
// real Gloo group, one thread each, meeting through a FileStore and talking over loopback TCP.
// Synchronous replicas train exactly like one stage over all their samples (unequal batches
// included) and stay bit-identical; local SGD averages every H updates as a replay of its rule
// does; a joining replica takes a peer's whole state; a member that leaves or never comes ends
// the others' collectives with GroupLost within the timeout; public addresses are refused.
#include <gtest/gtest.h>

#include <atomic>
#include <sstream>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>
#include <fstream>
#include <set>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include "cloud/session/back_shard_batches.h"
#include "collective/fixed_group.h"
#include "collective/gloo_group.h"
#include "collective/nccl_group.h"
#include "collective/membership.h"
#include "core/graph.h"
#include "core/optimizer.h"
#include "pipeline/layer_shards.h"
#include "pipeline/replicas.h"
#include "pipeline/stage.h"
#include "test_support.h"

namespace tandem::test {
namespace {

// A fresh rendezvous folder a test.
struct StoreDir {
  std::string path;
  StoreDir() {
    char tmpl[] = "/tmp/tandem-replicas-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~StoreDir() { std::filesystem::remove_all(path); }
};

GlooOptions gloo_options(const std::string& dir, const std::string& prefix, int timeout_ms = 20000) {
  GlooOptions o;
  o.store_dir = dir;
  o.prefix = prefix;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

// Runs f(rank) on `size` threads; rethrows the first failure after every thread ended.
void on_members(int size, const std::function<void(int)>& f) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "member " << r;
}

// One replica (or the whole reference): the small CNN from seed 11, its own backend.
struct Replica {
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network net;
  std::unique_ptr<Optimizer> opt;
  Stage stage;
  Replica(const Graph& graph, const OptimizerOptions& options, uint64_t seed = 11)
      : net(graph, *backend, seed), opt(make_optimizer(net.params(), options)), stage(net, opt.get()) {}
  // One step over rows [begin, begin + count) of `data` in micro-batches of at most `mb`:
  // the mean loss over those rows.
  void train(const QuadrantData& data, int64_t begin, int64_t count, int64_t mb) {
    stage.zero_grad();
    int slot = 0;
    for (int64_t at = begin; at < begin + count; at += mb) {
      const int64_t n = std::min(mb, begin + count - at);
      const Tensor rows = data.images.slice_batch(at, n);
      const Stage::LossPass pass = stage.train_loss(std::span<const Tensor>(&rows, 1), slot++,
                                                    data.labels.data() + at, 1.0f / static_cast<float>(count), false);
      ASSERT_TRUE(pass.finite);
    }
    stage.step();
  }
};

// One batch of `rows` rows from each of `starts` (row indices into `data`), in that order: the
// samples an update of several replicas averaged, for its replay on one stage.
QuadrantData gather(const QuadrantData& data, const std::vector<int64_t>& starts, int64_t rows) {
  QuadrantData batch{Tensor::empty({static_cast<int64_t>(starts.size()) * rows, 8, 8, 1}), {}};
  for (std::size_t j = 0; j < starts.size(); ++j) {
    const int64_t from = starts[j];
    std::copy_n(data.images.data() + from * 64, rows * 64, batch.images.data() + static_cast<int64_t>(j) * rows * 64);
    batch.labels.insert(batch.labels.end(), data.labels.begin() + from, data.labels.begin() + from + rows);
  }
  return batch;
}

const OptimizerOptions kSgd{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f, .clip_norm = 1.0f};

bool same_bits(Network& a, Network& b) {
  for (std::size_t i = 0; i < a.params().size(); ++i) {
    const Tensor &x = a.params()[i]->value(), &y = b.params()[i]->value();
    if (std::memcmp(x.data(), y.data(), x.bytes()) != 0) return false;
  }
  return true;
}

TEST(Replicas, SynchronousReplicasTrainLikeOneStageOverAllTheirSamples) {
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  const QuadrantData data = quadrant_data(240, 5);
  // Three replicas whose first parties send unequal batches: 2, 4 and 6 samples a step.
  const int64_t share[3] = {2, 4, 6}, first[3] = {0, 2, 6}, step_rows = 12;
  const int steps = 20;
  Replica whole(graph, kSgd);
  for (int s = 0; s < steps; ++s) whole.train(data, s * step_rows, step_rows, 5);

  StoreDir dir;
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int r = 0; r < 3; ++r) replicas.push_back(std::make_unique<Replica>(graph, kSgd, 100 + r));
  std::vector<uint64_t> samples(3), sums(3);
  std::vector<Group::Stats> stats(3);
  on_members(3, [&](int r) {
    auto group = make_gloo_group(r, 3, gloo_options(dir.path, "sync"));
    Replica& me = *replicas[static_cast<std::size_t>(r)];
    ReplicaSync sync(me.stage, *group, {});
    // They start from different seeds: member 0's weights become everyone's.
    Replica seed(graph, kSgd);
    if (r == 0) copy_params(me.net, seed.net);
    sync.copy_from(0);
    for (int s = 0; s < steps; ++s) me.train(data, s * step_rows + first[r], share[r], 3);
    samples[static_cast<std::size_t>(r)] = sync.last_step_samples();
    sums[static_cast<std::size_t>(r)] = sync.averages();
    stats[static_cast<std::size_t>(r)] = group->stats();
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(cat("replica ", r));
    EXPECT_LE(max_diff(replicas[static_cast<std::size_t>(r)]->net, whole.net), 1e-5f);
    EXPECT_TRUE(same_bits(replicas[static_cast<std::size_t>(r)]->net, replicas[0]->net));
    EXPECT_EQ(samples[static_cast<std::size_t>(r)], 12u);
    EXPECT_EQ(sums[static_cast<std::size_t>(r)], static_cast<uint64_t>(steps));
    // One broadcast (with the two update counts) and one all-sum a step (the gradients, the
    // learning-rate scales, the count and the join flag), each after the all-sum of the
    // members' headers (4 floats a member) that checks them in step.
    std::size_t floats = 0, state = 0;
    for (Param* p : whole.net.params()) floats += static_cast<std::size_t>(p->value().numel());
    for (Tensor* t : whole.opt->state()) state += static_cast<std::size_t>(t->numel());
    EXPECT_EQ(stats[static_cast<std::size_t>(r)].collectives, static_cast<uint64_t>(2 * (steps + 1)));
    EXPECT_EQ(stats[static_cast<std::size_t>(r)].bytes,
              (steps * (floats + 3) + floats + state + 2 + (steps + 1) * 4 * 3) * 4);
    EXPECT_EQ(replicas[static_cast<std::size_t>(r)]->opt->steps(), steps);
  }
  // The weights moved: the check above is not of the initial weights.
  Replica start(graph, kSgd);
  EXPECT_GT(max_diff(whole.net, start.net), 1e-3f);
}

TEST(Replicas, LocalSgdAveragesEveryHUpdatesAsItsReplayDoes) {
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  const QuadrantData data = quadrant_data(200, 6);
  const int steps = 10, every = 4;
  // The replay: two stages training alone, their weights averaged by hand after updates 4 and 8.
  Replica a(graph, kSgd), b(graph, kSgd);
  std::vector<bool> equal_after;
  for (int s = 0; s < steps; ++s) {
    a.train(data, s * 8, 4, 4);
    b.train(data, s * 8 + 4, 4, 4);
    if ((s + 1) % every == 0)
      for (std::size_t i = 0; i < a.net.params().size(); ++i) {
        Tensor &x = a.net.params()[i]->value(), &y = b.net.params()[i]->value();
        for (int64_t j = 0; j < x.numel(); ++j) x[j] = y[j] = (x[j] + y[j]) * 0.5f;
      }
  }
  StoreDir dir;
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(std::make_unique<Replica>(graph, kSgd));
  std::vector<std::vector<int>> equal_at(2);
  on_members(2, [&](int r) {
    auto group = make_gloo_group(r, 2, gloo_options(dir.path, "local"));
    Replica& me = *replicas[static_cast<std::size_t>(r)];
    ReplicaSync sync(me.stage, *group, {.mode = ReplicaMode::LocalSgd, .average_every = every});
    for (int s = 0; s < steps; ++s) {
      me.train(data, s * 8 + 4 * r, 4, 4);
      group->barrier();  // both have stepped: compare
      if (r == 0 && same_bits(replicas[0]->net, replicas[1]->net)) equal_at[0].push_back(s + 1);
      group->barrier();
    }
    EXPECT_EQ(sync.averages(), 2u);
  });
  EXPECT_EQ(equal_at[0], (std::vector<int>{4, 8}));
  EXPECT_LE(max_diff(replicas[0]->net, a.net), 1e-6f);
  EXPECT_LE(max_diff(replicas[1]->net, b.net), 1e-6f);
  EXPECT_GT(max_diff(replicas[0]->net, replicas[1]->net), 1e-4f);  // two updates since the last average
}

TEST(Replicas, AJoiningReplicaTakesAPeersWholeState) {
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  const QuadrantData data = quadrant_data(64, 7);
  const OptimizerOptions adam{.lr = 0.01f, .kind = "adam"};
  Replica serving(graph, adam), joining(graph, adam, 99);
  for (int s = 0; s < 3; ++s) serving.train(data, s * 8, 8, 4);
  StoreDir dir;
  on_members(2, [&](int r) {
    auto group = make_gloo_group(r, 2, gloo_options(dir.path, "join"));
    Replica& me = r == 0 ? serving : joining;
    ReplicaSync sync(me.stage, *group, {});
    sync.copy_from(0);
  });
  EXPECT_TRUE(same_bits(serving.net, joining.net));
  EXPECT_EQ(joining.opt->steps(), 3);
  const auto sa = serving.opt->state(), sb = joining.opt->state();
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(std::memcmp(sa[i]->data(), sb[i]->data(), sa[i]->bytes()), 0);
  // From here on both train alike.
  serving.train(data, 24, 8, 4);
  joining.train(data, 24, 8, 4);
  EXPECT_TRUE(same_bits(serving.net, joining.net));
}

// A set of three over a Membership: member 2 leaves after step 4 (its group closes mid-run, as
// a killed process's does), the survivors redo step 5's all-sum in epoch 2 and go on; a new
// replica asks to join before step 10 and is let in after it (epoch 3), taking rank 0's
// state. Every update equals one stage's over the samples of the members of its epoch.
TEST(Replicas, ASetLosesAMemberAndLetsOneInWhileItTrains) {
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  const QuadrantData data = quadrant_data(480, 8);
  const int steps = 20, leave_after = 4, join_at = 10;
  const int64_t rows = 4;  // a replica's rows a step; replica slot j takes rows [4j, 4j + 4) of step s's 16
  auto rows_of = [&](int s, int slot) { return s * 16 + slot * rows; };
  // The replay: one stage over the members' rows of each step.
  Replica whole(graph, kSgd);
  for (int s = 0; s < steps; ++s) {
    std::vector<int> slots = s <= leave_after ? std::vector<int>{0, 1, 2} : s <= join_at ? std::vector<int>{0, 1}
                                                                                          : std::vector<int>{0, 1, 3};
    std::vector<int64_t> starts;
    for (int slot : slots) starts.push_back(rows_of(s, slot));
    const QuadrantData batch = gather(data, starts, rows);
    whole.train(batch, 0, batch.images.shape()[0], 6);
  }

  StoreDir dir;
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int r = 0; r < 4; ++r) replicas.push_back(std::make_unique<Replica>(graph, kSgd, r == 0 ? 11 : 50 + r));
  const std::string join_file = dir.path + "/membership-set/join-r3";
  std::atomic<int> done0{0}, done1{0};  // steps replicas 0 and 1 have finished
  std::vector<Membership::Stats> stats(4);
  std::vector<uint64_t> epochs(4);
  on_members(4, [&](int r) {
    MembershipOptions o{.gloo = gloo_options(dir.path, "set", 5000), .id = cat("r", r), .initial = 3,
                        .settle = std::chrono::milliseconds(300)};
    Replica& me = *replicas[static_cast<std::size_t>(r)];
    if (r == 3) {  // the joiner asks once the others have finished step join_at - 1
      while (done0 < join_at || done1 < join_at) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      Membership m(o);
      ReplicaSync sync(me.stage, m, {});
      sync.copy_from(0);
      EXPECT_EQ(me.opt->steps(), join_at + 1);
      for (int s = join_at + 1; s < steps; ++s) me.train(data, rows_of(s, 3), rows, 3);
      stats[3] = m.stats();
      epochs[3] = m.epoch();
      return;
    }
    Membership m(o);
    ReplicaSync sync(me.stage, m, {});
    sync.copy_from(0);
    for (int s = 0; s < steps; ++s) {
      if (r == 2 && s > leave_after) return;  // leaves: its group closes
      if (s == join_at)                        // the joiner has asked before this step
        while (!std::filesystem::exists(join_file)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      me.train(data, rows_of(s, r), rows, 3);
      (r == 0 ? done0 : done1) = s + 1;
    }
    stats[static_cast<std::size_t>(r)] = m.stats();
    epochs[static_cast<std::size_t>(r)] = m.epoch();
  });
  for (int r : {0, 1, 3}) {
    SCOPED_TRACE(cat("replica ", r));
    EXPECT_EQ(epochs[static_cast<std::size_t>(r)], 3u);
    EXPECT_LE(max_diff(replicas[static_cast<std::size_t>(r)]->net, whole.net), 1e-5f);
    EXPECT_TRUE(same_bits(replicas[static_cast<std::size_t>(r)]->net, replicas[0]->net));
  }
  EXPECT_EQ(stats[0].reforms, 2u);
  EXPECT_EQ(stats[0].dropped, 1u);
  EXPECT_EQ(stats[0].joined, 1u);
}

// A set stopped (every member ended) and started again in the same folder forms anew, in the
// next epoch, instead of its replicas waiting to be let into a set nobody runs.
TEST(Replicas, ASetStoppedAndStartedAgainFormsAnew) {
  StoreDir dir;
  std::vector<uint64_t> epochs(2);
  for (int run = 0; run < 2; ++run)
    on_members(2, [&](int r) {
      MembershipOptions o{.gloo = gloo_options(dir.path, "again", 5000), .id = cat("r", r), .initial = 2,
                          .join_timeout = std::chrono::milliseconds(10000)};
      Membership m(o);
      std::vector<float> v{1.0f};
      m.group().all_sum(v);
      EXPECT_EQ(v[0], 2.0f);
      epochs[static_cast<std::size_t>(r)] = m.epoch();
    });
  EXPECT_EQ(epochs[0], 2u);
  EXPECT_EQ(epochs[1], 2u);
}

// A member silent past the group's timeout is dropped by the others, who go on; when it
// speaks again it finds itself left out, joins the set again by itself (its pending update
// dropped) and takes their state: all end bit-identical, and every update equals one stage
// over its epoch's members' rows.
TEST(Replicas, ASilentMemberLeftOutJoinsAgainByItself) {
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  const QuadrantData data = quadrant_data(480, 9);
  const int steps = 12, silent_at = 4;
  const int64_t rows = 4;
  auto rows_of = [&](int s, int r) { return s * 12 + r * rows; };
  StoreDir dir;
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int r = 0; r < 3; ++r) replicas.push_back(std::make_unique<Replica>(graph, kSgd, r == 0 ? 11 : 70 + r));
  std::vector<Membership::Stats> stats(3);
  std::vector<std::vector<std::string>> members(3);  // each member's view of every update's members
  std::vector<int> skipped(3);
  on_members(3, [&](int r) {
    MembershipOptions o{.gloo = gloo_options(dir.path, "quiet", 1500), .id = cat("r", r), .initial = 3,
                        .settle = std::chrono::milliseconds(300), .join_timeout = std::chrono::milliseconds(20000)};
    Replica& me = *replicas[static_cast<std::size_t>(r)];
    Membership m(o);
    ReplicaSync sync(me.stage, m, {});
    sync.copy_from(0);
    // Each member trains the rows of the update it is at (a driver's step counter: a member
    // that joins again takes the others' count).
    bool was_silent = false;
    while (me.opt->steps() < steps) {
      const int s = static_cast<int>(me.opt->steps());
      if (r == 2 && s == silent_at && !was_silent) {  // silent past the group's timeout
        was_silent = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(4000));
      }
      if (r < 2 && s == silent_at + 2)  // the others train on, and wait here until it asks again
        while (!std::filesystem::exists(dir.path + "/membership-quiet/join-r2"))
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      me.train(data, rows_of(s, r), rows, 2);
      if (me.opt->steps() != s + 1) {  // its pending update dropped, the others' state taken
        ++skipped[static_cast<std::size_t>(r)];
        continue;
      }
      std::string who;
      for (const std::string& t : sync.last_step_members()) who += t.substr(0, t.find('#')) + " ";
      members[static_cast<std::size_t>(r)].push_back(who);
    }
    stats[static_cast<std::size_t>(r)] = m.stats();
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(cat("replica ", r));
    EXPECT_TRUE(same_bits(replicas[static_cast<std::size_t>(r)]->net, replicas[0]->net));
  }
  EXPECT_EQ(stats[2].rejoins, 1u);
  EXPECT_EQ(skipped[2], 1);  // the update it had pending when it spoke again
  EXPECT_EQ(skipped[0], 0);
  EXPECT_EQ(stats[0].dropped, 1u);
  EXPECT_EQ(stats[0].joined, 1u);
  // The replay: each of replica 0's updates over the rows of the members it was made with.
  Replica whole(graph, kSgd);
  ASSERT_EQ(members[0].size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    std::vector<int64_t> starts;
    for (int r = 0; r < 3; ++r)
      if (members[0][static_cast<std::size_t>(s)].find(cat("r", r, " ")) != std::string::npos)
        starts.push_back(rows_of(s, r));
    const QuadrantData batch = gather(data, starts, rows);
    whole.train(batch, 0, batch.images.shape()[0], 4);
  }
  EXPECT_LE(max_diff(replicas[0]->net, whole.net), 1e-5f);
  EXPECT_NE(members[0][static_cast<std::size_t>(silent_at)], "r0 r1 r2 ");  // it was dropped for a while
  EXPECT_EQ(members[0].back(), "r0 r1 r2 ");                                // and is back at the end
}

// Replica processes (tandem_replica_child), every one stopped on every exit path.
class Children {
 public:
  ~Children() {
    for (pid_t p : pids_)
      if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
      }
  }
  pid_t start(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    std::string bin = TANDEM_REPLICA_CHILD;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, bin.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
    pids_.push_back(pid);
    return pid;
  }
  void kill9(pid_t pid) {
    if (pid <= 0) return;  // kill(-1, ...) would reach every process of this user
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    for (pid_t& p : pids_)
      if (p == pid) p = 0;
  }
  // Its exit status (-1: still running after `seconds`, then killed).
  int wait_for(pid_t pid, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        kill9(pid);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (pid_t& p : pids_)
      if (p == pid) p = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  std::vector<pid_t> pids_;
};

std::vector<std::string> lines_of(const std::string& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<float> floats_of(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// Three replica processes; one is killed with SIGKILL mid-run: the two others go on within
// seconds in a new epoch, its restart (the same command) joins again and takes their state,
// and all three end on the same weights, those of one stage trained on the rows of each
// update's members: every step applied once, none lost.
TEST(Replicas, AKilledReplicaProcessIsDroppedAndItsRestartRejoins) {
  StoreDir dir;
  const int steps = 40;
  auto args = [&](int j, const std::string& tag) {
    return std::vector<std::string>{"--id", cat("r", j), "--store", dir.path, "--initial", "3", "--steps",
                                    cat(steps), "--step-ms", "60", "--log", cat(dir.path, "/", tag, ".log"),
                                    "--out", cat(dir.path, "/", tag, ".bin")};
  };
  Children children;
  pid_t pid[3];
  for (int j = 0; j < 3; ++j) {
    pid[j] = children.start(args(j, cat("r", j)));
    ASSERT_GT(pid[j], 0) << "cannot start " << TANDEM_REPLICA_CHILD;
  }
  auto logged = [&](const std::string& tag) { return lines_of(cat(dir.path, "/", tag, ".log")); };
  auto wait_until = [&](const std::function<bool()>& ok, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!ok() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return ok();
  };
  ASSERT_TRUE(wait_until([&] { return logged("r2").size() >= 8; }, 60)) << "the set did not take 8 steps";
  children.kill9(pid[2]);
  const auto killed = std::chrono::steady_clock::now();
  const std::size_t before = logged("r0").size();
  ASSERT_TRUE(wait_until([&] { return logged("r0").size() > before + 1; }, 20)) << "the survivors did not go on";
  const double resumed = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(resumed, 10.0);
  const pid_t again = children.start(args(2, "r2-again"));
  ASSERT_GT(again, 0);
  EXPECT_EQ(children.wait_for(pid[0], 90), 0);
  EXPECT_EQ(children.wait_for(pid[1], 30), 0);
  EXPECT_EQ(children.wait_for(again, 30), 0);

  // Replica 0's log: every step once, in order, with the members it averaged.
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  const QuadrantData data = quadrant_data(16 * steps, 8);
  Replica whole(graph, {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f});
  const std::vector<std::string> log = logged("r0");
  ASSERT_EQ(log.size(), static_cast<std::size_t>(steps));
  std::set<std::size_t> sizes;
  bool two_then_three = false;
  for (int s = 0; s < steps; ++s) {
    std::istringstream in(log[static_cast<std::size_t>(s)]);
    int64_t step = 0, epoch = 0, samples = 0;
    in >> step >> epoch >> samples;
    ASSERT_EQ(step, s);
    std::vector<int> slots;
    for (std::string id; in >> id;) slots.push_back(std::atoi(id.c_str() + 1));
    EXPECT_EQ(samples, 4 * static_cast<int64_t>(slots.size())) << log[static_cast<std::size_t>(s)];
    if (slots.size() == 3 && sizes.count(2)) two_then_three = true;
    sizes.insert(slots.size());
    std::vector<int64_t> starts;
    for (int slot : slots) starts.push_back(16 * s + 4 * slot);
    const QuadrantData batch = gather(data, starts, 4);
    whole.train(batch, 0, batch.images.shape()[0], 2);
  }
  EXPECT_TRUE(two_then_three) << "the restarted replica did not rejoin";
  const std::vector<float> w0 = floats_of(dir.path + "/r0.bin"), w1 = floats_of(dir.path + "/r1.bin"),
                           w2 = floats_of(dir.path + "/r2-again.bin");
  ASSERT_FALSE(w0.empty());
  EXPECT_EQ(w0, w1);
  EXPECT_EQ(w0, w2);
  float worst = 0;
  std::size_t k = 0;
  for (Param* p : whole.net.params())
    for (int64_t i = 0; i < p->value().numel(); ++i) worst = std::max(worst, std::fabs(p->value()[i] - w0[k++]));
  EXPECT_EQ(k, w0.size());
  EXPECT_LE(worst, 1e-5f);
}

TEST(Replicas, AMemberThatLeavesEndsTheOthersCollectives) {
  StoreDir dir;
  std::string first, second;
  double waited = 0;
  on_members(2, [&](int r) {
    auto group = make_gloo_group(r, 2, gloo_options(dir.path, "leave", 3000));
    std::vector<float> v{1.0f, 2.0f};
    group->all_sum(v);
    EXPECT_EQ(v, (std::vector<float>{2.0f, 4.0f}));
    group->barrier();
    if (r == 1) return;  // leaves: its group closes its connections
    const auto t0 = std::chrono::steady_clock::now();
    first = error_of([&] { group->all_sum(v); });
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    second = error_of([&] { group->all_sum(v); });
  });
  EXPECT_EQ(first.rfind("[replica group 'leave' (member 0 of 2)] the all-sum did not complete (a member closed, died "
                        "or stayed silent for 3000 ms): ",
                        0),
            0u)
      << first;
  EXPECT_LT(waited, 10.0);
  EXPECT_EQ(second,
            "[replica group 'leave' (member 0 of 2)] a all-sum on a group an earlier collective lost: build a new one");
}

TEST(Replicas, MembersThatNeverComeEndTheMeetingWithinItsTimeout) {
  StoreDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { make_gloo_group(0, 2, gloo_options(dir.path, "alone", 1500)); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(error.rfind(cat("[replica group 'alone' (member 0 of 2)] the members did not all meet in '", dir.path,
                            "' within 1500 ms: "),
                        0),
            0u)
      << error;
  EXPECT_LT(waited, 10.0);
}

// Every collective first checks the members' headers: a member at another update (or with
// another payload) makes every member fail with the same Error, naming both, instead of
// pairing its values with another update's.
TEST(Replicas, AMemberOutOfStepIsAnErrorOnEveryMember) {
  StoreDir dir;
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  const QuadrantData data = quadrant_data(24, 5);
  std::vector<std::string> errors(2);
  on_members(2, [&](int r) {
    auto group = make_gloo_group(r, 2, gloo_options(dir.path, "skew"));
    Replica me(graph, kSgd);
    if (r == 1) me.opt->set_steps(3);  // this one believes it is at update 3
    ReplicaSync sync(me.stage, *group, {});
    errors[static_cast<std::size_t>(r)] = error_of([&] { me.train(data, 0, 4, 4); });
  });
  std::size_t floats = 3;
  {
    Replica one(graph, kSgd);
    for (Param* p : one.net.params()) floats += static_cast<std::size_t>(p->value().numel());
    for (auto& [name, t] : one.net.buffers()) floats += static_cast<std::size_t>(t->numel());
  }
  EXPECT_EQ(errors[0], cat("[replicas] the replica set is out of step: replica 1 is at the gradients of update 3 with ",
                           floats, " values, replica 0 is at the gradients of update 0 with ", floats,
                            " values: every replica must make the same collectives in the same order (the same updates "
                           "and rounds; give each the same options)"));
  EXPECT_EQ(errors[1], cat("[replicas] the replica set is out of step: replica 0 is at the gradients of update 0 with ",
                           floats, " values, replica 1 is at the gradients of update 3 with ", floats,
                            " values: every replica must make the same collectives in the same order (the same updates "
                           "and rounds; give each the same options)"));
}

// Sum mode (a federation's shared shard): the gradients are summed, not averaged, and
// before_update returns every replica's count, which the caller divides the update by; a
// replica that saw nothing counts 0, and when none did every replica skips the update.
TEST(Replicas, SumModeSumsGradientsAndASetThatSawNothingSkipsTheUpdate) {
  StoreDir dir;
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  std::vector<float> first_grad(2), totals(2), extra_sums(2);
  std::vector<int64_t> steps_after(2);
  std::vector<uint8_t> unchanged(2);
  on_members(2, [&](int r) {
    auto group = make_gloo_group(r, 2, gloo_options(dir.path, "sum"));
    Replica me(graph, kSgd);
    ReplicaSync sync(me.stage, *group, {ReplicaMode::Synchronous, 1, /*sum=*/true});
    Param* p = me.net.params()[0];
    me.stage.zero_grad();
    p->grad().data()[0] = static_cast<float>(r + 1);  // 1 and 2: summed 3, where a mean would give 1.5
    totals[static_cast<std::size_t>(r)] = static_cast<float>(sync.before_update(r == 0 ? 2 : 4, nullptr));
    first_grad[static_cast<std::size_t>(r)] = p->grad().data()[0];
    // A federation's round: any values summed, checked by their index.
    std::vector<float> v{static_cast<float>(10 * (r + 1))};
    sync.all_sum(v, 7);
    extra_sums[static_cast<std::size_t>(r)] = v[0];
    // Nobody saw a sample: Stage::step skips the update on every replica.
    const Tensor before = p->value().clone();
    me.stage.zero_grad();
    EXPECT_FALSE(me.stage.step(0));
    steps_after[static_cast<std::size_t>(r)] = me.opt->steps();
    unchanged[static_cast<std::size_t>(r)] = std::memcmp(before.data(), p->value().data(), before.bytes()) == 0;
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(cat("replica ", r));
    EXPECT_EQ(first_grad[static_cast<std::size_t>(r)], 3.0f);
    EXPECT_EQ(totals[static_cast<std::size_t>(r)], 6.0f);
    EXPECT_EQ(extra_sums[static_cast<std::size_t>(r)], 30.0f);
    EXPECT_EQ(steps_after[static_cast<std::size_t>(r)], 0);
    EXPECT_TRUE(unchanged[static_cast<std::size_t>(r)]);
  }
}

// A federation's shard over replicas (cloud/session/back_shard_batches.h, replica windows): a
// window holds one step of each session a replica admitted, however many; drive() applies the
// set's update on its own thread; a replica with no session takes part in every update with
// nothing to hand in. Member 0 serves two sessions, member 1 one, member 2 none (idle from the
// first update, after its hold), every step at learning-rate scale 0.5: all three end on the
// weights one shard reaches with windows of those three sessions' steps, and the idle member
// counted each update.
TEST(Replicas, WindowsOfEachReplicasSessionsAndAnIdleReplicaTrainAsOneShard) {
  StoreDir dir;
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  constexpr uint64_t kSteps = 6;
  constexpr float kLrScale = 0.5f;
  const std::atomic<bool> no{false};
  // Step k of session `owner` leaves these gradients (as its micro-batches would).
  const auto add_grad = [](Replica& me, uint64_t owner, uint64_t k) {
    me.backend->wait();
    for (Param* p : me.net.params())
      for (int64_t i = 0; i < p->grad().numel(); ++i)
        p->grad()[i] += 0.01f * static_cast<float>(owner) * static_cast<float>(k + 1) * static_cast<float>(i % 7 - 3);
  };
  const std::vector<std::vector<uint64_t>> sessions{{1, 2}, {3}, {}};  // each member's
  const auto steps_of = [&](BackShardBatches& shard, Replica& me, const std::vector<uint64_t>& owners) {
    for (uint64_t owner : owners) ASSERT_TRUE(shard.admit(owner, no));
    for (uint64_t k = 0; k < kSteps; ++k) {
      for (uint64_t owner : owners) ASSERT_TRUE(shard.begin_step(owner, 1, no));
      for (uint64_t owner : owners) add_grad(me, owner, k);
      for (uint64_t owner : owners) ASSERT_TRUE(shard.finish_step(owner, kLrScale, {}));
    }
  };
  // The reference: one shard, windows of the three sessions' steps.
  Replica whole(graph, kSgd);
  {
    BackShardBatches one(whole.net, *whole.opt, 3, 0.0, 30.0);
    steps_of(one, whole, {1, 2, 3});
    ASSERT_EQ(one.updates(), kSteps);
  }
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int r = 0; r < 3; ++r) replicas.push_back(std::make_unique<Replica>(graph, kSgd));
  std::vector<uint64_t> updates(3);
  std::vector<ReplicaSync::Totals> totals(3);
  on_members(3, [&](int r) {
    Replica& me = *replicas[static_cast<std::size_t>(r)];
    auto group = make_gloo_group(r, 3, gloo_options(dir.path, "idle"));
    BackShardBatches shard(me.net, *me.opt, 2, 0.0, 30.0);
    ReplicaSync sync(shard.stage(), *group, {ReplicaMode::Synchronous, 1, /*sum=*/true});
    shard.set_replica_windows(0.5);
    std::atomic<bool> stop{false};
    std::string failure;
    std::thread driver([&] {
      BackShardBatches::Drive calls;
      calls.idle = [&] {
        ReplicaSync::IdleCalls idle;
        idle.update = [&](uint64_t steps, double lr_sum) { shard.apply_idle_update(steps, lr_sum); };
        const ReplicaSync::Idled turn = sync.idle(idle);
        return turn == ReplicaSync::Idled::Update ? BackShardBatches::IdleTurn::Update : BackShardBatches::IdleTurn::Nothing;
      };
      try {
        shard.drive(stop, calls);
      } catch (const GroupLost&) {  // another member left first at the end (its driver stopped)
        if (!stop) failure = "the group was lost while training";
      } catch (const std::exception& e) {
        failure = e.what();
      }
    });
    steps_of(shard, me, sessions[static_cast<std::size_t>(r)]);
    for (uint64_t owner : sessions[static_cast<std::size_t>(r)]) shard.release(owner);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (shard.updates() < kSteps && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    updates[static_cast<std::size_t>(r)] = shard.updates();
    stop = true;
    sync.stop();
    driver.join();
    totals[static_cast<std::size_t>(r)] = sync.totals();
    EXPECT_EQ(failure, "") << "member " << r;
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(cat("member ", r));
    EXPECT_EQ(updates[static_cast<std::size_t>(r)], kSteps);
    EXPECT_LE(max_diff(replicas[static_cast<std::size_t>(r)]->net, whole.net), 1e-6f);
    EXPECT_TRUE(same_bits(replicas[static_cast<std::size_t>(r)]->net, replicas[0]->net));
    EXPECT_EQ(replicas[static_cast<std::size_t>(r)]->opt->steps(), static_cast<int64_t>(kSteps));
    EXPECT_GE(totals[static_cast<std::size_t>(r)].collectives, 2 * kSteps);  // each update: its header, its sum
  }
  Replica start(graph, kSgd);
  EXPECT_GT(max_diff(whole.net, start.net), 1e-3f);  // it trained
}

// Layer shards (pipeline/layer_shards.h): a stage of two MLP blocks split over 2 members of a
// real Gloo group, each holding half of every pair's linears, trains to the unsplit stage's
// weights (within 1e-5 after 20 steps of SGD with momentum and weight decay), and the members'
// whole layers stay bit-identical.
constexpr const char* kMlpSpec = R"({ name: "mlp", inputs: [ { name: "x", shape: [12] } ], nodes: [
  { name: "fc1", op: "linear", inputs: ["x"], linear: { out_features: 32 } },
  { name: "act1", op: "relu", inputs: ["fc1"] },
  { name: "fc2", op: "linear", inputs: ["act1"], linear: { out_features: 16 } },
  { name: "act2", op: "tanh", inputs: ["fc2"] },
  { name: "fc3", op: "linear", inputs: ["act2"], linear: { out_features: 24 } },
  { name: "act3", op: "gelu", inputs: ["fc3"] },
  { name: "fc4", op: "linear", inputs: ["act3"], linear: { out_features: 5 } }
], output: "fc4", loss: "softmax_cross_entropy" })";

// A stage trained whole, and split over 2 layer-shard members of a Gloo group (`steps` steps
// of 8 rows of `x` in 2 micro-batches): the whole stage, the members' slices joined back into
// it, how much the whole stage moved from its start, and each member's group's costs.
struct SplitRun {
  float joined_vs_whole = 0, trained = 0;
  std::vector<Group::Stats> stats = std::vector<Group::Stats>(2);
  std::vector<std::unique_ptr<Replica>> members;
};
SplitRun train_split(const ModelSpec& spec, const Tensor& x, const std::vector<int32_t>& labels, int steps,
                     const OptimizerOptions& sgd, const std::string& prefix) {
  const std::vector<LinearPair> pairs = linear_pairs(spec, 2);
  const Graph graph = Graph::build(spec);
  const int64_t rows = x.shape()[0];
  auto train = [&](Stage& stage, int s) {
    stage.zero_grad();
    for (int m = 0; m < 2; ++m) {
      const int64_t at = (s * 8 + m * 4) % rows;
      const Tensor in = x.slice_batch(at, 4);
      stage.train_loss(std::span<const Tensor>(&in, 1), m, labels.data() + at, 1.0f / 8.0f, false);
    }
    stage.step();
  };
  Replica whole(graph, sgd);
  for (int s = 0; s < steps; ++s) train(whole.stage, s);
  SplitRun run;
  StoreDir dir;
  for (int r = 0; r < 2; ++r) run.members.push_back(std::make_unique<Replica>(Graph::build(layer_shard_spec(spec, r, 2)), sgd));
  on_members(2, [&](int r) {
    auto group = make_gloo_group(r, 2, gloo_options(dir.path, prefix));
    GroupReducer reducer(*group);
    Replica& me = *run.members[static_cast<std::size_t>(r)];
    Replica start(graph, sgd);
    load_layer_shard(start.net, me.net, pairs, r, 2);
    me.net.set_reducer(&reducer);
    for (int s = 0; s < steps; ++s) train(me.stage, s);
    run.stats[static_cast<std::size_t>(r)] = group->stats();
  });
  Replica joined(graph, sgd);
  for (int r = 0; r < 2; ++r) store_layer_shard(run.members[static_cast<std::size_t>(r)]->net, joined.net, pairs, r, 2);
  run.joined_vs_whole = max_diff(joined.net, whole.net);
  Replica start(graph, sgd);
  run.trained = max_diff(whole.net, start.net);
  return run;
}

TEST(LayerShards, TwoShardsTrainLikeTheUnsplitStage) {
  const ModelSpec spec = parse_model_json(kMlpSpec);
  const std::vector<LinearPair> pairs = linear_pairs(spec, 2);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].columns, "fc1");
  EXPECT_EQ(pairs[0].rows, "fc2");
  EXPECT_EQ(pairs[1].columns, "fc3");
  EXPECT_EQ(pairs[1].rows, "fc4");
  Rng rng(21);
  const int64_t rows = 24;
  Tensor x = random_tensor({rows, 12}, rng);
  std::vector<int32_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>((i * 7) % 5);
  const SplitRun run = train_split(spec, x, labels, 20, kSgd, "shards");
  EXPECT_EQ(run.members[0]->net.param("fc1.weight").value().shape(), (Shape{16, 12}));
  EXPECT_EQ(run.members[1]->net.param("fc2.weight").value().shape(), (Shape{16, 16}));
  Replica whole(Graph::build(spec), kSgd);
  EXPECT_EQ(run.members[1]->net.params().size(), whole.net.params().size() - 2);  // fc2's and fc4's bias on member 0
  EXPECT_LE(run.joined_vs_whole, 1e-5f);
  EXPECT_GT(run.trained, 1e-3f);  // it trained
  // One all-sum a pair each way a micro-batch, but fc1's input gradient, which nobody asks
  // for (the stage's input is data here): 3 x 2 micro-batches x 20 steps.
  EXPECT_EQ(run.stats[0].collectives, 3u * 2u * 20u);
  // Forward sums of fc2's and fc4's outputs (16 and 5 a row), the backward sum of fc3's input
  // (16 a row), 4 rows a micro-batch.
  EXPECT_EQ(run.stats[0].bytes, 40u * 4u * (16u + 5u + 16u) * 4u);
}

// Attention split by heads (Megatron-LM's attention block): a small encoder layer's query, key
// and value linears split by output features, its attention by heads (4 over 2 members: 2
// each) and its output linear by input features, beside its MLP pair; 2 members of a Gloo
// group train to the unsplit stage's weights within 1e-5.
constexpr const char* kEncoderSpec = R"({ name: "encoder", inputs: [ { name: "x", shape: [6, 8] } ], nodes: [
  { name: "ln0", op: "layer_norm", inputs: ["x"] },
  { name: "q", op: "linear", inputs: ["ln0"], linear: { out_features: 8 } },
  { name: "k", op: "linear", inputs: ["ln0"], linear: { out_features: 8 } },
  { name: "v", op: "linear", inputs: ["ln0"], linear: { out_features: 8 } },
  { name: "att", op: "attention", inputs: ["q", "k", "v"], attention: { heads: 4 } },
  { name: "o", op: "linear", inputs: ["att"], linear: { out_features: 8 } },
  { name: "res0", op: "add", inputs: ["x", "o"] },
  { name: "ln1", op: "layer_norm", inputs: ["res0"] },
  { name: "ff1", op: "linear", inputs: ["ln1"], linear: { out_features: 16 } },
  { name: "act", op: "gelu", inputs: ["ff1"] },
  { name: "ff2", op: "linear", inputs: ["act"], linear: { out_features: 8 } },
  { name: "res1", op: "add", inputs: ["res0", "ff2"] },
  { name: "pool", op: "token_pool", inputs: ["res1"], token_pool: { mode: "mean" } },
  { name: "fc", op: "linear", inputs: ["pool"], linear: { out_features: 3 } }
], output: "fc", loss: "softmax_cross_entropy" })";

TEST(LayerShards, AttentionSplitsByHeadsAndTrainsLikeTheUnsplitStage) {
  const ModelSpec spec = parse_model_json(kEncoderSpec);
  const std::vector<LinearPair> pairs = linear_pairs(spec, 2);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].columns, "q");
  EXPECT_EQ(pairs[0].also, (std::vector<std::string>{"k", "v"}));
  EXPECT_EQ(pairs[0].attention, "att");
  EXPECT_EQ(pairs[0].rows, "o");
  EXPECT_EQ(pairs[1].columns, "ff1");
  EXPECT_EQ(pairs[1].rows, "ff2");
  EXPECT_TRUE(linear_pairs(spec, 8).empty() || linear_pairs(spec, 8)[0].attention.empty())
      << "4 heads do not split over 8 members";
  const ModelSpec member = layer_shard_spec(spec, 1, 2);
  for (const NodeSpec& n : member.nodes) {
    if (n.name == "att") EXPECT_EQ(n.attention.heads, 2);
    if (n.name == "k" || n.name == "v") EXPECT_EQ(n.inputs, (std::vector<std::string>{"q.tp_copy"}));
    if (n.name == "o") EXPECT_FALSE(n.linear.bias) << "the output linear's bias is member 0's";
  }
  Rng rng(23);
  const int64_t rows = 16;
  Tensor x = random_tensor({rows, 6, 8}, rng);
  std::vector<int32_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>((i * 5) % 3);
  const OptimizerOptions sgd{.lr = 0.1f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f, .clip_norm = 0.0f};
  const SplitRun run = train_split(spec, x, labels, 15, sgd, "heads");
  EXPECT_EQ(run.members[0]->net.param("k.weight").value().shape(), (Shape{4, 8}));
  EXPECT_EQ(run.members[1]->net.param("o.weight").value().shape(), (Shape{8, 4}));
  EXPECT_LE(run.joined_vs_whole, 1e-5f);
  EXPECT_GT(run.trained, 1e-3f);  // it trained
}

TEST(LayerShards, RefusalsNameWhatIsMissing) {
  constexpr const char* kOneLinear = R"({ name: "one", inputs: [ { name: "x", shape: [12] } ], nodes: [
    { name: "fc", op: "linear", inputs: ["x"], linear: { out_features: 4 } } ], output: "fc" })";
  EXPECT_EQ(error_of([&] { layer_shard_spec(parse_model_json(kOneLinear), 0, 2); }),
            "[layer shards] model 'one' has no linear pair to split over 2 shards (a linear whose output "
            "features divide by 2, read through activations alone by another linear)");
  EXPECT_EQ(error_of([] { layer_shard_spec(parse_model_json(kMlpSpec), 2, 2); }), "[layer shards] member 2 of 2 shards");
  constexpr const char* kDropout = R"({ name: "drop", inputs: [ { name: "x", shape: [12] } ], nodes: [
    { name: "fc1", op: "linear", inputs: ["x"], linear: { out_features: 8 } },
    { name: "act", op: "relu", inputs: ["fc1"] },
    { name: "fc2", op: "linear", inputs: ["act"], linear: { out_features: 6 } },
    { name: "d", op: "dropout", inputs: ["fc2"], dropout: { p: 0.1 } },
    { name: "fc3", op: "linear", inputs: ["d"], linear: { out_features: 4 } } ], output: "fc3" })";
  EXPECT_EQ(error_of([&] { layer_shard_spec(parse_model_json(kDropout), 0, 2); }),
            "[layer shards] model 'drop': node 'd' (dropout) draws its masks' seed from the initialisation's stream, "
            "which a member's sliced linears use up differently: its members would drop different values; split a "
            "model without dropout");
  // A pair whose first linear's features do not divide: fc3's 24 over 5 shards does not, fc1's 32 neither.
  EXPECT_TRUE(linear_pairs(parse_model_json(kMlpSpec), 5).empty());
  // A shard network used without its group says so, naming the node.
  const Graph shard = Graph::build(layer_shard_spec(parse_model_json(kMlpSpec), 0, 2));
  Replica alone(shard, kSgd);
  Rng rng(3);
  const Tensor in = random_tensor({2, 12}, rng);
  EXPECT_EQ(error_of([&] { alone.stage.forward(std::span<const Tensor>(&in, 1), 0); }),
            "[layer shards] node 'fc2.tp_reduce' (tp_reduce) joins the members of a stage split into layer shards, and "
            "this network has no shard group: give it one (Network::set_reducer, pipeline/layer_shards.h)");
}

// The middle stage of an encoder (cut at emb and at res1: its attention and MLP blocks) split over two members, member 0
// telling member 1 each call (LayerShardLeader, follow_layer_shard) over a FixedGroup: its
// outputs and input gradients, step after step and under weight stashing, equal the unsplit
// stage's; the weights gathered equal its weights; the checkpoints' calls reach member 1.
// The encoder with a linear embedding in place of its first norm, read by the residual too: a
// cut at it leaves the blocks after it a stage of their own.
std::string middle_spec() {
  std::string text = kEncoderSpec;
  const auto swap = [&](const std::string& from, const std::string& to) { text.replace(text.find(from), from.size(), to); };
  swap(R"({ name: "ln0", op: "layer_norm", inputs: ["x"] })", R"({ name: "emb", op: "linear", inputs: ["x"], linear: { out_features: 8 } })");
  for (int i = 0; i < 3; ++i) swap(R"(inputs: ["ln0"])", R"(inputs: ["emb"])");
  swap(R"(inputs: ["x", "o"])", R"(inputs: ["emb", "o"])");
  return text;
}

TEST(LayerShards, AMiddleStageToldItsCallsByMemberZeroTrainsLikeTheUnsplitStage) {
  const ModelSpec spec = parse_model_json(middle_spec());
  const std::vector<std::string> cuts{"emb", "res1"};
  const Graph whole_graph = Graph::build(spec);
  const Graph stage_graph = whole_graph.partition(cuts)[1];
  const OptimizerOptions sgd{.lr = 0.1f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f, .clip_norm = 0.0f};
  Rng rng(29);
  const int steps = 6;
  std::vector<Tensor> xs, grads;
  for (int i = 0; i < steps * 2; ++i) {
    xs.push_back(random_tensor({3, 6, 8}, rng));
    grads.push_back(random_tensor({3, 6, 8}, rng, -0.1f, 0.1f));
  }
  // One step: two micro-batches forward and back (input gradients wanted), the first's
  // weights stashed under the step's second half, then an update and an evaluation.
  auto run = [&](Stage& stage, std::vector<Tensor>& outs, std::vector<Tensor>& ins, int s) {
    stage.zero_grad();
    for (int m = 0; m < 2; ++m) {
      const Tensor& x = xs[static_cast<std::size_t>(s * 2 + m)];
      outs.push_back(stage.forward(std::span<const Tensor>(&x, 1), m).clone());
    }
    if (s % 2 == 1) stage.stash_weights();
    for (int m = 0; m < 2; ++m) ins.push_back(stage.backward(grads[static_cast<std::size_t>(s * 2 + m)], m, true).clone());
    stage.step();
    const Tensor& x = xs[static_cast<std::size_t>(s * 2)];
    outs.push_back(stage.evaluate(std::span<const Tensor>(&x, 1), 0).clone());
  };
  Replica whole(stage_graph, sgd);
  init_from_whole_model(whole_graph, 11, whole.net, *make_backend("reference"));
  std::vector<Tensor> whole_outs, whole_ins;
  for (int s = 0; s < steps; ++s) run(whole.stage, whole_outs, whole_ins, s);

  StoreDir dir;
  std::vector<Tensor> outs, ins;
  std::vector<std::string> told;  // member 1's checkpoint calls
  Replica gathered(stage_graph, sgd);
  uint64_t calls = 0;
  on_members(2, [&](int r) {
    const LayerShardStage shard = layer_shard_stage(spec, cuts, 1, r, 2);
    EXPECT_EQ(shard.pairs.size(), 2u);  // the attention block and the MLP; emb's "pair" crosses the cut
    Replica me(shard.graph, sgd);
    Replica start(stage_graph, sgd);
    init_from_whole_model(whole_graph, 11, start.net, *make_backend("reference"));
    load_layer_shard(start.net, me.net, shard.pairs, r, 2);
    FixedGroupOptions o;
    o.dir = dir.path;
    o.name = "middle";
    o.rank = r;
    o.size = 2;
    o.form_timeout = std::chrono::seconds(20);
    o.timeout = std::chrono::seconds(20);
    FixedGroup group(o);
    GroupReducer reducer(group);
    me.net.set_reducer(&reducer);
    group.form();
    if (r == 0) {
      LayerShardLeader leader(group);
      leader.hello({7, 1, 2});
      me.stage.set_mirror(&leader);
      for (int s = 0; s < steps; ++s) run(me.stage, outs, ins, s);
      EXPECT_EQ(leader.common_steps({0, 4, 8}), (std::vector<uint64_t>{0, 8}));
      leader.save(12);
      leader.restore(8);
      leader.gather();
      gather_layer_shard(group, me.net, &gathered.net, shard.pairs, 0, 2);
      leader.end(false);
    } else {
      LayerShardFollower f;
      f.terms = {7, 1, 2};
      f.has = [](uint64_t step) { return step != 4; };
      f.save = [&](uint64_t step) { told.push_back(cat("save ", step)); };
      f.restore = [&](uint64_t step) { told.push_back(cat("restore ", step)); };
      f.gather = [&] { gather_layer_shard(group, me.net, nullptr, shard.pairs, 1, 2); };
      calls = follow_layer_shard(me.stage, group, f);
    }
  });
  ASSERT_EQ(outs.size(), whole_outs.size());
  ASSERT_EQ(ins.size(), whole_ins.size());
  float worst = 0;
  for (std::size_t i = 0; i < outs.size(); ++i)
    for (int64_t j = 0; j < outs[i].numel(); ++j) worst = std::max(worst, std::abs(outs[i][j] - whole_outs[i][j]));
  for (std::size_t i = 0; i < ins.size(); ++i)
    for (int64_t j = 0; j < ins[i].numel(); ++j) worst = std::max(worst, std::abs(ins[i][j] - whole_ins[i][j]));
  EXPECT_LE(worst, 1e-5f);
  EXPECT_LE(max_diff(gathered.net, whole.net), 1e-5f);
  Replica initial(stage_graph, sgd);
  init_from_whole_model(whole_graph, 11, initial.net, *make_backend("reference"));
  EXPECT_GT(max_diff(whole.net, initial.net), 1e-3f);  // it trained
  EXPECT_EQ(told, (std::vector<std::string>{"save 12", "restore 8"}));
  // The hello; per step: zero_grad, 2 forwards, 2 backwards, step, an evaluation; stash_weights on odd
  // steps (with its use_stash(false), a no-op before a stash). Then steps, save, restore,
  // gather and end.
  EXPECT_EQ(calls, static_cast<uint64_t>(1 + steps * 7 + steps / 2 * 1 + 5));
}

// What member 1 says when told `header` (32 words) as its first call.
std::string told(const std::vector<uint32_t>& header, const std::string& prefix) {
  StoreDir dir;
  std::string error;
  on_members(2, [&](int r) {
    auto group = make_gloo_group(r, 2, gloo_options(dir.path, prefix));
    if (r == 0) {
      std::vector<float> words(32, 0.0f);
      if (!header.empty())
        std::memcpy(words.data(), header.data(), std::min<std::size_t>(header.size(), 32) * sizeof(uint32_t));
      group->broadcast(words, 0);
      return;
    }
    const ModelSpec spec = parse_model_json(kMlpSpec);
    Replica me(Graph::build(layer_shard_spec(spec, 1, 2)), kSgd);
    error = error_of([&] { follow_layer_shard(me.stage, *group, LayerShardFollower{}); });
  });
  return error;
}

TEST(LayerShards, AMemberToldSomethingElseSaysSo) {
  EXPECT_EQ(told({}, "junk"), "[layer shards] member 1 was told call 0 (?) where it awaited call 0: run the same tandem "
                              "build on every member");
  constexpr uint32_t kMagic = 0x5453484cu;
  // A forward to slot 5000 (1024 at most), a call numbered 3 first, a kind past the last.
  EXPECT_EQ(told({kMagic, 0, 1, 5000}, "slot"), "[layer shards] member 1 was told call 0 (forward) where it awaited "
                                                "call 0: run the same tandem build on every member");
  EXPECT_EQ(told({kMagic, 3, 1, 0}, "number"), "[layer shards] member 1 was told call 3 (forward) where it awaited "
                                               "call 0: run the same tandem build on every member");
  EXPECT_EQ(told({kMagic, 0, 99, 0}, "kind"), "[layer shards] member 1 was told call 0 (?) where it awaited call 0: run "
                                              "the same tandem build on every member");
  // A tensor of 2^16 x 2^16 floats (2^28 at most), and one of rank 9.
  std::vector<uint32_t> huge{kMagic, 0, 1, 0, 1, 0, 0, 0, 0, 1, 2, 65536, 65536};
  EXPECT_EQ(told(huge, "huge"), "[layer shards] a tensor of [65536, 65536] told");
  EXPECT_EQ(told({kMagic, 0, 1, 0, 1, 0, 0, 0, 0, 1, 9}, "rank"), "[layer shards] a tensor of rank 9 told");
}

// A FixedGroup whose member goes forms again once it comes back (a new session, generation 2),
// and never takes a member's announcement from before its last session.
TEST(FixedGroup, FormsAgainWhenAMemberComesBackAndNotBefore) {
  StoreDir dir;
  auto options = [&](int rank, int form_ms) {
    FixedGroupOptions o;
    o.dir = dir.path;
    o.name = "set";
    o.rank = rank;
    o.size = 2;
    o.form_timeout = std::chrono::milliseconds(form_ms);
    o.timeout = std::chrono::seconds(20);
    return o;
  };
  FixedGroup lead(options(0, 20000));
  {
    auto other = std::make_unique<FixedGroup>(options(1, 20000));
    on_members(2, [&](int r) { r == 0 ? lead.form() : other->form(); });
    EXPECT_EQ(lead.generation(), 1u);
    std::vector<float> v{1.0f, 2.0f};
    on_members(2, [&](int r) {
      std::vector<float> mine = v;
      r == 0 ? lead.all_sum(mine) : other->all_sum(mine);
      EXPECT_EQ(mine, (std::vector<float>{2.0f, 4.0f}));
    });
  }  // member 1 gone: its connections closed
  std::vector<float> v{1.0f};
  EXPECT_THROW(lead.all_sum(v), GroupLost);
  EXPECT_FALSE(lead.formed());
  // Its old announcement is the last session's: member 0 waits for a new one.
  FixedGroup impatient(options(0, 300));
  EXPECT_EQ(error_of([&] { impatient.form(); }),
            cat("[layer-shard group] member 1 of 2 did not (re)start within 0.3 s (it announces itself in ", dir.path,
                "/set.member1)"));
  FixedGroup back(options(1, 20000));
  on_members(2, [&](int r) { r == 0 ? lead.form() : back.form(); });
  EXPECT_GE(lead.generation(), 2u);
  EXPECT_EQ(back.generation(), lead.generation());
  on_members(2, [&](int r) {
    std::vector<float> mine{3.0f};
    r == 0 ? lead.barrier() : back.barrier();
    r == 0 ? lead.all_sum(mine) : back.all_sum(mine);
    EXPECT_EQ(mine[0], 6.0f);
  });
}

// NCCL behind Group: where this build has it and a GPU is present, a group of one sums and
// broadcasts through the device; on a machine without a GPU it says so; a build without
// NCCL says what it needs.
TEST(Nccl, AGroupOnTheGpuOrWhatIsMissing) {
  StoreDir dir;
  NcclOptions o;
  o.store_dir = dir.path;
  o.prefix = "nccl";
  o.timeout = std::chrono::seconds(20);
  std::unique_ptr<NcclGroup> group;
  if (nccl_built()) {  // NCCL's sockets keep to a private interface of this machine, as Gloo's
    NcclOptions bad = o;
    bad.address = "8.8.8.8";
    EXPECT_EQ(error_of([&] { make_nccl_group(0, 1, bad); }),
              "[nccl group] '8.8.8.8' is not a private address, and NCCL's sockets are neither encrypted nor "
              "authenticated: use a private interface, or allow a public one only behind a VPN or a private interconnect");
    bad.address = "10.255.255.254";
    EXPECT_EQ(error_of([&] { make_nccl_group(0, 1, bad); }),
              "[nccl group] no interface of this machine holds '10.255.255.254'");
    o.address = "127.0.0.1";
  }
  const std::string error = error_of([&] { group = make_nccl_group(0, 1, o); });
  if (!nccl_built()) {
    EXPECT_EQ(error, "[nccl group] this build of tandem has no NCCL: build it where the CUDA toolkit (nvcc) and NCCL are found");
    GTEST_SKIP() << "this build has no NCCL (no CUDA toolkit with NCCL was found)";
  }
  if (!group) {
    EXPECT_EQ(error, "[nccl group 'nccl' (member 0 of 1)] this machine has no usable CUDA device (a GPU and its driver): "
                     "NCCL's group needs one a member; use Gloo's on CPUs");
    GTEST_SKIP() << "no GPU here: NCCL's module loaded and refused, as it should; the sums run on the GPU machine";
  }
  std::vector<float> v{1.0f, -2.0f, 3.5f};
  group->all_sum(v);
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.0f, 3.5f}));
  group->broadcast(v, 0);
  group->barrier();
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.0f, 3.5f}));
  EXPECT_EQ(group->stats().collectives, 3u);
  EXPECT_EQ(error_of([&] { group->broadcast(v, 1); }), "[nccl group 'nccl' (member 0 of 1)] broadcast from member 1 of a group of 1");
}

TEST(Replicas, BadGroupsAndModesAreRefused) {
  StoreDir dir;
  GlooOptions o = gloo_options(dir.path, "bad");
  o.address = "8.8.8.8";
  EXPECT_EQ(error_of([&] { make_gloo_group(0, 1, o); }),
            "[replica group 'bad' (member 0 of 1)] '8.8.8.8' is not a private address, and Gloo's TCP transport is "
            "neither encrypted nor authenticated: bind the replicas to a private interface (loopback, 10/8, "
            "172.16/12, 192.168/16, 169.254/16, fc00::/7, fe80::/10), or allow a public one only behind a VPN or a private interconnect");
  EXPECT_EQ(error_of([&] { make_gloo_group(2, 2, gloo_options(dir.path, "x")); }),
            "[replica group] member 2 of a group of 2");
  EXPECT_EQ(error_of([&] { make_gloo_group(0, 1, gloo_options("", "x")); }),
            "[replica group 'x' (member 0 of 1)] no rendezvous folder: name one every member can reach");
  for (const char* a : {"127.0.0.1", "10.1.2.3", "172.31.0.1", "192.168.9.9", "169.254.1.1", "::1", "fd00::5",
                        "fe80::1", "localhost"})
    EXPECT_TRUE(private_address(a)) << a;
  for (const char* a : {"8.8.8.8", "172.32.0.1", "11.0.0.1", "2001:db8::1", "example.org", ""})
    EXPECT_FALSE(private_address(a)) << a;
  EXPECT_EQ(error_of([] { replica_mode("ring"); }),
            "[replicas] 'ring' is no way to keep replicas in step: choose sync (gradients all-summed every step) or "
            "local-sgd (weights averaged every average-every updates)");
  // A group of one is a group: its all-sum leaves the values.
  auto alone = make_gloo_group(0, 1, gloo_options(dir.path, "one"));
  std::vector<float> v{3.0f};
  alone->all_sum(v);
  EXPECT_EQ(v[0], 3.0f);
  // The asynchronous schedule's stash is refused by name.
  const Graph graph = Graph::build(parse_model_json(kSmallSplitSpec));
  Replica r(graph, kSgd);
  ReplicaSync sync(r.stage, *alone, {});
  r.stage.stash_weights();
  EXPECT_EQ(error_of([&] { r.stage.step(); }),
            "[stage] split-test has replicas and stashes weights: the asynchronous schedule's updates would count the "
            "next step's samples; run replicas under a synchronous schedule");
}

}  // namespace
}  // namespace tandem::test
