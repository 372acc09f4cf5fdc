#include "tools/plan_command.h"

#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/planner.h"
#include "core/wire/tensor_codec.h"
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

int plan_command(const CliArgs& args) {
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
  if (args.has("cut")) po.cuts = {args.str("cut", "")};
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
      .option("edge-backend", "NAME", "the edge's backend to measure (default xnnpack)")
      .option("cloud-backend", "NAME", "the cloud's backend to measure (default onednn)")
      .details("For every legal cut and micro-batch count K: the predicted step time of the pipeline (edge compute,\n"
               "uplink, cloud compute, downlink overlapping over K micro-batches; with --pipeline async the next\n"
               "step's forwards overlap this one's backwards) and the edge's peak memory; then\n"
               "`recommended: cut=NODE microbatches=K predicted_samples_per_s=X`.")
      .run(plan_command);
}

}  // namespace tandem
