// Fuzzes ONNX import, what `tandem import` runs on a file from anywhere: parse_onnx (the
// protobuf reader), import_onnx (shape arithmetic at import, the patterns, the refusals),
// the written spec read back and built, and the weights loaded into a network.
#include "core/error.h"
#include "core/graph.h"
#include "core/interop/onnx_import.h"
#include "core/interop/onnx_protobuf.h"
#include "core/interop/torch_layout.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "backends/registry.h"

using namespace tandem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const std::unique_ptr<Backend> backend = make_backend("reference");
  try {
    const OnnxGraph onnx = parse_onnx(std::span<const uint8_t>(data, size), "fuzz.onnx");
    OnnxImportOptions options;
    options.origin = "fuzz.onnx";
    const OnnxImport imported = import_onnx(onnx, options);
    const Graph graph = Graph::build(parse_model_json(model_spec_json(imported.spec), "the imported spec"));
    Network net(graph, *backend, 0);
    shard_from_torch(graph, imported.weights, net);
  } catch (const Error&) {
  }
  return 0;
}
