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
  d.sequence = SequenceLength::Follows;  // value by value (softmax: row by row, a token's)
  return d;
}

// A normalisation over the last dimension with a scale ("weight") and a shift ("bias") per
// feature (batch_norm, layer_norm): elementwise in shape and cost, plus their gradients, one
// multiply-add and one add a value (3 FLOPs).
inline OpDef normalization(std::string name, double forward_flops_per_value, double backward_flops_per_value) {
  OpDef d = elementwise(std::move(name), forward_flops_per_value, backward_flops_per_value);
  d.cost = [elementwise_cost = d.cost](const NodeSpec& n, std::span<const Shape> in, const Shape& out) {
    OpCost c = elementwise_cost(n, in, out);
    c.backward_weights_flops = 3.0 * count(out);
    return c;
  };
  d.params = [](const NodeSpec&, std::span<const Shape> in) {
    const int64_t f = in[0][in[0].rank() - 1];
    return std::vector<ParamSpec>{{"weight", Shape{f}}, {"bias", Shape{f}}};
  };
  return d;
}

}  // namespace tandem::ops
