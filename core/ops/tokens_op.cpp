// tokens: an image [H, W, C] seen as a sequence of H*W tokens of C features (row-major
// positions, NHWC order), a view: no copy, no work. After a convolution of kernel = stride =
// patch it is a vision transformer's patch embedding (Hugging Face's ViT: a Conv2d, then
// flatten(2).transpose(1, 2), the same order).
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"

namespace tandem {

void define_tokens_op(OpTable& t) {
  OpDef d;
  d.name = "tokens";
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 3);
    return Shape{in[0][0] * in[0][1], in[0][2]};
  };
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape&) { return OpCost{}; };
  d.view = true;
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend&, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<ViewLayer>(node.spec.name);
  };
  t.add(std::move(d));
}

}  // namespace tandem
