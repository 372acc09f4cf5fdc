// batch_norm over the last dimension (channels), as torch.nn.BatchNorm2d/1d: scale and shift
// trained, running statistics kept as buffers. Layer: batch_norm_layer.cpp.
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.batch_norm();
  if (!a) return;  // the defaults
  if (!(a->eps() > 0.0f)) ops::fail_attr(label, "batch_norm", cat("field 'batch_norm.eps' must be > 0, got ", a->eps()));
  if (!(a->momentum() >= 0.0f && a->momentum() <= 1.0f))
    ops::fail_attr(label, "batch_norm", cat("field 'batch_norm.momentum' must be in [0, 1], got ", a->momentum()));
  out.batch_norm = {a->eps(), a->momentum()};
}

}  // namespace

void define_batch_norm_op(OpTable& t) {
  // Statistics (a sum and a sum of squares), normalise and scale-shift a value; backward
  // two reductions and the input gradient's affine map; dgamma and dbeta one multiply-add each.
  OpDef d = ops::normalization("batch_norm", 7, 8);
  d.parse = parse;
  d.sequence = SequenceLength::Fixed;  // its statistics would count the padding
  d.torch_layout = [](const NodeSpec&, std::string_view) { return TorchLayout::InputChannels; };
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<BatchNormLayer>(node, in[0], backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
