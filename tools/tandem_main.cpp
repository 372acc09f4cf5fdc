// tandem: the engine's command line. `tandem train` trains a model spec on Fashion-MNIST in
// one process, split at the cut: the front shard on the edge backend, the back on the cloud's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "core/graph.h"
#include "core/network.h"
#include "core/trainer.h"
#include "data/idx_dataset.h"
#include "ports/files/tensor_dataset.h"
#include "backends/registry.h"
#include "cli/cli_args.h"
#include "tools/audit_verify.h"
#include "tools/cli_setup.h"
#include "tools/export_command.h"
#include "tools/plan_command.h"
#include "tools/profile_command.h"
#include "tools/text_command.h"
#include "cli/progress.h"

namespace tandem {
namespace {

constexpr const char* kUsage = R"(usage:
  tandem train --model SPEC [--cut NODE] [--edge-backend NAME] [--cloud-backend NAME] [--data fashion-mnist|DIR]
               [--epochs N] [--batch B] [--microbatches K] [OPTIMIZER] [SCHEDULE]
               [--limit SAMPLES] [--test-limit SAMPLES] [--seed S] [--threads T]
               [--metrics-json FILE]
      Trains SPEC on Fashion-MNIST (Debian's dataset-fashion-mnist; or DIR/train.safetensors and
      DIR/test.safetensors, a tensor per model input and "labels"), split at the cut (the
      spec's default cut unless --cut): front shard on the edge backend (default xnnpack),
      back shard and loss on the cloud backend (default onednn), K micro-batches a step.
      Prints progress, per-epoch metrics (also as JSON lines in FILE) and the test accuracy.
      OPTIMIZER: --optimizer sgd|adam|adamw (sgd) --lr X (0.05; Adam 0.001) --momentum X
      (0.9) --nesterov --weight-decay X --beta1 X --beta2 X --eps X --clip-norm X (per shard).
      SCHEDULE: --schedule constant|step|cosine --warmup-steps N --step-size N --gamma X
      --min-lr-factor X [--total-steps N] (cosine: the whole run by default).
  tandem profile --model SPEC [--cut NODE] [--edge-backend NAME] [--cloud-backend NAME]
                 [--batch B] [--iterations N] [--threads T]
      Times every layer's forward and backward on its shard's backend for micro-batches of
      B (default 16) random samples, median of N (default 20); prints a table and a JSON line.
  tandem plan --model SPEC --uplink-mbps U [--downlink-mbps D] [--edge-gflops G | --profile-edge]
              [--cloud-gflops G] [--edge-memory-mb M] [--batch B] [--microbatches 1,2,4,8,16]
              [--wire-dtype f32|f16|bf16|i8] [--cut NODE] [--iterations N] [--pipeline sync|async]
      For every legal cut and micro-batch count K: the predicted step time of the pipeline
      (edge compute, uplink, cloud compute, downlink overlapping over K micro-batches; with
      --pipeline async the next step's forwards overlap this one's backwards, as
      tandem-edge --pipeline async runs) and the edge's peak memory; then
      `recommended: cut=NODE microbatches=K predicted_samples_per_s=X`.
      Compute is measured here on the edge and cloud backends unless given in GFLOP/s.
  tandem export --model SPEC --edge-ckpt FILE --cloud-ckpt FILE [--identity IDDIR | --key FILE]
                [--base FILE [--merge-lora]] --out model.safetensors
      Merges the edge's checkpoint (from tandem-edge --checkpoint-dir; encrypted, so give
      the identity folder holding checkpoint.key) and the cloud's of the same step
      (STATE_DIR/checkpoints/CLIENT/) into one safetensors file with PyTorch's names and
      layouts (OIHW convolutions, NCHW flatten order), loadable with torch's
      load_state_dict into the equivalent torch model. A model with frozen parameters (frozen
      nodes, LoRA bases; checkpoints hold only what trains) takes them from --base FILE, the
      file they were loaded from: LoRA adapters are written beside them (PEFT's lora_A,
      lora_B names), or merged into the base weights with --merge-lora (W += alpha/r B A).
  tandem evaluate --model SPEC --weights model.safetensors [--backend NAME] [--test-limit N]
                  [--data fashion-mnist|DIR] [--predictions FILE] [--logits FILE]
      The whole model's test accuracy from a safetensors file (PyTorch names and layouts;
      Hugging Face's for a spec whose nodes carry its module names) on Fashion-MNIST or
      DIR/test.safetensors; writes each sample's predicted class (and raw f32 logits) when asked.
  tandem audit verify LOG [--expect-last HASH]
      Checks an edge's egress log (tandem-edge --audit-log, default IDDIR/egress.jsonl):
      every line's hash, the chain from line to line and each run's summary; prints what
      left the edge, by kind (messages, bytes, tensors with dtypes and shapes, labels).
      Exits 1 on any edited, removed, inserted or reordered line; --expect-last compares the
      last hash with the one the edge printed at the end of its run.
  tandem text vocab --texts train.jsonl --out spm.model [--vocab-size N]
  tandem text encode --spm spm.model --texts FILE.jsonl --tokens T --out FILE.safetensors
      A SentencePiece vocabulary trained on a data set's texts (JSON lines with "text"), and
      texts with integer "label"s encoded into a data set for --data DIR ([CLS], T-1 pieces,
      padding; ids, mask and labels). `tandem text` alone says more.
  tandem pack-spec --model SPEC --out FILE
      Writes SPEC's canonical binary form (FlatBuffers, identifier TDMS): what model hashes
      are computed over, and what the browser edge loads (it has no JSON parser).
  tandem backends      lists the backends this build has
  tandem gpu           the GPU the cuda backend would use (name, memory); exit 1 where none
                       can be used, with the reason
)";

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

int train(const CliArgs& args) {
  args.reject_unknown(CliArgs::with_optimizer_options({"model", "cut", "edge-backend", "cloud-backend", "epochs", "batch",
                                                       "microbatches", "limit", "test-limit", "seed", "threads",
                                                       "metrics-json", "data"},
                                                      /*schedule=*/true));
  const SplitModel model = load_split_model(args);
  const ModelSpec& spec = model.spec;
  const Graph& graph = model.graph;
  const std::string& cut = model.cut;
  const Graph &front_graph = model.front, &back_graph = model.back;

  const int64_t epochs = args.integer("epochs", 1, 1);
  const int64_t batch = args.integer("batch", 64, 1);
  const int microbatches = static_cast<int>(args.integer("microbatches", 4, 1));
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed", 1, 0));
  const ShardBackends backends = shard_backends(args);
  const std::string &edge_name = backends.edge_name, &cloud_name = backends.cloud_name;

  // Both shards draw from one generator in graph order, so the initial weights do not depend
  // on where the cut is.
  Network whole(graph, *backends.edge, seed);
  Network front(front_graph, *backends.edge, seed), back(back_graph, *backends.cloud, seed);
  // A U-shaped cut: the edge's tail is the chain's third stage.
  std::unique_ptr<Network> tail;
  if (model.u_shaped) tail = std::make_unique<Network>(model.tail, *backends.edge, seed);
  std::vector<Network*> stages = {&front, &back};
  if (tail) stages.push_back(tail.get());
  for (Network* shard : stages)
    for (Param* p : shard->all_params()) {
      p->value().copy_from(whole.param(p->name()).value());
      p->bump_version();
    }
  const OptimizerOptions sgd = args.optimizer_options();
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  std::vector<Optimizer*> stage_optimizers;
  for (Network* shard : stages) {
    optimizers.push_back(make_optimizer(shard->params(), sgd));
    stage_optimizers.push_back(optimizers.back().get());
  }
  ChainTrainer trainer(stages, stage_optimizers);

  // Fashion-MNIST, or a data set folder (DIR/train.safetensors, DIR/test.safetensors: a
  // tensor per model input and "labels", ports/files/tensor_dataset.h).
  const std::string data = args.str("data", "fashion-mnist");
  LabelledInputs train_set, test_set;
  if (data == "fashion-mnist") {
    std::fprintf(stderr, "loading Fashion-MNIST from %s\n", fashion_mnist_dir().c_str());
    LabelledImages train_images = load_fashion_mnist(true, args.integer("limit", 0, 0));
    LabelledImages test_images = load_fashion_mnist(false, args.integer("test-limit", 0, 0));
    const Shape& in_shape = graph.inputs().at(0).shape;
    if (graph.inputs().size() != 1 || train_images.images.shape().item_numel() != in_shape.numel())
      fail("cli", cat("the model's inputs are not one image of Fashion-MNIST's size (its first, '",
                      graph.inputs()[0].name, "', is ", in_shape.str(), "): give its data with --data DIR"));
    const int64_t n_train = train_images.images.shape()[0], n_test = test_images.images.shape()[0];
    train_set = {{train_images.images.reshape(in_shape.batched(n_train))}, std::move(train_images.labels)};
    test_set = {{test_images.images.reshape(in_shape.batched(n_test))}, std::move(test_images.labels)};
  } else {
    std::fprintf(stderr, "loading the data set in %s\n", data.c_str());
    train_set = read_tensor_dataset(data + "/train.safetensors", graph.inputs(), args.integer("limit", 0, 0));
    test_set = read_tensor_dataset(data + "/test.safetensors", graph.inputs(), args.integer("test-limit", 0, 0));
  }
  std::fprintf(stderr, "model %s: %lld parameters, cut at '%s' (front %zu nodes on %s, back %zu nodes on %s)\n",
               spec.name.c_str(),
               static_cast<long long>(front.param_count() + back.param_count() + (tail ? tail->param_count() : 0)),
               cut.c_str(),
               front_graph.nodes().size(), edge_name.c_str(), back_graph.nodes().size(), cloud_name.c_str());

  std::ofstream metrics;
  if (args.has("metrics-json")) {
    metrics.open(args.str("metrics-json", ""), std::ios::app);
    if (!metrics) fail("cli", cat("cannot write --metrics-json ", args.str("metrics-json", "")));
  }

  const int64_t n = static_cast<int64_t>(train_set.labels.size());
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng shuffle_rng(seed ^ 0x5eedULL);
  std::vector<Tensor> inputs;  // a step's rows of every input
  for (const GraphInput& in : graph.inputs()) inputs.push_back(Tensor::empty(in.shape.batched(batch)));
  std::vector<int32_t> labels(static_cast<std::size_t>(batch));
  double accuracy = 0.0;
  ScheduleOptions schedule = args.schedule_options(epochs * ((n + batch - 1) / batch));
  validate(schedule);
  int64_t global_step = 0;
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(order[static_cast<std::size_t>(i)], order[shuffle_rng.below(static_cast<uint64_t>(i + 1))]);
    ProgressBar bar(cat("epoch ", epoch, "/", epochs), n);
    StepStats total;
    const auto busy0 = trainer.times().busy_s;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t begin = 0; begin < n; begin += batch) {
      const int64_t count = std::min(batch, n - begin);
      std::vector<Tensor> x;
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        const int64_t item = graph.inputs()[k].shape.numel();
        for (int64_t j = 0; j < count; ++j)
          std::copy_n(train_set.inputs[k].data() + order[static_cast<std::size_t>(begin + j)] * item, item,
                      inputs[k].data() + j * item);
        x.push_back(count == batch ? inputs[k] : inputs[k].slice_batch(0, count));
      }
      for (int64_t j = 0; j < count; ++j)
        labels[static_cast<std::size_t>(j)] = train_set.labels[static_cast<std::size_t>(order[static_cast<std::size_t>(begin + j)])];
      const float factor = lr_factor(schedule, global_step++);
      for (Optimizer* o : stage_optimizers) o->set_lr_scale(factor);
      StepStats s = trainer.train_step(x, labels.data(), static_cast<int>(std::min<int64_t>(microbatches, count)));
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.samples += s.samples;
      bar.update(total.samples, cat("loss ", fixed(total.loss_sum / static_cast<double>(total.samples), 4)));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bar.finish(cat("loss ", fixed(total.loss_sum / static_cast<double>(total.samples), 4)));
    StepStats test = trainer.evaluate(test_set.inputs, test_set.labels.data(), 1000);
    accuracy = static_cast<double>(test.correct) / static_cast<double>(test.samples);
    const std::string json = cat(
        "{\"epoch\":", epoch, ",\"samples\":", total.samples, ",\"seconds\":", fixed(seconds, 3),
        ",\"samples_per_s\":", fixed(static_cast<double>(total.samples) / seconds, 1),
        ",\"train_loss\":", fixed(total.loss_sum / static_cast<double>(total.samples), 5),
        ",\"train_accuracy\":", fixed(static_cast<double>(total.correct) / static_cast<double>(total.samples), 5),
        ",\"test_loss\":", fixed(test.loss_sum / static_cast<double>(test.samples), 5),
        ",\"test_accuracy\":", fixed(accuracy, 5),
        ",\"edge_busy_s\":", fixed(trainer.times().busy_s[0] - busy0[0], 3),
        ",\"cloud_busy_s\":", fixed(trainer.times().busy_s[1] - busy0[1], 3), "}");
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
    if (metrics) metrics << json << "\n" << std::flush;
  }
  std::printf("final test accuracy: %.2f%% (%lld test samples)\n", accuracy * 100.0,
              static_cast<long long>(test_set.labels.size()));
  return 0;
}

int pack_spec(const CliArgs& args) {
  args.reject_unknown({"model", "out"});
  const ModelSpec spec = load_model_spec(args.required("model"));
  const std::string out = args.required("out");
  std::ofstream f(out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(spec.binary.data()), static_cast<std::streamsize>(spec.binary.size()));
  if (!f.flush()) fail("pack-spec", cat("cannot write ", out));
  std::printf("%s: %zu bytes (model '%s')\n", out.c_str(), spec.binary.size(), spec.name.c_str());
  return 0;
}

int list_backends(int, char**) {
  for (const auto& name : backend_names()) std::printf("%s\n", name.c_str());
  return 0;
}

int show_gpu(int, char**) {
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
  return tandem::run_cli(argc, argv, "tandem", tandem::kUsage,
                         {{"train", [](int c, char** v) { return tandem::train(tandem::CliArgs(c, v, 2, {"nesterov"})); }},
                          {"profile", [](int c, char** v) { return tandem::profile_command(tandem::CliArgs(c, v, 2, {})); }},
                          {"plan", [](int c, char** v) { return tandem::plan_command(tandem::CliArgs(c, v, 2, {"profile-edge"})); }},
                          {"export", [](int c, char** v) { return tandem::export_command(tandem::CliArgs(c, v, 2, {"merge-lora"})); }},
                          {"evaluate", [](int c, char** v) { return tandem::evaluate_command(tandem::CliArgs(c, v, 2, {})); }},
                          {"pack-spec", [](int c, char** v) { return tandem::pack_spec(tandem::CliArgs(c, v, 2, {})); }},
                          {"backends", tandem::list_backends},
                          {"gpu", tandem::show_gpu},
                          {"audit", tandem::audit_command},
                          {"text", tandem::text_command}});
}
