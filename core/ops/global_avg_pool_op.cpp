// global_avg_pool: [H, W, C] -> [C], each channel's mean. Layer: GlobalAvgPoolLayer.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"

namespace tandem {

void define_global_avg_pool_op(OpTable& t) {
  OpDef d;
  d.name = "global_avg_pool";
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
           ops::expect_inputs(n, in, 1, 3);
           return Shape{in[0][2]};
         };
  d.cost = [](const NodeSpec&, std::span<const Shape> in, const Shape& out) {
           OpCost c;
           c.forward_flops = ops::count(in[0]) + ops::count(out);  // the sums, then a scale
           c.backward_data_flops = ops::count(in[0]);             // dy / (H * W) spread
           return c;
         };
  d.keeps_layout = false;
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
           return std::make_unique<GlobalAvgPoolLayer>(node.spec.name, in[0], backend);
         };
  t.add(std::move(d));
}

}  // namespace tandem
