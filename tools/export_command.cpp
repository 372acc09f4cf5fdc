#include "tools/export_command.h"

#include <cstdio>
#include <fstream>
#include <algorithm>
#include <map>
#include <optional>

#include "core/checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/interop/hugging_face.h"
#include "core/interop/safetensors.h"
#include "core/interop/torch_layout.h"
#include "core/loss.h"
#include "core/sha256.h"
#include "core/wire/messages.h"
#include "data/idx_dataset.h"
#include "ports/crypto/aes_gcm.h"
#include "ports/files/atomic_file.h"
#include "ports/files/tensor_dataset.h"
#include "backends/registry.h"
#include "cli/command_line.h"
#include "cli/progress.h"

namespace tandem {
namespace {

// A checkpoint file, opened with the key when it is sealed (the edge's).
CheckpointData read_checkpoint(const std::string& path, const std::string& key_path) {
  const std::vector<uint8_t> bytes = read_file(path);
  if (!is_sealed(bytes)) return decode_checkpoint(bytes);
  if (key_path.empty())
    fail("export", cat(path, " is encrypted: pass the edge's identity folder (--identity IDDIR, which holds "
                             "checkpoint.key) or --key FILE"));
  return decode_checkpoint(open_aes_gcm(load_key(key_path, false), bytes));
}

// A Network over `graph` whose tensors are the checkpoint's (checked against the model); its
// frozen parameters (not in checkpoints) from `base`, the file they were loaded from.
void load_shard(const Graph& whole, const Graph& graph, const ModelSpec& spec, const CheckpointData& d,
                const char* role, const std::vector<SafeTensor>* base, std::unique_ptr<Network>& net,
                Backend& backend) {
  if (d.meta.role != role) fail("export", cat("expected the ", role, "'s checkpoint, got the ", d.meta.role, "'s"));
  if (d.meta.model_hash != model_hash(spec, d.meta.cut))
    fail("export", cat("the ", role, "'s checkpoint is of another model or cut than ", spec.name, " cut at '",
                       d.meta.cut, "'"));
  net = std::make_unique<Network>(graph, backend, 0);
  if (net->all_params().size() != net->params().size()) {
    if (!base)
      fail("export", cat("the model has frozen parameters (frozen nodes, LoRA bases), which checkpoints do not hold: "
                         "pass the file they were loaded from with --base FILE"));
    shard_from_torch(whole, *base, *net);
  }
  restore_checkpoint(d, *net, nullptr);
}

// LoRA merged into the base weights: W += (alpha / r) B A on every adapted linear of `net`.
void merge_adapters(const Graph& graph, Network& net) {
  for (const GraphNode& n : graph.nodes()) {
    if (n.spec.lora.rank == 0) continue;
    Param& w = net.param(n.spec.name + ".weight");
    const Tensor& a = net.param(n.spec.name + ".lora_A.weight").value();
    const Tensor& b = net.param(n.spec.name + ".lora_B.weight").value();
    const int64_t out = w.value().shape()[0], in = w.value().shape()[1], r = n.spec.lora.rank;
    const float s = n.spec.lora.scale();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double d = 0.0;
        for (int64_t k = 0; k < r; ++k) d += static_cast<double>(b[o * r + k]) * a[k * in + i];
        w.value()[o * in + i] += static_cast<float>(s * d);
      }
  }
}

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

}  // namespace

// tandem export --stages: the exports of every stage of a pipeline across parties (tandem
// stage), one file a stage, merged into one: every tensor of the whole model exactly once,
// all of one step.
int merge_stage_exports(const CliArgs& args, const ModelSpec& spec, const Graph& graph) {
  auto reference = make_backend("reference");
  Network whole(graph, *reference, 0);
  std::vector<std::string> order;
  for (const SafeTensor& t : shard_to_torch(graph, whole, 0)) order.push_back(t.name);
  for (const SafeTensor& t : hugging_face_export_extras(graph)) order.push_back(t.name);
  std::map<std::string, std::pair<SafeTensor, std::string>> merged;  // name -> the tensor, its file
  std::string step, cut;
  for (const std::string& file : cut_list(args.str("stages", ""))) {
    std::map<std::string, std::string> meta;
    std::vector<SafeTensor> tensors = read_safetensors(read_file(file), &meta);
    if (meta["tandem_model"] != spec.name)
      fail("export", cat(file, " holds model '", meta["tandem_model"], "', not ", spec.name));
    if (!step.empty() && (meta["tandem_step"] != step || meta["tandem_cut"] != cut))
      fail("export", cat(file, " is of step ", meta["tandem_step"], " cut at '", meta["tandem_cut"], "'; the first of step ",
                         step, " cut at '", cut, "': merge the exports of one run"));
    step = meta["tandem_step"];
    cut = meta["tandem_cut"];
    for (SafeTensor& t : tensors) {
      if (std::find(order.begin(), order.end(), t.name) == order.end())
        fail("export", cat(file, " holds '", t.name, "', which ", spec.name, " has not"));
      std::string name = t.name;
      const auto [it, fresh] = merged.emplace(std::move(name), std::make_pair(std::move(t), file));
      if (!fresh) fail("export", cat(file, " and ", it->second.second, " both hold '", it->first, "': give each stage's export once"));
    }
  }
  std::vector<SafeTensor> tensors;
  for (const std::string& name : order) {
    auto it = merged.find(name);
    if (it == merged.end())
      fail("export", cat("no stage's export holds '", name, "': give every stage's export (--stages A,B,...)"));
    tensors.push_back(std::move(it->second.first));
  }
  const std::string out = args.required("out");
  const std::vector<uint8_t> bytes = write_safetensors(
      tensors, {{"format", "pt"}, {"tandem_model", spec.name}, {"tandem_cut", cut}, {"tandem_step", step},
                {"tandem_layout", "pytorch (OIHW, NCHW flatten order)"}});
  write_file_atomic(out, bytes);
  std::printf("wrote %s: %zu tensors, %zu bytes, model %s at step %s (stages cut at '%s')\n", out.c_str(),
              tensors.size(), bytes.size(), spec.name.c_str(), step.c_str(), cut.c_str());
  return 0;
}

int export_command(const CliArgs& args) {
  const ModelSpec spec = load_model_spec(args.required("model"));
  const Graph graph = Graph::build(spec);
  if (args.has("stages")) return merge_stage_exports(args, spec, graph);
  const std::string key = args.has("key") ? args.str("key", "")
                          : args.has("identity") ? args.str("identity", "") + "/checkpoint.key"
                                                 : std::string();
  const CheckpointData edge = read_checkpoint(args.required("edge-ckpt"), key);
  const CheckpointData cloud = read_checkpoint(args.required("cloud-ckpt"), "");
  if (edge.meta.cut != cloud.meta.cut)
    fail("export", cat("the edge's checkpoint is cut at '", edge.meta.cut, "', the cloud's at '", cloud.meta.cut, "'"));
  if (edge.meta.step != cloud.meta.step)
    fail("export", cat("the edge's checkpoint is of step ", edge.meta.step, ", the cloud's of step ", cloud.meta.step,
                       ": pass the cloud's checkpoint of step ", edge.meta.step, " (the cloud keeps its newest few)"));
  const auto [front_graph, back_graph] = graph.split(edge.meta.cut);
  auto reference = make_backend("reference");
  std::optional<std::vector<SafeTensor>> base;
  if (args.has("base")) base = read_safetensors(read_file(args.str("base", "")));
  const bool merge = args.has("merge-lora");
  std::vector<SafeTensor> tensors;
  auto add = [&](const Graph& part, const CheckpointData& d, const char* role) {
    std::unique_ptr<Network> net;
    load_shard(graph, part, spec, d, role, base ? &*base : nullptr, net, *reference);
    if (merge) merge_adapters(part, *net);
    for (SafeTensor& t : shard_to_torch(graph, *net, static_cast<int64_t>(d.meta.step)))
      if (!merge || !is_adapter(t.name)) tensors.push_back(std::move(t));
  };
  add(front_graph, edge, "edge");
  add(back_graph, cloud, "cloud");
  if (u_shaped_cut(edge.meta.cut)) add(graph.tail(edge.meta.cut), edge, "edge");  // the edge's checkpoint holds the tail too
  for (SafeTensor& t : hugging_face_export_extras(graph)) tensors.push_back(std::move(t));
  const std::string out = args.required("out");
  const std::vector<uint8_t> file = write_safetensors(
      tensors, {{"format", "pt"}, {"tandem_model", spec.name}, {"tandem_cut", edge.meta.cut},
                {"tandem_step", cat(edge.meta.step)}, {"tandem_layout", "pytorch (OIHW, NCHW flatten order)"}});
  write_file_atomic(out, file);
  std::printf("wrote %s: %zu tensors, %zu bytes, model %s at step %llu (edge and cloud cut at '%s')\n", out.c_str(),
              tensors.size(), file.size(), spec.name.c_str(), static_cast<unsigned long long>(edge.meta.step),
              edge.meta.cut.c_str());
  return 0;
}

int evaluate_command(const CliArgs& args) {
  const ModelSpec spec = load_model_spec(args.required("model"));
  const Graph graph = Graph::build(spec);
  auto backend = make_backend(args.str("backend", "reference"));
  Network net(graph, *backend, 0);
  shard_from_torch(graph, read_safetensors(read_file(args.required("weights"))), net);
  net.set_training(false);
  // Fashion-MNIST's test set, or DIR/test.safetensors (ports/files/tensor_dataset.h).
  const std::string data = args.str("data", "fashion-mnist");
  LabelledInputs test;
  if (data == "fashion-mnist") {
    LabelledImages images = load_fashion_mnist(false, args.integer("test-limit", 0, 0));
    test = {{std::move(images.images)}, std::move(images.labels)};
  } else {
    test = read_tensor_dataset(data + "/test.safetensors", graph.inputs(), args.integer("test-limit", 0, 0));
  }
  const int64_t n = static_cast<int64_t>(test.labels.size()), groups = graph.output_groups();
  std::ofstream predictions, logits;
  if (args.has("predictions")) predictions.open(args.str("predictions", ""));
  if (args.has("logits")) logits.open(args.str("logits", ""), std::ios::binary);
  int64_t correct = 0;
  double loss = 0.0;
  ProgressBar bar("evaluate", n);
  // A batch at a time: the kernels and activations are built for a batch, so memory stays at
  // one batch's (500 mails of spam-bert at once took 1.7 GB).
  const int64_t chunk = args.integer("batch", 64, 1);
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min<int64_t>(chunk, n - begin);
    std::vector<Tensor> batch;
    for (const Tensor& t : test.inputs) batch.push_back(t.slice_batch(begin, count));
    const Tensor& out = net.forward(batch, 0);
    const int32_t* labels = test.labels.data() + begin;
    correct += count_correct(out, labels, groups);
    loss += compute_loss(graph.loss(), out, labels, 1.0f, nullptr, groups);
    const int64_t c = out.shape().item_numel();
    for (int64_t i = 0; i < count; ++i) {
      const float* row = out.data() + i * c;
      if (predictions) predictions << std::max_element(row, row + c) - row << "\n";
    }
    if (logits) logits.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.bytes()));
    bar.update(begin + count, "");
  }
  bar.finish("");
  std::printf("{\"test_accuracy\":%.5f,\"test_loss\":%.5f,\"samples\":%lld}\n", static_cast<double>(correct) / n,
              loss / static_cast<double>(n), static_cast<long long>(n));
  return 0;
}

void declare_export(Command& export_) {
  export_.option("model", "SPEC", "the model spec, JSON (required)")
      .option("edge-ckpt", "FILE", "the edge's checkpoint, from tandem-edge --checkpoint-dir (required)")
      .option("cloud-ckpt", "FILE", "the cloud's checkpoint of the same step, STATE_DIR/checkpoints/CLIENT/ (required)")
      .option("identity", "IDDIR", "the edge's identity folder, whose checkpoint.key decrypts the edge's checkpoint")
      .option("key", "FILE", "the edge's checkpoint key itself, instead of --identity")
      .option("base", "FILE", "the safetensors file frozen parameters and LoRA bases came from")
      .flag("merge-lora", "merge LoRA adapters into the base weights (W += alpha/r B A)")
      .option("stages", "FILE,FILE...", "instead of checkpoints: every stage's export of a pipeline across parties (tandem stage), merged")
      .option("out", "FILE", "the safetensors file to write (required)")
      .details("Writes PyTorch's names and layouts (OIHW convolutions, NCHW flatten order), loadable with torch's\n"
               "load_state_dict into the equivalent torch model.")
      .run(export_command);
}

void declare_evaluate(Command& evaluate) {
  evaluate.option("model", "SPEC", "the model spec, JSON (required)")
      .option("weights", "FILE", "the whole model's weights, safetensors with PyTorch's (or Hugging Face's) names (required)")
      .option("backend", "NAME", "the kernels (default reference)")
      .option("data", "fashion-mnist|DIR", "Debian's Fashion-MNIST or DIR/test.safetensors (default fashion-mnist)")
      .option("test-limit", "N", "the first N test samples (default 0: all)")
      .option("batch", "B", "samples a forward (default 64)")
      .option("predictions", "FILE", "write each sample's predicted class")
      .option("logits", "FILE", "write each sample's raw f32 logits")
      .run(evaluate_command);
}

}  // namespace tandem
