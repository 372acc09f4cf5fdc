// tokens: an image [H, W, C] seen as a sequence of H*W tokens of C features (row-major
// positions, NHWC order), a view: no copy, no work. After a convolution of kernel = stride =
// patch it is a vision transformer's patch embedding (Hugging Face's ViT: a Conv2d, then
// flatten(2).transpose(1, 2), the same order).
#include "core/ops/op_support.h"
#include "core/ops/view.h"

namespace tandem {

void define_tokens_op(OpTable& t) {
  t.add(ops::view("tokens", [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 3);
    return Shape{in[0][0] * in[0][1], in[0][2]};
  }));
}

}  // namespace tandem
