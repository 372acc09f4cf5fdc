// How an elementwise op defines itself (relu, the activations, silu, dropout...): the shape
// passes through, the layout too, and the cost is a given count of FLOPs a value each way.
#pragma once

#include "core/ops/op.h"
#include "core/ops/op_support.h"

namespace tandem::ops {

inline OpDef elementwise(std::string name, double forward_flops_per_value, double backward_flops_per_value) {
  OpDef d;
  d.name = std::move(name);
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    expect_inputs(n, in, 1, 0);
    return in[0];
  };
  d.cost = [=](const NodeSpec&, std::span<const Shape>, const Shape& out) {
    OpCost c;
    c.forward_flops = forward_flops_per_value * count(out);
    c.backward_data_flops = backward_flops_per_value * count(out);
    return c;
  };
  d.keeps_layout = true;
  return d;
}

}  // namespace tandem::ops
