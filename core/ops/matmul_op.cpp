// matmul: a @ b of two computed tensors, as torch.matmul and ONNX's MatMul where neither side
// is a stored weight (a weight makes a linear): per sample a [..., M, K] and b [..., K, N]
// give [..., M, N], the axes before the last two broadcast as numpy does (each equal or 1,
// the shorter's missing ones repeated): attention written by hand (q @ k^T, p @ v), a
// bilinear form. Backward: dA = dC B^T and dB = A^T dC, each summed over the axes its input
// repeats. Layer: MatmulLayer (simple_layers.cpp), on VectorKernel::matmul, so every backend
// runs it.
#include <algorithm>

#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"

namespace tandem {

void define_matmul_op(OpTable& t) {
  OpDef d;
  d.name = "matmul";
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    ops::expect_inputs(n, in, 2, 0);
    const Shape &a = in[0], &b = in[1];
    if (a.rank() < 2 || b.rank() < 2)
      ops::fail_node(n, cat("inputs of shapes ", a.str(), " and ", b.str(), " (matmul needs matrices: at least 2 axes a sample)"));
    if (a[a.rank() - 1] != b[b.rank() - 2])
      ops::fail_node(n, cat("inputs of shapes ", a.str(), " and ", b.str(), " (a's last axis, ", a[a.rank() - 1],
                            ", must be b's next to last, ", b[b.rank() - 2], ")"));
    const int rank = std::max(a.rank(), b.rank());
    int64_t out[kMaxRank];
    for (int i = 2; i < rank; ++i) {  // the axes before the matrices, from the last
      const int ia = a.rank() - 1 - i, ib = b.rank() - 1 - i;
      const int64_t x = ia >= 0 ? a[ia] : 1, y = ib >= 0 ? b[ib] : 1;
      if (x != y && x != 1 && y != 1)
        ops::fail_node(n, cat("inputs of shapes ", a.str(), " and ", b.str(), " do not broadcast (their axis ", -1 - i, " is ",
                              x, " and ", y, "; each must be equal or 1)"));
      out[rank - 1 - i] = std::max(x, y);
    }
    out[rank - 2] = a[a.rank() - 2];
    out[rank - 1] = b[b.rank() - 1];
    return Shape::of(out, rank);
  };
  d.cost = [](const NodeSpec&, std::span<const Shape> in, const Shape& out) {
    const double macs = ops::count(out) * static_cast<double>(in[0][in[0].rank() - 1]);
    OpCost c;
    c.forward_flops = 2.0 * macs;
    c.backward_data_flops = 4.0 * macs;  // dA and dB, each as many multiply-adds
    return c;
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<MatmulLayer>(node.spec.name, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
