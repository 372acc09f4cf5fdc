// A replica process for the replica tests (replica_tests.cpp): trains the small CNN as one
// member of a replica set (collective/membership.h, pipeline/replicas.h) until the set has
// taken --steps updates, step s on rows [16 s + 4 j, 16 s + 4 j + 4) of a seeded data set for
// replica "rJ", pacing each step to at least --step-ms; appends "STEP EPOCH SAMPLES ID..." after
// each update (the epoch's members) to --log, and writes its final weights to --out.
// usage: tandem_replica_child --id rJ --store DIR --initial N --steps S --step-ms MS --log F --out F
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "collective/membership.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/optimizer.h"
#include "pipeline/replicas.h"
#include "pipeline/stage.h"
#include "test_support.h"

int main(int argc, char** argv) try {
  using namespace tandem;
  auto arg = [&](const std::string& name) -> std::string {
    for (int i = 1; i + 1 < argc; ++i)
      if (argv[i] == "--" + name) return argv[i + 1];
    fail("replica child", cat("--", name, " is missing"));
  };
  const std::string id = arg("id");
  const int slot = std::atoi(id.c_str() + 1);
  const int steps = std::atoi(arg("steps").c_str());
  const auto pace = std::chrono::milliseconds(std::atoi(arg("step-ms").c_str()));
  const Graph graph = Graph::build(parse_model_json(test::kSmallSplitSpec));
  const test::QuadrantData data = test::quadrant_data(16 * steps, 8);
  auto backend = make_backend("reference", BackendOptions{1});
  Network net(graph, *backend, 11);
  auto opt = make_optimizer(net.params(), {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f});
  Stage stage(net, opt.get());
  MembershipOptions o;
  o.gloo.store_dir = arg("store");
  o.gloo.prefix = "set";
  o.gloo.timeout = std::chrono::milliseconds(5000);
  o.id = id;
  o.initial = static_cast<uint32_t>(std::atoi(arg("initial").c_str()));
  o.settle = std::chrono::milliseconds(500);
  Membership membership(o);
  ReplicaSync sync(stage, membership, {});
  sync.copy_from(0);
  std::ofstream log(arg("log"), std::ios::app);
  while (opt->steps() < steps) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t s = opt->steps(), from = 16 * s + 4 * slot;
    stage.zero_grad();
    for (int64_t mb = 0; mb < 4; mb += 2) {
      const Tensor rows = data.images.slice_batch(from + mb, 2);
      stage.train_loss(std::span<const Tensor>(&rows, 1), static_cast<int>(mb / 2), data.labels.data() + from + mb,
                       0.25f, false);
    }
    stage.step();
    // The members whose samples this update averaged: the epoch's before a join it let in.
    std::string line = cat(s, " ", membership.epoch(), " ", sync.last_step_samples());
    for (const std::string& m : sync.last_step_members()) {
      line += ' ';
      line.append(m, 0, m.find('#'));
    }
    log << line << std::endl;
    std::this_thread::sleep_until(t0 + pace);
  }
  std::ofstream out(arg("out"), std::ios::binary);
  for (Param* p : net.params()) out.write(reinterpret_cast<const char*>(p->value().data()), p->value().bytes());
  return out ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tandem_replica_child: %s\n", e.what());
  return 1;
}
