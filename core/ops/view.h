// How a view op defines itself (flatten, tokens): the output is the input seen with another
// shape, no work and no bytes moved; the network aliases the tensors (ViewLayer).
#pragma once

#include "core/layers/layers.h"
#include "core/ops/op.h"

namespace tandem::ops {

inline OpDef view(std::string name, std::function<Shape(const NodeSpec&, std::span<const Shape>)> infer) {
  OpDef d;
  d.name = std::move(name);
  d.infer_shape = std::move(infer);
  d.cost = [](const NodeSpec&, std::span<const Shape>, const Shape&) { return OpCost{}; };
  d.view = true;
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend&, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<ViewLayer>(node.spec.name);
  };
  return d;
}

}  // namespace tandem::ops
