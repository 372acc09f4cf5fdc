// reshape: a sample seen with other dimensions, as many elements, in the same order (the
// batch stays first): torch's x.reshape(N, ...) / x.view and ONNX's Reshape of the per-sample
// dimensions, where no fused op takes the pattern. A view: no copy, no work; the gradient is
// the output's seen with the input's shape. Layer: ViewLayer.
#include "core/ops/op_support.h"
#include "core/ops/view.h"
#include "schema/model_generated.h"

namespace tandem {

void define_reshape_op(OpTable& t) {
  OpDef d = ops::view("reshape", [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 1, 0);
    const auto rank = static_cast<int>(n.reshape.size());
    if (rank == 0 || rank >= kMaxRank)
      ops::fail_node(n, cat("field 'reshape.shape' has ", rank, " dimensions (1 to ", kMaxRank - 1, " a sample)"));
    int64_t dims[kMaxRank] = {};
    for (int i = 0; i < rank; ++i) {
      if (n.reshape[static_cast<std::size_t>(i)] < 1)
        ops::fail_node(n, cat("field 'reshape.shape' has dimension ", i, " of ", n.reshape[static_cast<std::size_t>(i)],
                              " (each at least 1)"));
      dims[i] = n.reshape[static_cast<std::size_t>(i)];
    }
    const Shape out = Shape::of(dims, rank);
    if (!out.numel_at_most(in[0].numel()) || out.numel() != in[0].numel())
      ops::fail_node(n, cat("field 'reshape.shape' ", out.str(), " does not hold the ", in[0].numel(),
                            " elements of its input ", in[0].str()));
    return out;
  });
  d.parse = [](const spec::Node& node, NodeSpec& out, const std::string& label) {
    const auto* a = node.reshape();
    if (!a || !a->shape()) ops::fail_attr(label, "reshape", "missing field 'reshape' (shape: the per-sample dimensions)");
    out.reshape.assign(a->shape()->begin(), a->shape()->end());
  };
  t.add(std::move(d));
}

}  // namespace tandem
