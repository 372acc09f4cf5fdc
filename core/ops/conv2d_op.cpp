// conv2d: NHWC input, OHWI weight [out, kh, kw, in / groups], optional bias; dilation, stride,
// padding and channel groups (groups = channels: depthwise). A vector [C] is a 1x1 image
// [1, 1, C] (a globally pooled one: a squeeze-excitation's 1x1 convolutions) and gives a
// vector [out]. Layer: core/layers/conv2d_layer.
#include "core/layers/layers.h"
#include "core/ops/op.h"
#include "core/ops/op_support.h"
#include "schema/model_generated.h"

namespace tandem {
namespace {

void parse(const spec::Node& node, NodeSpec& out, const std::string& label) {
  const auto* a = node.conv2d();
  if (!a) ops::fail_attr(label, "conv2d", "missing field 'conv2d'");
  if (a->out_channels() <= 0)
    ops::fail_attr(label, "conv2d", cat("field 'conv2d.out_channels' must be > 0, got ", a->out_channels()));
  out.conv2d.out_channels = a->out_channels();
  if (!a->kernel() || a->kernel()->size() == 0) ops::fail_attr(label, "conv2d", "missing field 'conv2d.kernel'");
  out.conv2d.kernel = ops::read_pair(a->kernel(), {0, 0}, label, "conv2d.kernel", 1);
  out.conv2d.stride = ops::read_pair(a->stride(), {1, 1}, label, "conv2d.stride", 1);
  out.conv2d.padding = ops::read_pair(a->padding(), {0, 0}, label, "conv2d.padding", 0);
  out.conv2d.dilation = ops::read_pair(a->dilation(), {1, 1}, label, "conv2d.dilation", 1);
  if (a->groups() < 1 || a->out_channels() % a->groups() != 0)
    ops::fail_attr(label, "conv2d",
                   cat("field 'conv2d.groups' must be >= 1 and divide out_channels ", a->out_channels(), ", got ",
                       a->groups()));
  out.conv2d.groups = a->groups();
  out.conv2d.bias = a->bias();
}

Shape conv2d_image(const Shape& in) { return in.rank() == 1 ? Shape{1, 1, in[0]} : in; }

Shape infer(const NodeSpec& n, std::span<const Shape> in_shapes) {
  if (in_shapes.size() == 1 && in_shapes[0].rank() != 3 && in_shapes[0].rank() != 1)
    fail("graph", cat("node '", n.name, "' (conv2d): expects an image [H, W, C] or a pooled one [C], got ", in_shapes[0].str()));
  ops::expect_inputs(n, in_shapes, 1, 0);
  const Shape image = conv2d_image(in_shapes[0]);
  const std::span<const Shape> in(&image, 1);
  const Conv2dAttrs& a = n.conv2d;
  if (in[0][2] % a.groups != 0)
    fail("graph", cat("node '", n.name, "' (conv2d): ", a.groups, " groups do not divide its ", in[0][2],
                      " input channels"));
  int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    auto k = static_cast<std::size_t>(i);
    if (in[0][i] + 2 * a.padding[k] < a.dilation[k] * (a.kernel[k] - 1) + 1)
      fail("graph", cat("node '", n.name, "' (conv2d): kernel larger than the padded input ", in[0].str()));
    out[i] = (in[0][i] + 2 * a.padding[k] - a.dilation[k] * (a.kernel[k] - 1) - 1) / a.stride[k] + 1;
  }
  if (in_shapes[0].rank() == 1) {  // 1x1 in, 1x1 out: a vector again
    if (out[0] != 1 || out[1] != 1)
      fail("graph", cat("node '", n.name, "' (conv2d): on a pooled input [C] it must give 1x1, got ", out[0], "x", out[1],
                        " (its padding)"));
    return Shape{a.out_channels};
  }
  return Shape{out[0], out[1], a.out_channels};
}

// Each output value is a dot product over one group's input channels and the window; the
// input and weight gradients are the same products again.
OpCost cost(const NodeSpec& n, std::span<const Shape> in_shapes, const Shape& out) {
  const Shape image = conv2d_image(in_shapes[0]);
  const std::span<const Shape> in(&image, 1);
  const Conv2dAttrs& a = n.conv2d;
  const double macs = ops::count(out) * static_cast<double>(a.kernel[0] * a.kernel[1] * (in[0][2] / a.groups));
  OpCost c;
  c.forward_flops = c.backward_data_flops = c.backward_weights_flops = 2.0 * macs;
  if (a.bias) c.backward_weights_flops += ops::count(out);  // the bias gradient's sums
  return c;
}

std::vector<ParamSpec> params(const NodeSpec& n, std::span<const Shape> in_shapes) {
  const Shape image = conv2d_image(in_shapes[0]);
  const std::span<const Shape> in(&image, 1);
  const Conv2dAttrs& a = n.conv2d;
  std::vector<ParamSpec> p{{"weight", Shape{a.out_channels, a.kernel[0], a.kernel[1], in[0][2] / a.groups}}};
  if (a.bias) p.push_back({"bias", Shape{a.out_channels}});
  return p;
}

}  // namespace

void define_conv2d_op(OpTable& t) {
  OpDef d;
  d.name = "conv2d";
  d.parse = parse;
  d.infer_shape = infer;
  d.cost = cost;
  d.params = params;
  d.torch_layout = [](const NodeSpec&, std::string_view field) { return field == "weight" ? TorchLayout::ConvWeight : TorchLayout::Same; };
  d.make_layer = [](const GraphNode& node, std::span<const Shape> in, Backend& backend, Rng& rng) -> std::unique_ptr<Layer> {
           return std::make_unique<Conv2dLayer>(node, conv2d_image(in[0]), backend, rng);
         };
  d.freezable = true;
  t.add(std::move(d));
}

}  // namespace tandem
