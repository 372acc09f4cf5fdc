#include "tools/plan_command.h"

#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/graph.h"
#include "core/microbatch.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/planner.h"
#include "core/profiler.h"
#include "core/wire/tensor_codec.h"
#include "tools/all_backends.h"

namespace tandem {
namespace {

constexpr int64_t kFramingBytes = 256;  // a Forward's or Backward's fields around the tensor

struct ShardCost {
  double forward_s = 0, backward_s = 0;
};

// Forward FLOPs per sample of a node (convolutions and linear layers; the rest is memory-bound
// and left out), from its spec and its input's per-sample shape.
double forward_flops(const GraphNode& node, const Shape& in) {
  if (node.spec.op == "conv2d") {
    const auto& c = node.spec.conv2d;
    return 2.0 * static_cast<double>(node.shape[0] * node.shape[1] * node.shape[2]) *
           static_cast<double>(c.kernel[0] * c.kernel[1] * in[in.rank() - 1]);
  }
  if (node.spec.op == "linear") return 2.0 * static_cast<double>(in.numel() * node.spec.linear.out_features);
  return 0.0;
}

// A shard's cost for `m` samples from FLOPs at `gflops`: backward twice the forward, except
// that layers reading the graph input need no input gradient unless `input_grad`.
ShardCost estimate(const Graph& g, int64_t m, double gflops, bool input_grad) {
  ShardCost c;
  for (const GraphNode& n : g.nodes()) {
    const int s = n.sources.at(0);
    const Shape in = s >= 0 ? g.inputs()[static_cast<std::size_t>(s)].shape : g.nodes()[static_cast<std::size_t>(-s - 1)].shape;
    const double f = forward_flops(n, in) * static_cast<double>(m) / (gflops * 1e9);
    c.forward_s += f;
    c.backward_s += (s >= 0 && !input_grad) ? f : 2.0 * f;
  }
  return c;
}

ShardCost measure(const Graph& g, Backend& backend, int64_t m, int iterations, bool input_grad) {
  Network net(g, backend, 1);
  ShardCost c;
  for (const LayerProfile& l : profile_layers(net, m, iterations, 1, input_grad)) {
    c.forward_s += l.forward_s;
    c.backward_s += l.backward_s;
  }
  return c;
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1) fail("cli", cat("--microbatches expects a list like 1,2,4,8, got '", text, "'"));
    out.push_back(static_cast<int>(v));
  }
  return out;
}

}  // namespace

int plan_command(const CliArgs& args) {
  args.reject_unknown({"model", "batch", "uplink-mbps", "downlink-mbps", "edge-gflops", "cloud-gflops", "profile-edge",
                       "edge-memory-mb", "wire-dtype", "edge-backend", "cloud-backend", "microbatches", "iterations",
                       "cut"});
  const ModelSpec spec = load_model_spec(args.required("model"));
  const Graph graph = Graph::build(spec);
  const int64_t batch = args.integer("batch", 64, 1);
  const double up_mbps = args.number("uplink-mbps", 0.0), down_mbps = args.number("downlink-mbps", up_mbps);
  if (!(up_mbps > 0.0) || !(down_mbps > 0.0)) fail("cli", "--uplink-mbps (and --downlink-mbps, default the same) must be > 0");
  const double edge_gflops = args.number("edge-gflops", 0.0), cloud_gflops = args.number("cloud-gflops", 0.0);
  if (edge_gflops > 0.0 && args.has("profile-edge")) fail("cli", "give --edge-gflops or --profile-edge, not both");
  const double memory_mb = args.number("edge-memory-mb", 0.0);
  const std::string dtype_text = args.str("wire-dtype", "f32");
  const auto dtype = parse_dtype(dtype_text);
  if (!dtype) fail("cli", cat("--wire-dtype: unknown dtype '", dtype_text, "' (known: f32, f16, bf16, i8)"));
  const int iterations = static_cast<int>(args.integer("iterations", 5, 1));
  const std::vector<int> ks = parse_list(args.str("microbatches", "1,2,4,8,16"));
  auto edge_backend = make_backend(args.str("edge-backend", preferred_backend("xnnpack")));
  auto cloud_backend = make_backend(args.str("cloud-backend", preferred_backend("onednn")));

  std::vector<std::string> cuts;
  if (args.has("cut")) {
    cuts.push_back(args.str("cut", ""));
  } else {
    for (const GraphNode& n : graph.nodes()) {
      if (n.spec.name == graph.nodes()[static_cast<std::size_t>(graph.output())].spec.name) continue;
      try {
        (void)graph.split(n.spec.name);
        cuts.push_back(n.spec.name);
      } catch (const Error&) {  // crossed by more than one tensor: not a legal cut
      }
    }
  }
  std::fprintf(stderr, "planning %zu cuts x %zu micro-batch counts; edge compute %s, cloud compute %s\n", cuts.size(),
               ks.size(), edge_gflops > 0 ? cat(edge_gflops, " GFLOP/s (given)").c_str() : "measured here",
               cloud_gflops > 0 ? cat(cloud_gflops, " GFLOP/s (given)").c_str() : "measured here");

  std::vector<PlanRow> rows;
  for (const std::string& cut : cuts) {
    auto [front, back] = graph.split(cut);
    const Shape& act = front.nodes()[static_cast<std::size_t>(front.output())].shape;
    std::map<int64_t, std::pair<ShardCost, ShardCost>> at;  // micro-batch size -> (edge, cloud)
    auto cost = [&](int64_t m) -> const std::pair<ShardCost, ShardCost>& {
      auto it = at.find(m);
      if (it != at.end()) return it->second;
      const ShardCost e = edge_gflops > 0 ? estimate(front, m, edge_gflops, false)
                                          : measure(front, *edge_backend, m, iterations, false);
      const ShardCost c = cloud_gflops > 0 ? estimate(back, m, cloud_gflops, true)
                                           : measure(back, *cloud_backend, m, iterations, true);
      return at.emplace(m, std::pair{e, c}).first->second;
    };
    // Edge memory: parameters with their gradients and momentum, every front tensor of the
    // whole batch (K slots of B / K samples) and as much again in gradient buffers.
    int64_t param_floats = 0, act_floats = 0;
    Network probe(front, *edge_backend, 1);
    param_floats = probe.param_count();
    for (const GraphNode& n : front.nodes()) act_floats += n.shape.numel();
    for (const auto& in : front.inputs()) act_floats += in.shape.numel();
    const double peak_mb = (3.0 * static_cast<double>(param_floats) + 2.0 * static_cast<double>(act_floats * batch)) *
                           4.0 / (1 << 20);
    for (int k : ks) {
      if (k > batch) continue;
      std::vector<MicrobatchCost> mbs;
      PlanRow row;
      row.cut = cut;
      row.microbatches = k;
      for (int i = 0; i < k; ++i) {
        const int64_t m = microbatch_range(batch, k, i).count;
        const auto& [e, c] = cost(m);
        const auto bytes_up = static_cast<int64_t>(encoded_bytes(*dtype, m * act.numel())) + 4 * m + kFramingBytes;
        const auto bytes_down = static_cast<int64_t>(encoded_bytes(*dtype, m * act.numel())) + kFramingBytes;
        MicrobatchCost mc{e.forward_s, e.backward_s, c.forward_s + c.backward_s,
                          static_cast<double>(bytes_up) * 8.0 / (up_mbps * 1e6),
                          static_cast<double>(bytes_down) * 8.0 / (down_mbps * 1e6)};
        mbs.push_back(mc);
        row.edge_s += mc.edge_forward_s + mc.edge_backward_s;
        row.cloud_s += mc.cloud_s;
        row.up_s += mc.up_s;
        row.down_s += mc.down_s;
        row.bytes_up_per_step += bytes_up;
      }
      row.step_s = simulate_step(mbs);
      row.samples_per_s = static_cast<double>(batch) / row.step_s;
      row.edge_peak_mb = peak_mb;
      row.fits = memory_mb <= 0.0 || peak_mb <= memory_mb;
      rows.push_back(row);
    }
  }

  std::printf("batch %lld, uplink %.1f Mbit/s, downlink %.1f Mbit/s, %s on the wire; times per step in ms\n",
              static_cast<long long>(batch), up_mbps, down_mbps, dtype_name(*dtype));
  std::printf("%-12s %3s %9s %9s %9s %9s %10s %12s %10s\n", "cut", "K", "edge", "uplink", "cloud", "downlink", "step",
              "samples/s", "edge MiB");
  for (const PlanRow& r : rows)
    std::printf("%-12s %3d %9.2f %9.2f %9.2f %9.2f %10.2f %12.1f %10.1f%s\n", r.cut.c_str(), r.microbatches,
                r.edge_s * 1e3, r.up_s * 1e3, r.cloud_s * 1e3, r.down_s * 1e3, r.step_s * 1e3, r.samples_per_s,
                r.edge_peak_mb, r.fits ? "" : "  (over --edge-memory-mb)");
  for (const PlanRow& r : rows)
    std::printf("{\"plan\":\"%s\",\"cut\":\"%s\",\"microbatches\":%d,\"predicted_step_s\":%.6f,\"predicted_samples_per_s\":%.1f,"
                "\"edge_peak_mb\":%.1f,\"fits\":%s}\n",
                spec.name.c_str(), r.cut.c_str(), r.microbatches, r.step_s, r.samples_per_s, r.edge_peak_mb,
                r.fits ? "true" : "false");
  const PlanRow& best = recommend(rows);
  std::printf("recommended: cut=%s microbatches=%d predicted_samples_per_s=%.1f\n", best.cut.c_str(), best.microbatches,
              best.samples_per_s);
  return 0;
}

}  // namespace tandem
