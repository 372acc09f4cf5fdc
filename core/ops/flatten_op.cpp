// flatten: a sample's tensor seen as one vector (NHWC order), a view: no copy, no work.
// Interop maps a following linear layer's columns to PyTorch's CHW order.
#include "core/ops/op_support.h"
#include "core/ops/view.h"

namespace tandem {

void define_flatten_op(OpTable& t) {
  t.add(ops::view("flatten", [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 0);
    return Shape{in[0].numel()};
  }));
}

}  // namespace tandem
