// tandem: the engine's command line. `tandem train` trains a model spec on Fashion-MNIST in
// one process, as an in-process pipeline of the stages its cuts make (pipeline/).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "core/graph.h"
#include "core/network.h"
#include "pipeline/local_pipeline.h"
#include "data/idx_dataset.h"
#include "core/interop/hugging_face.h"
#include "core/interop/safetensors.h"
#include "core/interop/torch_layout.h"
#include "ports/files/atomic_file.h"
#include "ports/files/safetensors_file.h"
#include "ports/files/tensor_dataset.h"
#include "backends/registry.h"
#include "cli/command_line.h"
#include "tools/audit_verify.h"
#include "tools/cli_setup.h"
#include "tools/export_command.h"
#include "tools/import_command.h"
#include "tools/plan_command.h"
#include "tools/profile_command.h"
#include "tools/stage_command.h"
#include "tools/text_command.h"
#include "tools/train_data.h"
#include "cli/progress.h"

namespace tandem {
namespace {

constexpr const char* kTrainDetails = R"(
      Trains SPEC on Fashion-MNIST (Debian's dataset-fashion-mnist; or DIR/train.safetensors and
      DIR/test.safetensors, a tensor per model input and "labels") as a pipeline of stages cut
      at --cut (the spec's default cut unless given; N cuts make N + 1 stages): the first
      stage on the edge backend (default xnnpack), the others and the loss on the cloud
      backend (default onednn), K micro-batches a step in the --pipeline-schedule's order.
      Prints progress, per-epoch metrics (also as JSON lines in FILE: each stage's busy
      seconds, and with --stage-threads the bubble) and the test accuracy.
)";

// Which side's backend each of `stages` runs on: --parties (a comma list of edge and cloud),
// else the edge's first stage and the cloud's others, and, for two cuts, the edge's tail too
// (the U-shape: the labels stay at the edge).
std::vector<std::string> stage_parties(const CliArgs& args, std::size_t stages) {
  std::vector<std::string> parties;
  if (args.has("parties")) {
    parties = cut_list(args.str("parties", ""));
    if (parties.size() != stages)
      fail("cli", cat("--parties names ", parties.size(), " parties for ", stages, " stages: give one a stage"));
    for (const std::string& p : parties)
      if (p != "edge" && p != "cloud") fail("cli", cat("--parties: '", p, "' is neither edge nor cloud"));
    return parties;
  }
  parties.assign(stages, "cloud");
  parties.front() = "edge";
  if (stages == 3) parties.back() = "edge";
  return parties;
}

int train(const CliArgs& args) {
  const ModelSpec spec = load_model_spec(args.required("model"));
  const Graph graph = Graph::build(spec);
  const std::string cut = graph.cut_nodes(args.str("cut", graph.default_cut()));
  if (cut.empty()) fail("cli", "the spec names no default cut; pass --cut NODE (or a list, NODE,NODE,...)");
  const std::vector<Graph> stage_graphs = graph.partition(cut_list(cut));
  const std::vector<std::string> parties = stage_parties(args, stage_graphs.size());

  const int64_t epochs = args.integer("epochs", 1, 1);
  const int64_t batch = args.integer("batch", 64, 1);
  const int microbatches = static_cast<int>(args.integer("microbatches", 4, 1));
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed", 1, 0));
  const ShardBackends backends = shard_backends(args);
  const std::string &edge_name = backends.edge_name, &cloud_name = backends.cloud_name;
  // A backend a stage: stages on their own threads never share one.
  BackendOptions backend_options;
  backend_options.threads = static_cast<int>(args.integer("threads", 1, 1));
  std::vector<std::unique_ptr<Backend>> stage_backends;
  for (const std::string& party : parties)
    stage_backends.push_back(make_backend(party == "edge" ? edge_name : cloud_name, backend_options));

  std::vector<std::unique_ptr<Network>> nets;
  std::vector<Network*> stages;
  for (std::size_t i = 0; i < stage_graphs.size(); ++i) {
    nets.push_back(std::make_unique<Network>(stage_graphs[i], *stage_backends[i], seed));
    stages.push_back(nets.back().get());
  }
  init_from_whole_model(graph, seed, stages, *make_backend("reference"));
  if (const std::string from = args.str("init-from", ""); !from.empty()) {  // a whole model's state dict
    for (Network* stage : stages) shard_from_torch(graph, read_safetensors_file(from, import_names(graph, *stage)), *stage);
    std::printf("initialised from %s\n", from.c_str());
  }
  const OptimizerOptions sgd = args.optimizer_options();
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  std::vector<Optimizer*> stage_optimizers;
  for (Network* shard : stages) {
    optimizers.push_back(make_optimizer(shard->params(), sgd));
    stage_optimizers.push_back(optimizers.back().get());
  }
  LocalPipeline::Options pipeline_options;
  pipeline_options.schedule = args.str("pipeline-schedule", "gpipe");
  pipeline_options.threads = args.has("stage-threads");
  LocalPipeline trainer(stages, stage_optimizers, pipeline_options);

  TrainingSets sets = load_training_sets(args, graph);
  const LabelledInputs &train_set = sets.train, &test_set = sets.test;
  std::string layout;
  int64_t params = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    layout += cat(i ? ", " : "", stages[i]->graph().nodes().size(), " nodes on ", parties[i], " (",
                  stage_backends[i]->name(), ")");
    params += stages[i]->param_count();
  }
  std::fprintf(stderr, "model %s: %lld parameters, cut at '%s': %zu stages (%s), %s schedule%s\n", spec.name.c_str(),
               static_cast<long long>(params), cut.c_str(), stages.size(), layout.c_str(), trainer.schedule().name(),
               pipeline_options.threads ? ", a thread a stage" : "");

  std::ofstream metrics;
  if (args.has("metrics-json")) {
    metrics.open(args.str("metrics-json", ""), std::ios::app);
    if (!metrics) fail("cli", cat("cannot write --metrics-json ", args.str("metrics-json", "")));
  }

  EpochBatches batches(graph, train_set, batch, seed);
  const int64_t n = batches.samples();
  double accuracy = 0.0;
  ScheduleOptions schedule = args.schedule_options(epochs * ((n + batch - 1) / batch));
  validate(schedule);
  int64_t global_step = 0;
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    batches.shuffle();
    ProgressBar bar(cat("epoch ", epoch, "/", epochs), n);
    StepStats total;
    const StageTimes before = trainer.times();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t begin = 0; begin < n; begin += batch) {
      const int32_t* labels = nullptr;
      const std::vector<Tensor> x = batches.rows(begin, labels);
      const int64_t count = x[0].shape()[0];
      const float factor = lr_factor(schedule, global_step++);
      for (Optimizer* o : stage_optimizers) o->set_lr_scale(factor);
      StepStats s = trainer.train_step(x, labels, static_cast<int>(std::min<int64_t>(microbatches, count)));
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.samples += s.samples;
      bar.update(total.samples, cat("loss ", fixed(total.loss_sum / static_cast<double>(total.samples), 4)));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bar.finish(cat("loss ", fixed(total.loss_sum / static_cast<double>(total.samples), 4)));
    // Each stage's busy time this epoch, each party's, and the share of stage-time idle.
    const StageTimes& after = trainer.times();
    std::string stage_busy;
    double busy_sum = 0;
    auto party_busy = [&](const std::string& party) {
      double sum = 0;
      for (std::size_t i = 0; i < stages.size(); ++i)
        if (parties[i] == party) sum += after.busy_s[i] - before.busy_s[i];
      return sum;
    };
    for (std::size_t i = 0; i < stages.size(); ++i) {
      stage_busy += cat(i ? "," : "", fixed(after.busy_s[i] - before.busy_s[i], 3));
      busy_sum += after.busy_s[i] - before.busy_s[i];
    }
    const double wall = after.wall_s - before.wall_s;
    const double epoch_bubble = wall > 0 ? 1.0 - busy_sum / (static_cast<double>(stages.size()) * wall) : 0.0;
    // The test set a training batch at a time, as tandem stage evaluates it.
    const StepStats test = evaluate_in_batches(graph, test_set, batch, seed,
                                               [&](std::span<const Tensor> rows, const int32_t* labels, int64_t) {
                                                 return trainer.evaluate(rows, labels, batch);
                                               });
    accuracy = static_cast<double>(test.correct) / static_cast<double>(test.samples);
    const std::string json = cat(
        "{\"epoch\":", epoch, ",\"samples\":", total.samples, ",\"seconds\":", fixed(seconds, 3),
        ",\"samples_per_s\":", fixed(static_cast<double>(total.samples) / seconds, 1),
        ",\"train_loss\":", fixed(total.loss_sum / static_cast<double>(total.samples), 5),
        ",\"train_accuracy\":", fixed(static_cast<double>(total.correct) / static_cast<double>(total.samples), 5),
        ",\"test_loss\":", fixed(test.loss_sum / static_cast<double>(test.samples), 5),
        ",\"test_accuracy\":", fixed(accuracy, 5),
        ",\"edge_busy_s\":", fixed(party_busy("edge"), 3), ",\"cloud_busy_s\":", fixed(party_busy("cloud"), 3),
        ",\"stage_busy_s\":[", stage_busy, "]",
        pipeline_options.threads ? cat(",\"bubble\":", fixed(epoch_bubble, 4)) : std::string(), "}");
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
    if (metrics) metrics << json << "\n" << std::flush;
  }
  std::printf("final test accuracy: %.2f%% (%lld test samples)\n", accuracy * 100.0,
              static_cast<long long>(test_set.labels.size()));
  if (args.has("export")) {  // every stage's weights in one state dict, under PyTorch's names and layouts
    trainer.flush();
    std::vector<SafeTensor> tensors;
    for (Network* stage : stages)
      for (SafeTensor& t : shard_to_torch(graph, *stage, global_step)) tensors.push_back(std::move(t));
    for (SafeTensor& t : hugging_face_export_extras(graph)) tensors.push_back(std::move(t));
    const std::string out = args.str("export", "");
    const std::vector<uint8_t> file = write_safetensors(
        tensors, {{"format", "pt"}, {"tandem_model", spec.name}, {"tandem_cut", cut},
                  {"tandem_step", cat(global_step)}, {"tandem_layout", "pytorch (OIHW, NCHW flatten order)"}});
    write_file_atomic(out, file);
    std::printf("wrote %s: %zu tensors from %zu stages, %zu bytes\n", out.c_str(), tensors.size(), stages.size(),
                file.size());
  }
  return 0;
}

int pack_spec(const CliArgs& args) {
  const ModelSpec spec = load_model_spec(args.required("model"));
  const std::string out = args.required("out");
  std::ofstream f(out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(spec.binary.data()), static_cast<std::streamsize>(spec.binary.size()));
  if (!f.flush()) fail("pack-spec", cat("cannot write ", out));
  std::printf("%s: %zu bytes (model '%s')\n", out.c_str(), spec.binary.size(), spec.name.c_str());
  return 0;
}

int list_backends(const CliArgs&) {
  for (const auto& name : backend_names()) std::printf("%s\n", name.c_str());
  return 0;
}

int show_gpu(const CliArgs&) {
  const std::string gpu = gpu_summary();
  if (gpu.empty()) {
    std::printf("this build has no cuda backend (no nvcc when it was configured)\n");
    return 1;
  }
  std::printf("%s\n", gpu.c_str());
  return default_cloud_backend() == "cuda" ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using tandem::Command;
  tandem::Program program("tandem", "tandem's engine on one machine: train, profile, plan, export, import, evaluate, audit, text.");
  program.command("train", "train a model split at its cut in one process (edge and cloud backends side by side)")
      .option("model", "SPEC", "the model spec, JSON (required)")
      .option("cut", "NODE[,NODE...]", "where the model splits: one cut, two stages; N cuts, N + 1 stages (default: the spec's cut)")
      .option("parties", "edge|cloud,...", "each stage's side, whose backend it runs on (default: the first stage the edge's, the others the cloud's; with two cuts the last the edge's too)")
      .option("pipeline-schedule", "gpipe|1f1b|zero-bubble|async", "the order stages run micro-batches in (default gpipe; the synchronous ones give the same weights; async backs a step up during the next, on stashed weights)")
      .flag("stage-threads", "run each stage on its own thread, as a pipeline across machines runs (prints the bubble)")
      .option("export", "FILE", "at the end, every stage's weights in one safetensors file with PyTorch's names (`tandem evaluate` reads it)")
      .option("init-from", "FILE", "start from a safetensors file of the whole model (PyTorch's names and layouts: tandem import's weights, an export)")
      .option("edge-backend", "NAME", "the edge's stages' backend (default xnnpack)")
      .option("cloud-backend", "NAME", "the cloud's stages' backend (default onednn)")
      .option("data", "fashion-mnist|DIR", "Debian's Fashion-MNIST, or DIR/train.safetensors and DIR/test.safetensors")
      .option("epochs", "N", "epochs (default 1)")
      .option("batch", "B", "samples a step (default 64)")
      .option("microbatches", "K", "micro-batches a step (default 4)")
      .optimizer_options(true)
      .option("limit", "SAMPLES", "train on the first SAMPLES samples (default 0: all)")
      .option("test-limit", "SAMPLES", "evaluate on the first SAMPLES test samples (default 0: all)")
      .option("seed", "S", "the seed of initialisation and shuffling (default 1)")
      .option("threads", "T", "kernel threads (default 1)")
      .option("metrics-json", "FILE", "append each epoch's metrics to FILE as JSON lines")
      .details(tandem::kTrainDetails)
      .run(tandem::train);
  tandem::declare_stage(program.command("stage", "run one party's stage of a pipeline across parties (a deployment file)"));
  tandem::declare_profile(program.command("profile", "time every layer's forward and backward on its shard's backend"));
  tandem::declare_plan(program.command("plan", "predict the speed of every cut and micro-batch count on a link"));
  tandem::declare_export(program.command("export", "merge the edge's and the cloud's checkpoints into one safetensors file"));
  tandem::declare_import(program.command("import", "a PyTorch model exported to ONNX as a tandem spec and its weights"));
  tandem::declare_evaluate(program.command("evaluate", "a whole model's test accuracy from a safetensors file"));
  tandem::declare_audit(program.command("audit", "check what left an edge: its egress log"));
  tandem::declare_text(program.command("text", "vocabularies and data sets for text models (SentencePiece)"));
  program.command("pack-spec", "write a spec's canonical binary form (what the browser edge loads)")
      .option("model", "SPEC", "the model spec, JSON (required)")
      .option("out", "FILE", "the binary spec to write (required)")
      .run(tandem::pack_spec);
  program.command("backends", "list the backends this build has").run(tandem::list_backends);
  program.command("gpu", "the GPU the cuda backend would use; exit 1 where none can be used, with the reason")
      .run(tandem::show_gpu);
  return program.main(argc, argv);
}
