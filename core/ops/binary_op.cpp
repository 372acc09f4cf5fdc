// binary: a + b, a - b, a * b or a / b elementwise (`binary: { mode }`), or a comparison
// (a == b, a != b, a < b, a > b, a <= b, a >= b: 1 where true, else 0, no gradient), the two
// per-sample shapes broadcast as numpy does: aligned on their last axes, each dimension equal
// or 1 (then repeated), the shorter one's missing leading axes repeated too. torch's
// arithmetic and comparisons of tensors: ONNX's Add, Sub, Mul and Div where no fused op (add,
// mul, linear's bias, the patterns) takes them; Equal, Less, Greater, LessOrEqual,
// GreaterOrEqual, Not (x == 0) and a Cast to bool (x != 0), whose 0/1 a where reads. With one
// input, the other operand is `scalar`, a constant (b; a with scalar_first: 1 - x, 1 / x)
// that does not train. Backward: each input's gradient, summed over the axes it was repeated
// on (a comparison's are 0). Layer: BinaryLayer (simple_layers.cpp), on
// VectorKernel::elementwise, sum_rows and permute, so every backend runs it.
#include <algorithm>
#include <cmath>

#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {

Shape operand_shape(const NodeSpec& n) {
  const auto& d = n.binary.operand;
  if (d.size() >= static_cast<std::size_t>(kMaxRank))
    ops::fail_node(n, cat("field 'binary.operand' has ", d.size(), " dimensions (1 to ", kMaxRank - 1, " a sample)"));
  for (std::size_t i = 0; i < d.size(); ++i)
    if (d[i] < 1 || d[i] > kMaxSampleElements)
      ops::fail_node(n, cat("field 'binary.operand' has dimension ", i, " of ", d[i], " (each 1 to ", kMaxSampleElements, ")"));
  int64_t dims[kMaxRank] = {};
  std::copy(d.begin(), d.end(), dims);
  const Shape s = Shape::of(dims, static_cast<int>(d.size()));
  if (!s.numel_at_most(kMaxSampleElements)) ops::fail_node(n, cat("field 'binary.operand' ", s.str(), " holds too many values"));
  return s;
}

void define_binary_op(OpTable& t) {
  OpDef d;
  d.name = "binary";
  // Fixed: broadcast, a [T] input may line up with another axis than the tokens (a mask over
  // a [T, T] score table), which length buckets would misread.
  d.parse = [](const spec::Node& node, NodeSpec& out, const std::string& label) {
    const auto* a = node.binary();
    std::string known;
    for (int m = 0; m < BinaryAttrs::kModes; ++m) known += cat(m ? ", " : "", "\"", binary_mode_name(static_cast<BinaryAttrs::Mode>(m)), "\"");
    if (!a || !a->mode()) ops::fail_attr(label, "binary", cat("missing field 'binary' (mode: one of ", known, ")"));
    const std::string mode = a->mode()->str();
    int at = 0;
    while (at < BinaryAttrs::kModes && mode != binary_mode_name(static_cast<BinaryAttrs::Mode>(at))) ++at;
    if (at == BinaryAttrs::kModes) ops::fail_attr(label, "binary", cat("field 'binary.mode' is '", mode, "' (one of ", known, ")"));
    out.binary.mode = static_cast<BinaryAttrs::Mode>(at);
    out.binary.has_scalar = a->scalar().has_value();
    out.binary.scalar = a->scalar().value_or(0.0f);
    out.binary.scalar_first = a->scalar_first();
    if (a->operand()) out.binary.operand.assign(a->operand()->begin(), a->operand()->end());
    out.binary.image_operand = a->image_operand();
    if (out.binary.image_operand && out.binary.operand.size() != 3)
      ops::fail_attr(label, "binary", cat("field 'binary.image_operand' needs an operand of 3 dimensions [H, W, C], got ",
                                          out.binary.operand.size()));
  };
  d.infer_shape = [](const NodeSpec& n, std::span<const Shape> in) {
    const bool operand = !n.binary.operand.empty();
    if (operand && n.binary.compares())
      ops::fail_node(n, cat("field 'binary.operand' with mode '", binary_mode_name(n.binary.mode),
                            "': a comparison passes no gradient, so its operand would never train (give 'scalar' or a second input)"));
    if (in.size() != 1 && in.size() != 2)
      ops::fail_node(n, cat("field 'inputs' needs 2 inputs (or 1 and field 'binary.scalar' or 'binary.operand'), got ", in.size()));
    if (in.size() == 1) {
      if (n.binary.has_scalar == operand)
        ops::fail_node(n, operand ? "fields 'binary.scalar' and 'binary.operand' both give the other operand; give one"
                                  : "one input, and no field 'binary.scalar' or 'binary.operand' (the other operand)");
      if (!operand) {
        if (!std::isfinite(n.binary.scalar)) ops::fail_node(n, cat("field 'binary.scalar' is ", n.binary.scalar, " (a finite number)"));
        return in[0];
      }
      return ops::broadcast(n, in[0], operand_shape(n));
    }
    if (n.binary.has_scalar || operand) ops::fail_node(n, "field 'binary.scalar' or 'binary.operand' is set, but the node has two inputs");
    if (n.binary.scalar_first) ops::fail_node(n, "field 'binary.scalar_first' is set, but the node has two inputs (no scalar)");
    return ops::broadcast(n, in[0], in[1]);
  };
  // An image's trained operand (binary.image_operand) is held [H, W, C] as the image is and
  // [C, H, W] in PyTorch (ConvNeXt's layer scale [C, 1, 1]); any other as PyTorch holds it.
  d.torch_layout = [](const NodeSpec& n, std::string_view field) {
    return field == "operand" && n.binary.image_operand ? TorchLayout::ImageOrder : TorchLayout::Same;
  };
  d.params = [](const NodeSpec& n, std::span<const Shape>) {
    if (n.binary.operand.empty()) return std::vector<ParamSpec>{};
    return std::vector<ParamSpec>{{"operand", operand_shape(n)}};
  };
  d.cost = [](const NodeSpec& n, std::span<const Shape> in, const Shape& out) {
    OpCost c;
    c.forward_flops = ops::count(out);
    if (n.binary.compares()) return c;  // no gradient
    const bool product = n.binary.mode == BinaryAttrs::Mode::mul || n.binary.mode == BinaryAttrs::Mode::div;
    // add, sub: the gradients are dy (summed where repeated); mul: dy b and dy a; div: dy / b
    // and -dy a / b^2 (4 a value)
    const double per_value = in.size() == 1 ? (product ? 1.0 : 0.0)
                             : n.binary.mode == BinaryAttrs::Mode::div ? 5.0
                             : product ? 2.0 : 0.0;
    c.backward_data_flops = per_value * ops::count(out);
    if (!n.binary.operand.empty())  // the trained operand's gradient: its product a value, and the sums
      c.backward_weights_flops = (n.binary.mode == BinaryAttrs::Mode::div ? 5.0 : product ? 2.0 : 1.0) * ops::count(out);
    return c;
  };
  d.make_layer = [](const GraphNode& node, std::span<const Shape>, Backend& backend, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<BinaryLayer>(node, backend);
  };
  t.add(std::move(d));
}

}  // namespace tandem
