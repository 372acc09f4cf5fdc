// layer_norm over the last dimension (features), as torch.nn.LayerNorm(features): the
// transformer's normalisation, per sample and per token. Scale and shift trained (ones and
// zeros at the start); no running statistics. Layer: layer_norm_layer.cpp.
#include "core/layers/layers.h"
#include "core/ops/elementwise.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.layer_norm();
  if (!a) return;  // the defaults
  if (!(a->eps() > 0.0f)) ops::fail_attr(label, "layer_norm", cat("field 'layer_norm.eps' must be > 0, got ", a->eps()));
  out.layer_norm = {a->eps()};
}

}  // namespace

void define_layer_norm_op(OpTable& t) {
  // Forward: a row's sum and sum of squares (2 a value), normalise (2), scale and shift (2).
  // Backward: dxhat = dy * gamma (1), its two row sums (3), the input gradient's affine map
  // (4); dgamma and dbeta one multiply-add and one add a value.
  OpDef d = ops::normalization("layer_norm", 6, 8);
  d.parse = parse;
  d.torch_layout = [](const NodeSpec&, std::string_view) { return TorchLayout::Same; };  // [features], as torch's
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<LayerNormLayer>(node, in[0], backend);
  };
  d.freezable = true;
  t.add(std::move(d));
}

}  // namespace tandem
