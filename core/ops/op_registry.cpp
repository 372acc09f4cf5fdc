// The table of ops: every core/ops/*_op.cpp adds its definitions through the function the
// build lists in op_list_generated.h (core/sources.cmake globs the folder), so adding an op
// touches no file but its own.
#include <algorithm>
#include <mutex>

#include "core/activation.h"
#include "core/error.h"
#include "core/ops/op.h"

#define TANDEM_OP_FILE(stem) void define_##stem(tandem::OpTable&);
namespace tandem {
#include "core/ops/op_list_generated.h"
}  // namespace tandem
#undef TANDEM_OP_FILE

namespace tandem {
namespace {

const OpTable& table() {
  static const OpTable t = [] {
    OpTable t;
#define TANDEM_OP_FILE(stem) define_##stem(t);
#include "core/ops/op_list_generated.h"
#undef TANDEM_OP_FILE
    return t;
  }();
  return t;
}

double floats(std::span<const Shape> shapes) {
  double n = 0;
  for (const Shape& s : shapes) n += static_cast<double>(s.numel());
  return n;
}

}  // namespace

void OpTable::add(OpDef def) {
  for (const OpDef& d : defs_)
    if (d.name == def.name) fail("op registry", cat("op '", def.name, "' is defined twice"));
  if (!def.infer_shape || !def.cost || !def.make_layer)
    fail("op registry", cat("op '", def.name, "' lacks shape inference, cost or a layer"));
  defs_.push_back(std::move(def));
}

const OpDef* find_op(std::string_view name) {
  for (const OpDef& d : table().defs())
    if (d.name == name) return &d;
  return nullptr;
}

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const OpDef& d : table().defs()) n.push_back(d.name);
    std::sort(n.begin(), n.end());
    return n;
  }();
  return names;
}

const OpDef& op_def(std::string_view name) {
  if (const OpDef* d = find_op(name)) return *d;
  std::string known;
  for (const auto& n : op_names()) known += (known.empty() ? "" : ", ") + n;
  fail("op registry", cat("unknown op '", name, "' (known: ", known, ")"));
}

const Activation* find_activation(std::string_view op) {
  const OpDef* d = find_op(op);
  return d ? d->activation : nullptr;
}

std::vector<ParamSpec> op_params(const NodeSpec& node, std::span<const Shape> in) {
  const OpDef& d = op_def(node.op);
  return d.params ? d.params(node, in) : std::vector<ParamSpec>{};
}

OpCost op_cost(const NodeSpec& node, std::span<const Shape> in, const Shape& out) {
  const OpDef& d = op_def(node.op);
  OpCost c = d.cost(node, in, out);
  if (node.freeze) c.backward_weights_flops = 0.0;  // a frozen node computes no weight gradient
  if (!d.view && c.forward_bytes == 0 && c.backward_bytes == 0) {
    double params = 0;
    for (const ParamSpec& p : op_params(node, in)) params += static_cast<double>(p.shape.numel());
    const double x = floats(in), y = static_cast<double>(out.numel());
    c.forward_bytes = 4.0 * (x + y + params);  // read inputs and weights, write the output
    // read dy, the inputs and the weights; write dx, the weight gradients
    c.backward_bytes = 4.0 * (y + 2.0 * x + 2.0 * params);
  }
  return c;
}

}  // namespace tandem
