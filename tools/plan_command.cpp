#include "tools/plan_command.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/planner.h"
#include "core/profiler.h"
#include "core/wire/tensor_codec.h"
#include "backends/registry.h"
#include "pipeline/partitioner.h"
#include "tools/cli_setup.h"

namespace tandem {
namespace {

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

// A nodes file: one TOML section a machine, in the order the data flows through them,
// with gflops (or speed: times this machine's, measured with --profile), memory_mb and
// link_mbps (to the next machine). Errors name the file, the section and the key.
std::vector<PipelineNode> read_nodes(const std::string& path, std::optional<double> here_gflops) {
  std::ifstream in(path);
  if (!in) fail("cli", cat("cannot read the nodes file ", path, " (--nodes)"));
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_config(in);
  } catch (const CLI::Error& e) {
    fail("cli", cat(path, ": ", e.what()));
  }
  std::vector<PipelineNode> nodes;
  std::map<std::string, std::size_t> at;
  std::map<std::size_t, double> speeds;
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // CLI11's marks of a section's start and end
    if (item.parents.size() != 1)
      fail("cli", cat(path, ": '", item.fullname(), "' is not inside a machine's [section]: write [NAME] first"));
    const std::string& machine = item.parents[0];
    if (!at.count(machine)) {
      at[machine] = nodes.size();
      nodes.push_back({machine});
    }
    PipelineNode& node = nodes[at[machine]];
    if (item.inputs.size() != 1) fail("cli", cat(path, ": [", machine, "] ", item.name, " takes one number"));
    char* end = nullptr;
    const double v = std::strtod(item.inputs[0].c_str(), &end);
    if (item.inputs[0].empty() || *end != '\0')
      fail("cli", cat(path, ": [", machine, "] ", item.name, " = '", item.inputs[0], "' is not a number"));
    if (item.name == "gflops")
      node.gflops = v;
    else if (item.name == "speed")
      speeds[at[machine]] = v;
    else if (item.name == "memory_mb")
      node.memory_mb = v;
    else if (item.name == "link_mbps")
      node.link_mbps = v;
    else
      fail("cli", cat(path, ": [", machine, "] has an unknown key '", item.name,
                      "' (known: gflops, speed, memory_mb, link_mbps)"));
  }
  if (nodes.empty()) fail("cli", cat(path, ": no machines; write a [NAME] section a machine with gflops = ..."));
  for (const auto& [i, speed] : speeds) {
    if (!here_gflops)
      fail("cli", cat(path, ": [", nodes[i].name, "] speed = ", speed, " is relative to this machine: add --profile to "
                      "measure it, or give gflops"));
    if (nodes[i].gflops > 0) fail("cli", cat(path, ": [", nodes[i].name, "] gives both gflops and speed: one of them"));
    nodes[i].gflops = speed * *here_gflops;
  }
  return nodes;
}

// tandem plan --nodes FILE: the cuts and K for a pipeline over the file's machines.
int plan_nodes(const CliArgs& args) {
  const ModelSpec spec = load_model_spec(args.required("model"));
  const Graph graph = Graph::build(spec);
  const std::string nodes_path = args.str("nodes", "");
  PartitionOptions po;
  po.batch = args.integer("batch", 64, 1);
  po.microbatches = parse_list(args.str("microbatches", "1,2,4,8,16"));
  po.schedule = args.str("pipeline-schedule", "1f1b");
  // With --profile the whole model is measured here, node by node, on the backend (one
  // thread, a micro-batch of batch / 4); else only its shape is needed.
  const bool profile = args.has("profile");
  const std::string backend_name = profile ? args.str("backend", preferred_backend("onednn")) : "reference";
  auto backend = make_backend(backend_name, BackendOptions{1});
  Network whole(graph, *backend, 1);
  whole.set_input_gradient(false);
  std::optional<double> here;
  if (profile) {
    const int64_t m = std::max<int64_t>(1, po.batch / 4);
    double flops = 0, seconds = 0;
    for (const LayerProfile& l : profile_layers(whole, m, static_cast<int>(args.integer("iterations", 5, 1)))) {
      po.measured_forward_s.push_back(l.forward_s / static_cast<double>(m));
      po.measured_backward_s.push_back(l.backward_s / static_cast<double>(m));
      flops += (l.cost.forward_flops + l.cost.backward_flops()) * static_cast<double>(m);
      seconds += l.forward_s + l.backward_s;
    }
    here = flops / seconds / 1e9;
    po.measured_gflops = *here;
    std::fprintf(stderr, "measured here on %s (one thread, micro-batches of %lld): %.2f GFLOP/s over the model\n",
                 backend_name.c_str(), static_cast<long long>(m), *here);
  }
  const std::vector<PipelineNode> nodes = read_nodes(nodes_path, here);
  const std::vector<PipelinePlan> plans = args.has("cut") ? std::vector<PipelinePlan>{predict_pipeline(
                                                                whole, nodes, cut_list(graph.cut_nodes(args.str("cut", ""))),
                                                                static_cast<int>(po.microbatches.front()), po)}
                                                          : plan_pipeline(whole, nodes, po);
  if (plans.empty()) fail("cli", cat("no --microbatches value is within 1 and --batch ", po.batch, ": nothing to weigh"));
  const PipelinePlan& best = plans.front();
  std::printf("%zu machines from %s, batch %lld, %s schedule; %zu plans weighed; the best %d:\n", nodes.size(),
              nodes_path.c_str(), static_cast<long long>(po.batch), po.schedule.c_str(), plans.size(),
              static_cast<int>(std::min<std::size_t>(plans.size(), 5)));
  for (std::size_t i = 0; i < plans.size() && i < 5; ++i) {
    std::string cuts;
    for (const std::string& c : plans[i].cuts) cuts += (cuts.empty() ? "" : ",") + c;
    std::printf("  cut=%s microbatches=%d predicted_step_ms=%.2f samples/s=%.1f bubble=%.1f%%%s\n",
                cuts.empty() ? "(none)" : cuts.c_str(), plans[i].microbatches, plans[i].step_s * 1e3,
                plans[i].samples_per_s, 100 * plans[i].bubble, plans[i].fits ? "" : "  (does not fit)");
  }
  std::printf("%-14s %-12s %-12s %10s %10s %10s %10s\n", "machine", "first", "last", "fwd ms", "bwd ms", "link ms",
              "MiB");
  for (const PlannedStage& s : best.stages)
    std::printf("%-14s %-12s %-12s %10.2f %10.2f %10.2f %10.1f%s\n", s.node.c_str(), s.first.c_str(), s.last.c_str(),
                s.forward_s * 1e3, s.backward_s * 1e3, s.link_s * 1e3, s.memory_mb, s.fits ? "" : "  (over its memory)");
  auto joined = [](const std::vector<std::string>& list) {
    std::string out;
    for (const std::string& c : list) out += (out.empty() ? "" : ",") + c;
    return out;
  };
  if (args.has("all"))
    for (const PipelinePlan& p : plans)
      std::printf("{\"candidate\":\"%s\",\"microbatches\":%d,\"predicted_step_s\":%.6f,\"fits\":%s}\n",
                  joined(p.cuts).c_str(), p.microbatches, p.step_s, p.fits ? "true" : "false");
  const std::string cuts = joined(best.cuts);
  if (!best.fits) fail("plan", "no plan fits every machine's memory: add a machine, raise memory_mb or lower --batch");
  std::printf("{\"plan\":\"%s\",\"machines\":%zu,\"cut\":\"%s\",\"microbatches\":%d,\"predicted_step_s\":%.6f,"
              "\"predicted_samples_per_s\":%.1f,\"predicted_bubble\":%.4f}\n",
              spec.name.c_str(), nodes.size(), cuts.c_str(), best.microbatches, best.step_s, best.samples_per_s,
              best.bubble);
  std::printf("recommended: cut=%s microbatches=%d predicted_samples_per_s=%.1f\n", cuts.c_str(), best.microbatches,
              best.samples_per_s);
  return 0;
}

int plan_command(const CliArgs& args) {
  if (args.has("nodes")) return plan_nodes(args);
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
  const ShardBackends backends = shard_backends(args);

  PlanOptions po;
  po.batch = batch;
  po.microbatches = ks;
  po.uplink_mbps = up_mbps;
  po.downlink_mbps = down_mbps;
  po.edge_gflops = edge_gflops;
  po.cloud_gflops = cloud_gflops;
  po.edge_memory_mb = memory_mb;
  po.dtype = *dtype;
  po.iterations = iterations;
  if (args.has("cut")) po.cuts = {graph.cut_nodes(args.str("cut", ""))};
  const std::string pipeline = args.str("pipeline", "sync");
  if (pipeline != "sync" && pipeline != "async") fail("cli", cat("--pipeline: '", pipeline, "' is neither sync nor async"));
  po.async = pipeline == "async";
  std::fprintf(stderr, "planning: edge compute %s, cloud compute %s\n",
               edge_gflops > 0 ? cat(edge_gflops, " GFLOP/s (given)").c_str() : "measured here",
               cloud_gflops > 0 ? cat(cloud_gflops, " GFLOP/s (given)").c_str() : "measured here");
  const std::vector<PlanRow> rows = plan_split(graph, po, *backends.edge, *backends.cloud);

  std::printf("batch %lld, uplink %.1f Mbit/s, downlink %.1f Mbit/s, %s on the wire, %s pipeline; times per step in ms\n",
              static_cast<long long>(batch), up_mbps, down_mbps, dtype_name(*dtype), pipeline.c_str());
  std::printf("%-12s %3s %9s %9s %9s %9s %10s %10s %7s %12s %10s\n", "cut", "K", "edge", "uplink", "cloud", "downlink",
              "step", "1st grad", "bubble", "samples/s", "edge MiB");
  for (const PlanRow& r : rows)
    std::printf("%-12s %3d %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f %6.1f%% %12.1f %10.1f%s\n", r.cut.c_str(),
                r.microbatches, r.edge_s * 1e3, r.up_s * 1e3, r.cloud_s * 1e3, r.down_s * 1e3, r.step_s * 1e3,
                r.first_grad_s * 1e3, 100.0 * r.edge_idle_s / r.step_s, r.samples_per_s, r.edge_peak_mb,
                r.fits ? "" : "  (over --edge-memory-mb)");
  for (const PlanRow& r : rows)
    std::printf("{\"plan\":\"%s\",\"pipeline\":\"%s\",\"cut\":\"%s\",\"microbatches\":%d,\"predicted_step_s\":%.6f,\"predicted_samples_per_s\":%.1f,"
                "\"predicted_first_grad_ms\":%.3f,\"predicted_edge_idle_fraction\":%.4f,\"predicted_cloud_idle_fraction\":%.4f,"
                "\"edge_peak_mb\":%.1f,\"fits\":%s}\n",
                spec.name.c_str(), pipeline.c_str(), r.cut.c_str(), r.microbatches, r.step_s, r.samples_per_s, r.first_grad_s * 1e3,
                r.edge_idle_s / r.step_s, r.cloud_idle_s / r.step_s, r.edge_peak_mb, r.fits ? "true" : "false");
  const PlanRow& best = recommend(rows);
  std::printf("recommended: cut=%s microbatches=%d predicted_samples_per_s=%.1f\n", best.cut.c_str(), best.microbatches,
              best.samples_per_s);
  return 0;
}

}  // namespace

void declare_plan(Command& plan) {
  plan.option("model", "SPEC", "the model spec, JSON (required)")
      .option("uplink-mbps", "U", "the edge's uplink, Mbit/s (required)")
      .option("downlink-mbps", "D", "the downlink, Mbit/s (default: the uplink's)")
      .option("edge-gflops", "G", "the edge's speed, GFLOP/s (default: measured here on the edge backend)")
      .flag("profile-edge", "measure the edge's speed layer by layer here")
      .option("cloud-gflops", "G", "the cloud's speed, GFLOP/s (default: measured here on the cloud backend)")
      .option("edge-memory-mb", "M", "leave out plans whose edge peak memory passes M MiB")
      .option("batch", "B", "samples a step (default 64)")
      .option("microbatches", "LIST", "the micro-batch counts to weigh (default 1,2,4,8,16)")
      .option("wire-dtype", "f32|f16|bf16|i8", "the dtype on the wire (default f32)")
      .option("cut", "NODE", "weigh this cut only")
      .option("iterations", "N", "timing runs a layer when measuring (default 5)")
      .option("pipeline", "sync|async", "the edge's pipeline to predict (default sync)")
      .option("nodes", "FILE", "plan a pipeline over the machines in FILE instead (TOML: a [NAME] a machine, in data order, with gflops, memory_mb, link_mbps)")
      .option("pipeline-schedule", "gpipe|1f1b|zero-bubble", "with --nodes: the schedule to predict (default 1f1b)")
      .flag("profile", "with --nodes: measure the model here, node by node, on --backend (a machine's speed = N is N times this one)")
      .option("backend", "NAME", "with --profile: the backend to measure on (default onednn)")
      .flag("all", "with --nodes: print every plan weighed, a JSON line each")
      .option("edge-backend", "NAME", "the edge's backend to measure (default xnnpack)")
      .option("cloud-backend", "NAME", "the cloud's backend to measure (default onednn)")
      .details("For every legal cut and micro-batch count K: the predicted step time of the pipeline (edge compute,\n"
               "uplink, cloud compute, downlink overlapping over K micro-batches; with --pipeline async the next\n"
               "step's forwards overlap this one's backwards) and the edge's peak memory; then\n"
               "`recommended: cut=NODE microbatches=K predicted_samples_per_s=X`.\n"
               "With --nodes FILE, for a chain of machines: every choice of cuts (a stage a machine) and K,\n"
               "predicted from FLOPs at each machine's gflops and each link's rate through the schedule, within each\n"
               "machine's memory; `recommended: cut=A,B,... microbatches=K ...` (--cut A,B,...: predict those cuts\n"
               "at the first --microbatches).")
      .run(plan_command);
}

}  // namespace tandem
