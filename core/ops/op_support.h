// Helpers the op definition files share: input checks and attribute readers whose errors
// name the node and the field, as every spec error does.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/tensor.h"

namespace tandem::ops {

// Fails unless the node has `count` inputs, the first of rank `rank` (0: any rank).
void expect_inputs(const NodeSpec& n, std::span<const Shape> in, std::size_t count, int rank);

// Reads an int-or-pair field: absent -> fallback, one value -> square, two -> (h, w); each
// value at least `min_value`.
Pair read_pair(const flatbuffers::Vector<int32_t>* v, Pair fallback, const std::string& label, std::string_view field,
               int64_t min_value);

// [[noreturn]] "[graph] node '<name>' (<op>): <text>", for a problem with a node's inputs.
[[noreturn]] void fail_node(const NodeSpec& n, const std::string& text);

// [[noreturn]] "<label> (<op>): <text>" from the model spec.
[[noreturn]] void fail_attr(const std::string& label, std::string_view op, const std::string& text);

// The shape a and b broadcast to as numpy does (aligned on their last axes, each dimension
// equal or 1); fails naming the node where they do not.
Shape broadcast(const NodeSpec& n, const Shape& a, const Shape& b);

// Elements of a shape as a double, for costs.
inline double count(const Shape& s) { return static_cast<double>(s.numel()); }

}  // namespace tandem::ops
