// bench/back_shard: the cloud's training work alone, a back shard's steps on one backend: the
// spec's shard after a cut, random activations of the cut's shape and random labels, K
// micro-batches a step (a mask crossing the cut keeps every token), SGD with momentum (the
// cloud's default optimizer). Prints one JSON
// line: samples/s over the timed steps and their median step time. bench/gpu/back_shard.sh
// runs it beside PyTorch eager training the same layers (bench/pytorch_back_shard.py).
// --breakdown 1 first prints where a timed step's time went (JSON): the layers' forward and
// backward passes, the rest (loss, gradient zeroing, the optimizer), and the slowest nodes.
// --replicas R --rank I --store DIR: this process is replica I of R (pipeline/replicas.h), each
// on its own random activations of --batch rows a step, their gradients all-summed over Gloo
// (collective/gloo_group.h, rendezvous in DIR) before every update; the JSON line adds the
// all-sum's median time a step and its payload, and samples/s counts every replica's rows.
// --allreduce-only N: no training; N all-sums of the shard's gradient size (after a barrier
// each), their median time (bench/replicas_vs_one.sh fits its all-reduce model to it);
// --allreduce-floats F all-sums F floats instead.
// usage: bench_back_shard SPEC [--cut NODE] [--backend NAME] [--batch N] [--microbatches K]
//                        [--steps S] [--warmup W] [--threads T] [--breakdown 1]
//                        [--replicas R --rank I --store DIR [--allreduce-only N]]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "bench/bench_util.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "pipeline/local_pipeline.h"
#include "pipeline/replicas.h"
#include "collective/gloo_group.h"

int main(int argc, char** argv) try {
  using namespace tandem;
  using bench::option;
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_back_shard SPEC [--cut NODE] [--backend NAME] [--batch N] [--microbatches K] "
                         "[--steps S] [--warmup W] [--threads T]\n");
    return 2;
  }
  const ModelSpec spec = load_model_spec(argv[1]);
  const Graph whole = Graph::build(spec);
  const std::string cut = option(argc, argv, "cut", whole.default_cut());
  const std::string backend_name = option(argc, argv, "backend", preferred_backend("onednn"));
  const int64_t batch = std::atoll(option(argc, argv, "batch", "64").c_str());
  const int microbatches = std::atoi(option(argc, argv, "microbatches", "4").c_str());
  const int steps = std::max(1, std::atoi(option(argc, argv, "steps", "50").c_str()));
  const int warmup = std::max(1, std::atoi(option(argc, argv, "warmup", "5").c_str()));
  const int threads = std::max(1, std::atoi(option(argc, argv, "threads", "1").c_str()));
  const bool breakdown = option(argc, argv, "breakdown", "0") == "1";

  const int replicas = std::max(1, std::atoi(option(argc, argv, "replicas", "1").c_str()));
  const int rank = std::atoi(option(argc, argv, "rank", "0").c_str());
  const int allreduce_only = std::atoi(option(argc, argv, "allreduce-only", "0").c_str());

  const Graph back = whole.split(cut).second;
  auto backend = make_backend(backend_name, BackendOptions{threads});
  Network net(back, *backend, 1);
  Sgd sgd(net.params(), {.lr = 0.01f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false});
  LocalPipeline trainer({&net}, {&sgd});
  std::unique_ptr<Group> group;
  std::unique_ptr<ReplicaSync> sync;
  if (replicas > 1) {
    GlooOptions gloo;
    gloo.store_dir = option(argc, argv, "store", "");
    gloo.prefix = "bench";
    gloo.timeout = std::chrono::milliseconds(120000);
    group = make_gloo_group(rank, replicas, gloo);
    sync = std::make_unique<ReplicaSync>(trainer.stage(0), *group, ReplicaOptions{});
    sync->copy_from(0);
  }
  if (allreduce_only > 0) {
    if (!group) fail("bench_back_shard", "--allreduce-only needs --replicas 2 or more");
    std::size_t floats = 1;
    for (Param* p : net.params()) floats += static_cast<std::size_t>(p->value().numel());
    const std::string size = option(argc, argv, "allreduce-floats", "");
    if (!size.empty()) floats = static_cast<std::size_t>(std::max(1ll, std::atoll(size.c_str())));
    std::vector<float> buffer(floats, 1.0f);
    std::vector<double> each;
    for (int i = 0; i < allreduce_only + 2; ++i) {
      group->barrier();
      const auto a0 = std::chrono::steady_clock::now();
      group->all_sum(buffer);
      if (i >= 2) each.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a0).count());
    }
    std::nth_element(each.begin(), each.begin() + static_cast<long>(each.size() / 2), each.end());
    std::printf("{\"bench\":\"allreduce\",\"replicas\":%d,\"rank\":%d,\"bytes\":%zu,\"allreduce_ms_median\":%.3f}\n",
                replicas, rank, floats * sizeof(float), each[each.size() / 2] * 1e3);
    return 0;
  }

  Rng rng(7 + static_cast<uint64_t>(rank));
  const std::vector<Tensor> inputs = bench::back_shard_inputs(back, batch, rng);
  const std::vector<int32_t> labels = bench::random_labels(batch, back.classes(), rng);

  for (int i = 0; i < warmup; ++i) trainer.train_step(inputs, labels.data(), microbatches);
  std::vector<double> step_s, allreduce_s;
  Network::NodeTimes times;
  if (breakdown) net.set_timing(&times);
  const uint64_t bytes0 = group ? group->stats().bytes : 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto s0 = std::chrono::steady_clock::now();
    const double a0 = group ? group->stats().seconds : 0.0;
    trainer.train_step(inputs, labels.data(), microbatches);
    step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
    if (group) allreduce_s.push_back(group->stats().seconds - a0);
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (breakdown) {
    const auto& nodes = back.nodes();
    std::vector<std::size_t> order(nodes.size());
    double forward = 0.0, backward = 0.0;
    for (std::size_t n = 0; n < nodes.size(); ++n) {
      order[n] = n;
      forward += times.forward_s[n];
      backward += times.backward_s[n] + times.weights_s[n];
    }
    auto node_s = [&](std::size_t n) { return times.forward_s[n] + times.backward_s[n] + times.weights_s[n]; };
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return node_s(a) > node_s(b); });
    const double per_step = 1e3 / steps;
    std::string slowest;
    for (std::size_t i = 0; i < order.size() && i < 6; ++i)
      slowest += cat(i ? "," : "", "{\"node\":\"", nodes[order[i]].spec.name, "\",\"op\":\"", nodes[order[i]].spec.op,
                     "\",\"forward_ms\":", times.forward_s[order[i]] * per_step, ",\"backward_ms\":",
                     (times.backward_s[order[i]] + times.weights_s[order[i]]) * per_step, "}");
    std::printf("{\"bench\":\"back_shard_breakdown\",\"model\":\"%s\",\"backend\":\"%s\",\"step_ms\":%.3f,"
                "\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"rest_ms\":%.3f,\"slowest\":[%s]}\n",
                spec.name.c_str(), backend_name.c_str(), total * per_step, forward * per_step, backward * per_step,
                (total - forward - backward) * per_step, slowest.c_str());
  }
  std::nth_element(step_s.begin(), step_s.begin() + steps / 2, step_s.end());
  std::string replica_fields;
  if (group) {
    std::nth_element(allreduce_s.begin(), allreduce_s.begin() + steps / 2, allreduce_s.end());
    replica_fields = cat(",\"replicas\":", replicas, ",\"rank\":", rank, ",\"allreduce_ms_median\":",
                         fixed(allreduce_s[static_cast<std::size_t>(steps / 2)] * 1e3, 3), ",\"allreduce_bytes\":",
                         (group->stats().bytes - bytes0) / static_cast<uint64_t>(steps));
  }
  std::printf("{\"bench\":\"back_shard\",\"peer\":\"tandem\",\"model\":\"%s\",\"cut\":\"%s\",\"backend\":\"%s\","
              "\"batch\":%lld,\"microbatches\":%d,\"steps\":%d,\"samples_per_s\":%.1f,\"step_ms_median\":%.3f%s}\n",
              spec.name.c_str(), cut.c_str(), backend_name.c_str(), static_cast<long long>(batch), microbatches, steps,
              static_cast<double>(batch) * replicas * steps / total, step_s[static_cast<std::size_t>(steps / 2)] * 1e3,
              replica_fields.c_str());
  return 0;
} catch (const tandem::Error& e) {
  std::fprintf(stderr, "bench_back_shard: %s\n", e.what());
  return 1;
}
