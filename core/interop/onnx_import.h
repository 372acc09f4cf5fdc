// ONNX import: a model exported by torch.onnx.export (training mode: batch norm and the
// parameter names kept) as a tandem spec and its weights under PyTorch's state-dict names.
// Nodes are named after the PyTorch modules they came from ("layer1.0.conv1"), so a node's
// tensors are "<node>.weight" etc., exactly the module's state-dict keys, and a cut can be
// named by module. Images arrive NCHW and become tandem's NHWC inputs ([H, W, C] a sample);
// the weights stay in PyTorch's layout (torch_layout.h converts them as any torch file).
// Every ONNX op tandem reads is one entry of one table (onnx_import.cpp); a model with ops it
// cannot read is refused with all of them at once, each with its node, op and module.
#pragma once

#include <string>
#include <vector>

#include "core/interop/onnx_graph.h"
#include "core/interop/safetensors.h"
#include "core/model_spec.h"

namespace tandem {

struct OnnxImportOptions {
  std::string origin = "model.onnx";  // the file, for errors
  std::string name = "imported";      // the spec's name
  std::string cut;                    // a module ("layer3": its last node) or a node; "" none
};

struct OnnxImport {
  ModelSpec spec;  // without its binary form: model_spec_json(spec) and parse it for that
  std::vector<SafeTensor> weights;   // F32, PyTorch's layout, named "<node>.<field>"
  std::vector<std::string> renamed;  // initializers stored under another name, e.g. "onnx::MatMul_7 -> fc.weight (transposed)"
  std::vector<std::string> fused;    // patterns put back together, e.g. "fc: MatMul + Add -> linear"
  std::string cut_node;              // the node the cut resolved to ("" without a cut)
};

// Throws Error("[import] ...") listing every node it cannot import.
OnnxImport import_onnx(const OnnxGraph& graph, const OnnxImportOptions& options);

// The ONNX op types import_onnx reads, sorted (for --help and the docs).
std::vector<std::string> onnx_import_ops();

}  // namespace tandem
