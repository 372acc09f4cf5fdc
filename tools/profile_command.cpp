#include "tools/profile_command.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>

#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/profiler.h"
#include "tools/cli_setup.h"

namespace tandem {
namespace {

struct ShardTotals {
  double forward_s = 0.0, backward_s = 0.0;
};

// The node column fits the longest name (Hugging Face-style names run to 50 characters).
int node_width(std::initializer_list<const Graph*> graphs) {
  std::size_t w = 14;
  for (const Graph* g : graphs)
    for (const GraphNode& n : g->nodes()) w = std::max(w, n.spec.name.size());
  return static_cast<int>(w);
}

ShardTotals print_shard(const char* side, const std::string& backend, const std::vector<LayerProfile>& layers,
                        int64_t batch, int width) {
  ShardTotals t;
  for (const LayerProfile& l : layers) {
    std::printf("%-6s %-10s %-*s %-18s %10.3f %10.3f %12.1f %9.2f %9.2f\n", side, backend.c_str(), width, l.node.c_str(),
                l.op.c_str(), l.forward_s * 1e3, l.backward_s * 1e3,
                static_cast<double>(l.output_bytes_per_sample) / 1024.0, l.forward_gflops(batch),
                l.backward_gflops(batch));
    t.forward_s += l.forward_s;
    t.backward_s += l.backward_s;
  }
  const double per_sample_us = (t.forward_s + t.backward_s) / static_cast<double>(batch) * 1e6;
  std::printf("%-6s %-10s %-*s %-18s %10.3f %10.3f   (%.1f us/sample)\n", side, backend.c_str(), width, "total", "",
              t.forward_s * 1e3, t.backward_s * 1e3, per_sample_us);
  return t;
}

int profile_command(const CliArgs& args) {
  const SplitModel model = load_split_model(args);
  const ModelSpec& spec = model.spec;
  const std::string& cut = model.cut;
  const Graph& front_graph = model.front;
  const int64_t batch = args.integer("batch", 16, 1);
  const int iterations = static_cast<int>(args.integer("iterations", 20, 1));
  const ShardBackends backends = shard_backends(args);
  const std::string &edge_name = backends.edge_name, &cloud_name = backends.cloud_name;
  Network front(model.front, *backends.edge, 1), back(model.back, *backends.cloud, 1);

  std::printf("model %s, cut at '%s', micro-batch %lld, median of %d iterations\n", spec.name.c_str(), cut.c_str(),
              static_cast<long long>(batch), iterations);
  const int width = node_width({&model.front, &model.back, &model.tail});
  std::printf("%-6s %-10s %-*s %-18s %10s %10s %12s %9s %9s\n", "shard", "backend", width, "node", "op", "fwd ms",
              "bwd ms", "out KiB/smp", "fwd GF/s", "bwd GF/s");
  const ShardTotals f = print_shard("front", edge_name, profile_layers(front, batch, iterations), batch, width);
  const ShardTotals b = print_shard(model.u_shaped ? "middle" : "back", cloud_name,
                                    profile_layers(back, batch, iterations, 3, /*input_grad=*/true), batch, width);
  if (model.u_shaped) {  // the edge's tail (its time is the edge's, not in the JSON line's totals)
    Network tail(model.tail, *backends.edge, 1);
    print_shard("tail", edge_name, profile_layers(tail, batch, iterations, 3, /*input_grad=*/true), batch, width);
  }
  const int64_t cut_bytes = front_graph.nodes()[static_cast<std::size_t>(front_graph.output())].shape.numel() * 4;
  std::printf("cut activation: %lld bytes/sample each way\n", static_cast<long long>(cut_bytes));
  if (model.back.inputs().size() > 1)  // the cloud's shard reads the mask: it goes up too, a byte a token
    std::printf("mask: %lld bytes/sample up with the activations\n",
                static_cast<long long>(model.back.inputs()[1].shape.numel()));
  std::printf("{\"profile\":\"%s\",\"cut\":\"%s\",\"microbatch\":%lld,\"front_forward_s\":%.6f,\"front_backward_s\":%.6f,"
              "\"back_forward_s\":%.6f,\"back_backward_s\":%.6f,\"cut_bytes_per_sample\":%lld}\n",
              spec.name.c_str(), cut.c_str(), static_cast<long long>(batch), f.forward_s, f.backward_s, b.forward_s,
              b.backward_s, static_cast<long long>(cut_bytes));
  return 0;
}

}  // namespace

void declare_profile(Command& profile) {
  profile.option("model", "SPEC", "the model spec, JSON (required)")
      .option("cut", "NODE", "where the model splits (default: the spec's cut)")
      .option("edge-backend", "NAME", "the front shard's backend (default xnnpack)")
      .option("cloud-backend", "NAME", "the back shard's backend (default onednn)")
      .option("batch", "B", "micro-batch size, random samples (default 16)")
      .option("iterations", "N", "timing runs; the median is printed (default 20)")
      .option("threads", "T", "kernel threads (default 1)")
      .details("Prints a table of every layer's forward and backward time and a JSON line.")
      .run(profile_command);
}

}  // namespace tandem
