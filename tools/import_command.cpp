#include "tools/import_command.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "backends/registry.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/interop/onnx_import.h"
#include "core/interop/onnx_protobuf.h"
#include "core/interop/torch_layout.h"
#include "core/network.h"
#include "ports/files/atomic_file.h"

namespace tandem {
namespace {

constexpr const char* kDetails = R"(
      Reads MODEL.onnx as torch.onnx.export writes it and writes DIR/model.json (a tandem spec)
      and DIR/weights.safetensors (its weights as PyTorch's state dict names them). Export in
      training mode, so batch norm and the parameter names stay:
        torch.onnx.export(model, x, "model.onnx", training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["image"],
                          dynamic_axes={"image": {0: "batch"}})
      Nodes are named after the modules they came from (layer1.0.conv1), so --cut layer3 cuts
      after module layer3's last node, and tandem export gives back PyTorch's names. An image
      [N, C, H, W] becomes the input [H, W, C] a sample (tandem's data sets are NHWC). A text
      model's token ids [N, T] become an int32 input [T] and its attention mask [N, T] (BERT's
      (1 - mask) * large negative added to the scores) the key padding mask input [T]; its
      attention comes back as tandem's attention op. A model with ops tandem cannot read is
      refused with every one of them listed.
)";

// "32,64,96" -> {32, 64, 96}
std::vector<int64_t> length_list(const std::string& text) {
  std::vector<int64_t> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0)
      fail("usage", cat("--length-buckets takes lengths separated by commas (32,64,96), got '", text, "'"));
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

int import_command(const CliArgs& args) {
  const std::string path = args.required("model");
  const std::string dir = args.required("out");
  OnnxImportOptions options;
  options.origin = path;
  options.name = args.str("name", std::filesystem::path(path).stem().string());
  options.cut = args.str("cut", "");
  OnnxImport imported = import_onnx(parse_onnx(read_file(path), path), options);
  if (const std::string buckets = args.str("length-buckets", ""); !buckets.empty()) {
    InputSpec* mask = nullptr;
    for (InputSpec& in : imported.spec.inputs)
      if (in.mask) mask = &in;
    if (!mask) fail("usage", cat(path, ": --length-buckets belongs to a text model's attention mask, and this model has none"));
    mask->length_buckets = length_list(buckets);
    for (const NodeSpec& n : imported.spec.nodes)  // torch's x.mean(1) averages the padding too, at every length
      if (n.op == "token_pool" && n.token_pool.mean && n.inputs.size() == 1)
        fail("usage", cat(path, ": --length-buckets would change what node '", n.name, "' computes: it averages every token ",
                          "(x.mean(1), padding included), and a shorter bucket has fewer; import without --length-buckets"));
  }

  // What was written must build and load as any spec: the graph's shapes against the
  // weights', every tensor read, none left over.
  const std::string json = model_spec_json(imported.spec);
  const ModelSpec spec = parse_model_json(json, "the imported spec");
  const Graph graph = Graph::build(spec);
  auto backend = make_backend("reference");
  Network net(graph, *backend, 0);
  shard_from_torch(graph, imported.weights, net);
  const std::vector<std::string> wanted = torch_tensor_names(graph, net);
  const std::set<std::string> read(wanted.begin(), wanted.end());
  for (const SafeTensor& t : imported.weights)
    if (!read.count(t.name)) fail("import", cat(path, ": tensor '", t.name, "' belongs to no node of the imported spec"));
  if (!imported.cut_node.empty()) (void)graph.partition({imported.cut_node});  // a cut the graph can make

  make_dirs(dir);
  write_file_atomic(dir + "/model.json", std::span(reinterpret_cast<const uint8_t*>(json.data()), json.size()));
  write_file_atomic(dir + "/weights.safetensors",
                    write_safetensors(imported.weights, {{"format", "pt"}, {"tandem_import", path}}));
  int64_t parameters = 0;
  for (const SafeTensor& t : imported.weights) parameters += static_cast<int64_t>(t.data.size() / 4);
  std::printf("imported %s: %zu nodes, %zu tensors (%lld values), output '%s'\n", path.c_str(), spec.nodes.size(),
              imported.weights.size(), static_cast<long long>(parameters), spec.output.c_str());
  for (const InputSpec& in : spec.inputs)
    std::printf("  input %s %s%s\n", in.name.c_str(), in.shape.str().c_str(),
                in.marks_padding ? ": a key padding mask, 1 marks padding (torch's key_padding_mask; read as 1 - mask)"
                : in.mask        ? ": a key padding mask, 1 keeps a token, 0 pads"
                : in.integer && in.shape.rank() == 2 ? ": integers (boxes [x0, y0, x1, y1] a token)"
                : in.integer                         ? ": integers (token ids)"
                                                     : "");
  for (const std::string& f : imported.fused) std::printf("  fused %s\n", f.c_str());
  for (const std::string& r : imported.renamed) std::printf("  renamed %s\n", r.c_str());
  if (!imported.cut_node.empty())
    std::printf("  cut '%s' after node '%s'\n", options.cut.c_str(), imported.cut_node.c_str());
  std::printf("wrote %s/model.json and %s/weights.safetensors\n", dir.c_str(), dir.c_str());
  return 0;
}

}  // namespace

void declare_import(Command& import) {
  std::string ops;
  for (const std::string& op : onnx_import_ops()) ops += (ops.empty() ? "" : ", ") + op;
  import.positional("model", "MODEL.onnx, as torch.onnx.export wrote it")
      .option("out", "DIR", "where model.json and weights.safetensors go (required)")
      .option("cut", "MODULE|NODE", "the spec's default cut: after a module's last node (layer3) or after a node")
      .option("name", "NAME", "the spec's name (default: the file's name without .onnx)")
      .option("length-buckets", "LIST", "a text model's: the lengths a micro-batch may run at (32,64,96), the shortest "
              "that holds its longest text; set on the attention mask input")
      .details(cat(kDetails, "      ONNX ops read: ", ops, ".\n"))
      .run(import_command);
}

}  // namespace tandem
