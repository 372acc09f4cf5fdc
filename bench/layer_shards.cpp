// bench/layer_shards: a stage of MLP blocks (Linear D->H, GELU, Linear H->D, then the head
// Linear D->10) trained whole in one process, or split into S layer shards
// (pipeline/layer_shards.h), this process member --rank of S, the members meeting over Gloo
// in --store DIR. Every member trains the same rows: random inputs and labels, K micro-batches
// a step, SGD with momentum. Prints one JSON line: samples/s over the timed steps (the stage's:
// the members train the same rows together), the median step, and (split) the all-sums' share
// of it and their bytes a step. bench/layer_shards_vs_one.sh runs it whole and split side by side.
// usage: bench_layer_shards [--dim D] [--hidden H] [--blocks N] [--batch B] [--microbatches K]
//                           [--steps S] [--warmup W] [--backend NAME]
//                           [--shards S --rank I --store DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "bench/bench_util.h"
#include "collective/gloo_group.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "pipeline/layer_shards.h"
#include "pipeline/stage.h"

int main(int argc, char** argv) try {
  using namespace tandem;
  using Clock = std::chrono::steady_clock;
  // (bench::option skips argv[1], a spec for the other benches; this one has none)
  const auto option = [](int argc, char** argv, const std::string& name, const std::string& fallback) {
    for (int i = 1; i + 1 < argc; ++i)
      if (argv[i] == "--" + name) return std::string(argv[i + 1]);
    return fallback;
  };
  const int64_t dim = std::atoll(option(argc, argv, "dim", "512").c_str());
  const int64_t hidden = std::atoll(option(argc, argv, "hidden", "2048").c_str());
  const int blocks = std::max(1, std::atoi(option(argc, argv, "blocks", "2").c_str()));
  const int64_t batch = std::atoll(option(argc, argv, "batch", "64").c_str());
  const int k = std::max(1, std::atoi(option(argc, argv, "microbatches", "2").c_str()));
  const int steps = std::max(1, std::atoi(option(argc, argv, "steps", "10").c_str()));
  const int warmup = std::max(1, std::atoi(option(argc, argv, "warmup", "2").c_str()));
  const std::string backend_name = option(argc, argv, "backend", preferred_backend("onednn"));
  const int shards = std::max(1, std::atoi(option(argc, argv, "shards", "1").c_str()));
  const int rank = std::atoi(option(argc, argv, "rank", "0").c_str());

  std::string nodes;
  std::string last = "x";
  for (int b = 0; b < blocks; ++b) {
    nodes += cat("{ name: \"up", b, "\", op: \"linear\", inputs: [\"", last, "\"], linear: { out_features: ", hidden,
                 " } }, { name: \"act", b, "\", op: \"gelu\", inputs: [\"up", b, "\"] }, { name: \"down", b,
                 "\", op: \"linear\", inputs: [\"act", b, "\"], linear: { out_features: ", dim, " } }, ");
    last = cat("down", b);
  }
  nodes += cat("{ name: \"head\", op: \"linear\", inputs: [\"", last, "\"], linear: { out_features: 10 } }");
  const ModelSpec whole_spec = parse_model_json(
      cat("{ name: \"mlp\", inputs: [ { name: \"x\", shape: [", dim, "] } ], nodes: [", nodes, "], output: \"head\" }"));
  const ModelSpec spec = shards > 1 ? layer_shard_spec(whole_spec, rank, shards) : whole_spec;

  auto backend = make_backend(backend_name, BackendOptions{1});
  auto reference = make_backend("reference");
  Network net(Graph::build(spec), *backend, 1);
  std::unique_ptr<Group> group;
  std::unique_ptr<GroupReducer> reducer;
  if (shards > 1) {
    Network whole(Graph::build(whole_spec), *reference, 1);
    load_layer_shard(whole, net, linear_pairs(whole_spec, shards), rank, shards);
    GlooOptions g;
    g.store_dir = option(argc, argv, "store", "");
    g.prefix = "layer-shards";
    group = make_gloo_group(rank, shards, g);
    reducer = std::make_unique<GroupReducer>(*group);
    net.set_reducer(reducer.get());
  }
  net.set_input_gradient(false);
  OptimizerOptions o;
  o.lr = 0.01f;
  o.momentum = 0.9f;
  auto optimizer = make_optimizer(net.params(), o);
  Stage stage(net, optimizer.get());
  Rng rng(7);  // the same rows on every member
  const Tensor x = bench::random(Shape{batch, dim}, rng);
  const std::vector<int32_t> labels = bench::random_labels(batch, 10, rng);
  const int64_t piece = (batch + k - 1) / k;
  auto step = [&] {
    stage.zero_grad();
    int slot = 0;
    for (int64_t at = 0; at < batch; at += piece) {
      const Tensor in = x.slice_batch(at, std::min(piece, batch - at));
      stage.train_loss(std::span<const Tensor>(&in, 1), slot++, labels.data() + at, 1.0f / static_cast<float>(batch),
                       false);
    }
    stage.step();
  };
  for (int i = 0; i < warmup; ++i) step();
  if (group) group->barrier();
  const Group::Stats before = group ? group->stats() : Group::Stats{};
  std::vector<double> times;
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto s0 = Clock::now();
    step();
    times.push_back(std::chrono::duration<double>(Clock::now() - s0).count());
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::sort(times.begin(), times.end());
  const Group::Stats after = group ? group->stats() : Group::Stats{};
  std::printf("{\"shards\":%d,\"rank\":%d,\"dim\":%lld,\"hidden\":%lld,\"blocks\":%d,\"batch\":%lld,"
              "\"samples_per_s\":%.1f,\"step_ms_median\":%.3f,\"allsum_ms_a_step\":%.3f,\"allsum_bytes_a_step\":%llu,"
              "\"params\":%lld}\n",
              shards, rank, static_cast<long long>(dim), static_cast<long long>(hidden), blocks,
              static_cast<long long>(batch), static_cast<double>(batch * steps) / wall, times[times.size() / 2] * 1e3,
              (after.seconds - before.seconds) / steps * 1e3,
              static_cast<unsigned long long>((after.bytes - before.bytes) / static_cast<uint64_t>(steps)),
              static_cast<long long>(net.param_count()));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_layer_shards: %s\n", e.what());
  return 1;
}
