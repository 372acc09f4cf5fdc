// max_pool2d and avg_pool2d: windows over NHWC images (stride defaults to the kernel,
// padding at most half the kernel; avg counts the padding, as PyTorch's default). Layers:
// MaxPool2dLayer (argmax payload per micro-batch) and AvgPool2dLayer (simple_layers.cpp).
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.pool();
  if (!a) ops::fail_attr(label, out.op, "missing field 'pool'");
  if (!a->kernel() || a->kernel()->size() == 0) ops::fail_attr(label, out.op, "missing field 'pool.kernel'");
  out.pool.kernel = ops::read_pair(a->kernel(), {0, 0}, label, "pool.kernel", 1);
  out.pool.stride = ops::read_pair(a->stride(), out.pool.kernel, label, "pool.stride", 1);
  out.pool.padding = ops::read_pair(a->padding(), {0, 0}, label, "pool.padding", 0);
  for (std::size_t i = 0; i < 2; ++i)
    if (out.pool.padding[i] * 2 > out.pool.kernel[i])
      ops::fail_attr(label, out.op, "field 'pool.padding' must be at most half the kernel");
}

Shape infer(const NodeSpec& n, std::span<const Shape> in) {
  ops::expect_inputs(n, in, 1, 3);
  const Pool2dAttrs& a = n.pool;
  int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    auto k = static_cast<std::size_t>(i);
    if (in[0][i] + 2 * a.padding[k] < a.kernel[k])
      fail("graph", cat("node '", n.name, "' (", n.op, "): window larger than the padded input ", in[0].str()));
    out[i] = (in[0][i] + 2 * a.padding[k] - a.kernel[k]) / a.stride[k] + 1;
  }
  return Shape{out[0], out[1], in[0][2]};
}

// A comparison or an add per window element, one more per output for the average's scale;
// backward routes (max) or spreads (avg) each output gradient over its window.
OpCost cost(const NodeSpec& n, std::span<const Shape>, const Shape& out) {
  const double window = static_cast<double>(n.pool.kernel[0] * n.pool.kernel[1]);
  OpCost c;
  c.forward_flops = ops::count(out) * (n.op == "avg_pool2d" ? window : window - 1.0);
  c.backward_data_flops = ops::count(out) * (n.op == "avg_pool2d" ? window : 1.0);
  return c;
}

OpDef pool(std::string name) {
  OpDef d;
  d.name = std::move(name);
  d.parse = parse;
  d.infer_shape = infer;
  d.cost = cost;
  return d;
}

}  // namespace

void define_pool2d_op(OpTable& t) {
  OpDef max = pool("max_pool2d");
  max.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<MaxPool2dLayer>(node, in[0], backend);
  };
  t.add(std::move(max));
  OpDef avg = pool("avg_pool2d");
  avg.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<AvgPool2dLayer>(node, in[0], backend);
  };
  t.add(std::move(avg));
}

}  // namespace tandem
