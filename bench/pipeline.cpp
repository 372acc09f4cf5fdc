// bench/pipeline: tandem's in-process pipeline of N stages (pipeline/local_pipeline.h), a
// thread a stage, one kernel thread each, on random images and labels: the spec cut at
// --cuts, K micro-batches a step under --schedule, SGD with momentum. Prints one JSON line:
// samples/s over the timed steps, their median step time and the measured bubble (the share
// of stage-time spent waiting on a link). bench/pipeline_vs_pytorch.sh runs it beside a
// PyTorch pipeline of the same stages over torch.distributed (bench/pytorch_pipeline.py).
// usage: bench_pipeline SPEC --cuts A,B,C [--schedule 1f1b] [--backend NAME] [--batch N]
//                       [--microbatches K] [--steps S] [--warmup W]
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

int main(int argc, char** argv) try {
  using namespace tandem;
  using bench::option;
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_pipeline SPEC --cuts A,B,C [--schedule 1f1b] [--backend NAME] [--batch N] "
                         "[--microbatches K] [--steps S] [--warmup W]\n");
    return 2;
  }
  const ModelSpec spec = load_model_spec(argv[1]);
  const Graph whole = Graph::build(spec);
  const std::vector<Graph> graphs = whole.partition(cut_list(option(argc, argv, "cuts", whole.default_cut())));
  const std::string schedule = option(argc, argv, "schedule", "1f1b");
  const std::string backend_name = option(argc, argv, "backend", preferred_backend("xnnpack"));
  const int64_t batch = std::atoll(option(argc, argv, "batch", "64").c_str());
  const int microbatches = std::atoi(option(argc, argv, "microbatches", "4").c_str());
  const int steps = std::max(1, std::atoi(option(argc, argv, "steps", "20").c_str()));
  const int warmup = std::max(1, std::atoi(option(argc, argv, "warmup", "3").c_str()));

  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Network>> nets;
  std::vector<std::unique_ptr<Optimizer>> opts;
  std::vector<Network*> stages;
  std::vector<Optimizer*> optimizers;
  for (const Graph& g : graphs) {
    backends.push_back(make_backend(backend_name, BackendOptions{1}));
    nets.push_back(std::make_unique<Network>(g, *backends.back(), 1));
    opts.push_back(std::make_unique<Sgd>(nets.back()->params(), OptimizerOptions{.lr = 0.01f, .momentum = 0.9f}));
    stages.push_back(nets.back().get());
    optimizers.push_back(opts.back().get());
  }
  LocalPipeline pipeline(stages, optimizers, {.schedule = schedule, .threads = true});
  Rng rng(7);
  std::vector<Tensor> inputs;
  for (const GraphInput& in : whole.inputs()) inputs.push_back(bench::random(in.shape.batched(batch), rng));
  std::vector<int32_t> labels(static_cast<std::size_t>(batch));
  for (int32_t& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(whole.classes())));

  for (int i = 0; i < warmup; ++i) pipeline.train_step(inputs, labels.data(), microbatches);
  const StageTimes before = pipeline.times();
  std::vector<double> times;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto s0 = std::chrono::steady_clock::now();
    pipeline.train_step(inputs, labels.data(), microbatches);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const StageTimes& after = pipeline.times();
  double busy = 0;
  for (std::size_t s = 0; s < stages.size(); ++s) busy += after.busy_s[s] - before.busy_s[s];
  const double wall = after.wall_s - before.wall_s;
  const double bubble = 1.0 - busy / (static_cast<double>(stages.size()) * wall);
  std::string stage_busy;
  for (std::size_t s = 0; s < stages.size(); ++s)
    stage_busy += cat(s ? "," : "", (after.busy_s[s] - before.busy_s[s]) / steps);
  std::nth_element(times.begin(), times.begin() + steps / 2, times.end());
  std::printf("{\"runner\":\"tandem-pipeline\",\"model\":\"%s\",\"stages\":%zu,\"schedule\":\"%s\",\"backend\":\"%s\","
              "\"batch\":%lld,\"microbatches\":%d,\"steps\":%d,\"samples_per_s\":%.1f,\"median_step_s\":%.4f,"
              "\"bubble\":%.3f,\"stage_busy_s\":[%s]}\n",
              spec.name.c_str(), stages.size(), schedule.c_str(), backend_name.c_str(), static_cast<long long>(batch),
              microbatches, steps, static_cast<double>(batch) * steps / seconds, times[static_cast<std::size_t>(steps / 2)],
              bubble, stage_busy.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
  return 1;
}
