// The op registry: each op (or family) defined once, in one file core/ops/<name>_op.cpp,
// with everything the engine asks of it: attributes, shapes, cost, parameters, PyTorch layout
// and the layer it makes. Graph checks, the spec loader, planner, profiler and interop ask here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/model_spec.h"
#include "core/random.h"
#include "core/tensor.h"

namespace tandem {

namespace spec {
struct Node;
}
class Backend;
class Layer;
struct Activation;
struct GraphNode;

// Work of one sample through one node, for the planner and the profiler. A multiply-add is
// two FLOPs; elementwise ops count the arithmetic of their definition (relu: 1 a value).
// Bytes are what the pass reads and writes of activations, gradients and parameters (f32).
struct OpCost {
  double forward_flops = 0, backward_data_flops = 0, backward_weights_flops = 0;
  double forward_bytes = 0, backward_bytes = 0;
  double backward_flops() const { return backward_data_flops + backward_weights_flops; }
};

// One trained parameter: "<node>.<field>" and its shape, in initialisation order.
struct ParamSpec {
  std::string field;
  Shape shape;
};

// How a parameter is laid out in PyTorch, relative to tandem's NHWC/OHWI layout.
enum class TorchLayout {
  Same,           // identical
  ConvWeight,     // tandem [O, KH, KW, I], torch [O, I, KH, KW]
  InputColumns,   // columns index the input, which may be an NHWC image flattened (torch: CHW)
  InputChannels,  // one value per input element, which may be a flattened NHWC image
  ImageOrder,     // tandem [H, W, C] (an image's order), torch [C, H, W]
};

// How an op takes a sequence that runs shorter than the spec's length (length buckets,
// InputSpec::length_buckets). Graph::build refuses buckets on a model with a node that reads a
// sequence and is Fixed, as its output would change with the length.
enum class SequenceLength {
  Fixed,    // needs its inputs' shapes exactly as the spec has them
  Follows,  // per token: the output's first dimension is the length of its inputs' (all alike)
  Pools,    // reduces the tokens: any length in, an output that does not depend on it
};

struct OpDef {
  std::string name;
  // Reads and checks the op's attribute table of a binary spec node into `out`; errors
  // name the node (`label`) and the field. Null: the op has no attributes.
  std::function<void(const spec::Node& node, NodeSpec& out, const std::string& label)> parse;
  // Per-sample output shape from the per-sample input shapes; errors name the node.
  std::function<Shape(const NodeSpec& node, std::span<const Shape> in)> infer_shape;
  // FLOPs of one sample (`out` is the inferred output shape); bytes are filled in from the
  // shapes and parameters unless the op sets them (a view moves none).
  std::function<OpCost(const NodeSpec& node, std::span<const Shape> in, const Shape& out)> cost;
  // Trained parameters, in the order the layer initialises them. Null: none.
  std::function<std::vector<ParamSpec>(const NodeSpec& node, std::span<const Shape> in)> params;
  // PyTorch layout of a parameter field. Null: every field is Same.
  std::function<TorchLayout(const NodeSpec& node, std::string_view field)> torch_layout;
  // A view or an op applied per element / channel: a flattened image's layout passes through
  // it unchanged (interop looks through these for the image a linear layer reads).
  bool keeps_layout = false;
  // The output is the input seen with another shape (flatten): no work, no bytes moved.
  bool view = false;
  SequenceLength sequence = SequenceLength::Fixed;
  // How many heads the output holds side by side (the loss's groups). Null: 1.
  std::function<int64_t(const NodeSpec& node)> output_groups;
  // Its parameters can be frozen (NodeSpec::freeze): its layer computes no gradient for them.
  bool freezable = false;
  // An activation's math (core/activation.h), for the backends' kernels. Null: not one.
  const Activation* activation = nullptr;
  // The layer for a graph node, parameters initialised as PyTorch does from `rng`.
  std::function<std::unique_ptr<Layer>(const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng& rng)>
      make_layer;
};

// The op of that name, or an Error listing the known ones.
const OpDef& op_def(std::string_view name);
// The op of that name, or null.
const OpDef* find_op(std::string_view name);
// Every registered op's name, sorted.
const std::vector<std::string>& op_names();

// A node's cost per sample with bytes filled in (see OpCost).
OpCost op_cost(const NodeSpec& node, std::span<const Shape> in, const Shape& out);
// A node's trained parameters (none for ops without).
std::vector<ParamSpec> op_params(const NodeSpec& node, std::span<const Shape> in);

// What an op definition file adds itself with: core/ops/<stem>.cpp defines
// `void define_<stem>(OpTable&)`, found by the build (core/sources.cmake) from the file name.
class OpTable {
 public:
  void add(OpDef def);
  const std::vector<OpDef>& defs() const { return defs_; }

 private:
  std::vector<OpDef> defs_;
};

}  // namespace tandem
