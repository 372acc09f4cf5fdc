// ONNX import on models built here byte by byte (tests/e2e/onnx_import.sh takes torch's):
// the protobuf reader refuses every truncation and malformed field with its reason, the
// importer keeps module names and PyTorch's tensors, fuses MatMul + Add, and refuses every
// node it cannot take at once. And the spec's JSON writer reads back what it wrote.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"

#include "core/graph.h"
#include "core/interop/hugging_face.h"
#include "core/interop/onnx_import.h"
#include "core/interop/onnx_protobuf.h"
#include "core/interop/torch_layout.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "tests/test_support.h"

namespace tandem {
namespace {

using test::error_of;

// The protobuf wire format, enough to write ONNX models.
struct Pb {
  std::string b;
  void key(int field, int wire) { varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire)); }
  void varint(uint64_t v) {
    do {
      uint8_t byte = v & 0x7f;
      v >>= 7;
      b += static_cast<char>(byte | (v ? 0x80 : 0));
    } while (v);
  }
  Pb& num(int field, int64_t v) { key(field, 0); varint(static_cast<uint64_t>(v)); return *this; }
  Pb& str(int field, const std::string& s) { key(field, 2); varint(s.size()); b += s; return *this; }
  Pb& msg(int field, const Pb& m) { return str(field, m.b); }
  Pb& f32(int field, float v) {
    key(field, 5);
    char c[4];
    std::memcpy(c, &v, 4);
    b.append(c, 4);
    return *this;
  }
};

Pb tensor(const std::string& name, const std::vector<int64_t>& dims, float start = 0.1f) {
  Pb t;
  int64_t n = 1;
  for (int64_t d : dims) t.num(1, d), n *= d;
  t.num(2, 1).str(8, name);
  std::string raw(static_cast<std::size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = start + 0.01f * static_cast<float>(i % 17) - 0.05f * static_cast<float>(i % 5);
    std::memcpy(&raw[static_cast<std::size_t>(i) * 4], &v, 4);
  }
  return t.str(9, raw);
}
Pb ints_attr(const std::string& name, const std::vector<int64_t>& v) {
  Pb a;
  a.str(1, name);
  for (int64_t x : v) a.num(8, x);
  return a.num(20, 7);
}
Pb int_attr(const std::string& name, int64_t v) { return Pb().str(1, name).num(3, v).num(20, 2); }
Pb node(const std::string& name, const std::string& op, const std::vector<std::string>& in,
        const std::vector<std::string>& out, const std::vector<Pb>& attrs = {}) {
  Pb n;
  for (const auto& i : in) n.str(1, i);
  for (const auto& o : out) n.str(2, o);
  n.str(3, name).str(4, op);
  for (const Pb& a : attrs) n.msg(5, a);
  return n;
}
Pb value(const std::string& name, const std::vector<int64_t>& dims) {
  Pb shape;
  shape.msg(1, Pb().str(2, "batch"));
  for (int64_t d : dims) shape.msg(1, Pb().num(1, d));
  return Pb().str(1, name).msg(2, Pb().msg(1, Pb().num(1, 1).msg(2, shape)));
}
std::vector<uint8_t> model(const std::vector<Pb>& nodes, const std::vector<Pb>& weights,
                           const std::vector<int64_t>& image = {3, 8, 8}) {
  Pb g;
  for (const Pb& n : nodes) g.msg(1, n);
  for (const Pb& w : weights) g.msg(5, w);
  g.msg(11, value("image", image)).msg(12, value("logits", {5}));
  Pb m;
  m.num(1, 8).str(2, "pytorch").str(3, "1.13.1").msg(7, g).msg(8, Pb().num(2, 14));
  return std::vector<uint8_t>(m.b.begin(), m.b.end());
}

// A Constant node holding one float; its output is "<name>_out".
Pb scalar(const std::string& name, float v) {
  Pb t;
  t.num(2, 1).str(8, name);
  std::string raw(4, '\0');
  std::memcpy(raw.data(), &v, 4);
  return node(name, "Constant", {}, {cat(name, "_out")}, {Pb().str(1, "value").msg(5, t.str(9, raw)).num(20, 4)});
}

// conv (padded, biased) -> relu -> max pool -> flatten -> fc, as torch names a small CNN's.
std::vector<Pb> cnn_nodes(std::vector<Pb> conv_attrs = {ints_attr("pads", {1, 1, 1, 1}), ints_attr("strides", {1, 1})}) {
  return {node("/c1/Conv", "Conv", {"image", "c1.weight", "c1.bias"}, {"/c1/Conv_output_0"}, conv_attrs),
          node("/act/Relu", "Relu", {"/c1/Conv_output_0"}, {"/act/Relu_output_0"}),
          node("/pool/MaxPool", "MaxPool", {"/act/Relu_output_0"}, {"/pool/MaxPool_output_0"},
               {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2})}),
          node("/Flatten", "Flatten", {"/pool/MaxPool_output_0"}, {"/Flatten_output_0"}, {int_attr("axis", 1)}),
          node("/fc/Gemm", "Gemm", {"/Flatten_output_0", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)})};
}
std::vector<Pb> cnn_weights() {
  return {tensor("c1.weight", {4, 3, 3, 3}), tensor("c1.bias", {4}), tensor("fc.weight", {5, 64}), tensor("fc.bias", {5})};
}

OnnxImport import_bytes(const std::vector<uint8_t>& bytes, const std::string& cut = "") {
  const OnnxImportOptions o{"m.onnx", "m", cut};
  return import_onnx(parse_onnx(bytes, "m.onnx"), o);
}

TEST(OnnxImport, SmallCnnKeepsModuleNamesAndTorchTensors) {
  const OnnxImport imp = import_bytes(model(cnn_nodes(), cnn_weights()), "pool");
  ASSERT_EQ(imp.spec.nodes.size(), 5u);
  const char* names[] = {"c1", "act", "pool", "flatten", "fc"};
  const char* ops[] = {"conv2d", "relu", "max_pool2d", "flatten", "linear"};
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(imp.spec.nodes[i].name, names[i]);
    EXPECT_EQ(imp.spec.nodes[i].op, ops[i]);
  }
  EXPECT_EQ(imp.spec.inputs.at(0).shape, (Shape{8, 8, 3}));  // NCHW [3, 8, 8] -> a sample's HWC
  const Conv2dAttrs& c = imp.spec.nodes[0].conv2d;
  EXPECT_EQ(c.out_channels, 4);
  EXPECT_EQ(c.kernel, (Pair{3, 3}));
  EXPECT_EQ(c.padding, (Pair{1, 1}));
  EXPECT_TRUE(c.bias);
  EXPECT_EQ(imp.spec.nodes[2].pool.stride, (Pair{2, 2}));
  EXPECT_EQ(imp.spec.output, "fc");
  EXPECT_EQ(imp.cut_node, "pool");
  std::vector<std::string> tensors;
  for (const SafeTensor& t : imp.weights) tensors.push_back(t.name);
  EXPECT_EQ(tensors, (std::vector<std::string>{"c1.weight", "c1.bias", "fc.weight", "fc.bias"}));
  EXPECT_TRUE(imp.renamed.empty());

  // The JSON builds, and torch's tensors load into it (the conv's OIHW and the flatten's
  // (c, h, w) columns converted as for any torch file).
  const ModelSpec spec = parse_model_json(model_spec_json(imp.spec), "imported");
  EXPECT_EQ(spec.cut, "pool");
  const Graph graph = Graph::build(spec);
  auto backend = make_backend("reference");
  Network net(graph, *backend, 0);
  shard_from_torch(graph, imp.weights, net);
  EXPECT_EQ(net.param_count(), 4 * 27 + 4 + 5 * 64 + 5);
  EXPECT_EQ(graph.partition({"pool"}).size(), 2u);
}

TEST(OnnxImport, MatMulAndAddOfStoredTensorsBecomeOneLinear) {
  std::vector<Pb> nodes = cnn_nodes();
  nodes.pop_back();
  nodes.push_back(node("/fc/MatMul", "MatMul", {"/Flatten_output_0", "onnx::MatMul_9"}, {"/fc/MatMul_output_0"}));
  nodes.push_back(node("/fc/Add", "Add", {"fc.bias", "/fc/MatMul_output_0"}, {"logits"}));
  std::vector<Pb> weights = cnn_weights();
  weights[2] = tensor("onnx::MatMul_9", {64, 5});
  const OnnxImport imp = import_bytes(model(nodes, weights));
  ASSERT_EQ(imp.spec.nodes.size(), 5u);
  EXPECT_EQ(imp.spec.nodes[4].name, "fc");
  EXPECT_EQ(imp.spec.nodes[4].linear.out_features, 5);
  EXPECT_EQ(imp.spec.output, "fc");
  EXPECT_EQ(imp.fused, (std::vector<std::string>{"fc: MatMul + Add -> linear"}));
  EXPECT_EQ(imp.renamed, (std::vector<std::string>{"onnx::MatMul_9 -> fc.weight (transposed)"}));
  // Stored [in, out]; written [out, in] as nn.Linear holds it.
  const OnnxGraph g = parse_onnx(model(nodes, weights), "m.onnx");
  const SafeTensor& w = imp.weights[2];
  ASSERT_EQ(w.shape, (std::vector<int64_t>{5, 64}));
  const std::vector<float>& src = g.initializers[2].floats;
  float v;
  std::memcpy(&v, w.data.data() + (3 * 64 + 10) * 4, 4);
  EXPECT_EQ(v, src[10 * 5 + 3]);
}

TEST(OnnxImport, RefusesEveryNodeItCannotTakeAtOnce) {
  std::vector<Pb> nodes = cnn_nodes({ints_attr("pads", {1, 1, 0, 0})});
  nodes.insert(nodes.begin() + 2, node("/act/Erf", "Erf", {"/act/Relu_output_0"}, {"/act/Erf_output_0"}));
  nodes[3] = node("/pool/MaxPool", "MaxPool", {"/act/Erf_output_0"}, {"/pool/MaxPool_output_0"},
                  {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2})});
  EXPECT_EQ(error_of([&] { import_bytes(model(nodes, cnn_weights())); }),
            "[import] m.onnx: 2 problems (ops: Conv, Erf); tandem imports none of the model:\n"
            "  node '/c1/Conv' (Conv, module c1): pads [1, 1, 0, 0] differ before and after; tandem pads both sides alike\n"
            "  node '/act/Erf' (Erf, module act): tandem has no such op");
}

// A flattened image is ordered (h, w, c) in tandem and (c, h, w) in PyTorch: a linear reading
// it is permuted on load, but a sum or a join of it would mix the two, so they are refused;
// and an output no node makes.
TEST(OnnxImport, RefusesWhatWouldComputeSomethingElse) {
  std::vector<Pb> nodes = cnn_nodes();
  nodes[4] = node("/twice/Add", "Add", {"/Flatten_output_0", "/Flatten_output_0"}, {"/twice/Add_output_0"});
  nodes.push_back(node("/fc/Gemm", "Gemm", {"/twice/Add_output_0", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)}));
  EXPECT_EQ(error_of([&] { import_bytes(model(nodes, cnn_weights())); }),
            "[import] m.onnx: 1 problem (ops: Add); tandem imports none of the model:\n"
            "  node '/twice/Add' (Add, module twice): it adds a flattened image, whose values tandem orders (h, w, c) "
            "and PyTorch (c, h, w)");
  std::vector<Pb> headless = cnn_nodes();
  headless.pop_back();
  EXPECT_EQ(error_of([&] { import_bytes(model(headless, cnn_weights())); }),
            "[import] m.onnx: the output 'logits' is made by no node");
  std::vector<Pb> typed = cnn_nodes({Pb().str(1, "pads").num(3, 1).num(20, 2)});  // an INT where INTS belong
  EXPECT_EQ(error_of([&] { import_bytes(model(typed, cnn_weights())); }),
            "[import] m.onnx: 1 problem (ops: Conv); tandem imports none of the model:\n"
            "  node '/c1/Conv' (Conv, module c1): its attribute 'pads' is not of the type ONNX defines for it");
}

TEST(OnnxImport, RefusesInputsOfFreeSizeAndBadCuts) {
  EXPECT_EQ(error_of([&] { import_bytes(model(cnn_nodes(), cnn_weights(), {3, -1, 8})); }),
            "[import] m.onnx: input 'image' has dimension 2 (-1) of no fixed size; tandem's inputs have fixed shapes but "
            "the batch: export with a fixed size there (only dynamic_axes={'image': {0: 'batch'}})");
  EXPECT_EQ(error_of([&] { import_bytes(model(cnn_nodes(), cnn_weights()), "conv9"); }),
            "[import] m.onnx: --cut 'conv9' names no module or node (top-level modules: act, c1, fc, pool)");
}

// A tabular model: x [N, 4] -> LayerNorm as opset 14 decomposes it (Pow's exponent given) ->
// nn.Linear as training-mode export gives it for 3-D inputs (Transpose of the stored weight,
// MatMul, Add of the bias) -> logits [N, 3].
std::vector<uint8_t> tabular(float exponent) {
  const std::vector<Pb> nodes = {
      node("/ln/ReduceMean", "ReduceMean", {"x"}, {"m"}, {ints_attr("axes", {-1})}),
      node("/ln/Sub", "Sub", {"x", "m"}, {"d"}),
      scalar("/ln/Constant", exponent),
      node("/ln/Pow", "Pow", {"d", "/ln/Constant_out"}, {"p"}),
      node("/ln/ReduceMean_1", "ReduceMean", {"p"}, {"v"}, {ints_attr("axes", {-1})}),
      scalar("/ln/Constant_1", 1e-5f),
      node("/ln/Add", "Add", {"v", "/ln/Constant_1_out"}, {"e"}),
      node("/ln/Sqrt", "Sqrt", {"e"}, {"s"}),
      node("/ln/Div", "Div", {"d", "s"}, {"n"}),
      node("/ln/Mul", "Mul", {"n", "ln.weight"}, {"w"}),
      node("/ln/Add_1", "Add", {"w", "ln.bias"}, {"y"}),
      node("/fc/Transpose", "Transpose", {"fc.weight"}, {"wt"}),
      node("/fc/MatMul", "MatMul", {"y", "wt"}, {"mm"}),
      node("/fc/Add", "Add", {"fc.bias", "mm"}, {"logits"})};
  Pb g;
  for (const Pb& n : nodes) g.msg(1, n);
  for (const Pb& w : {tensor("ln.weight", {4}, 1.0f), tensor("ln.bias", {4}), tensor("fc.weight", {3, 4}), tensor("fc.bias", {3})})
    g.msg(5, w);
  g.msg(11, value("x", {4})).msg(12, value("logits", {3}));
  const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
  return std::vector<uint8_t>(b.begin(), b.end());
}

TEST(OnnxImport, DecomposedLayerNormAndTransposedLinearComeBack) {
  const OnnxImport imp = import_bytes(tabular(2.0f));
  ASSERT_EQ(imp.spec.nodes.size(), 2u);
  EXPECT_EQ(imp.spec.nodes[0].name, "ln");
  EXPECT_EQ(imp.spec.nodes[0].op, "layer_norm");
  EXPECT_FLOAT_EQ(imp.spec.nodes[0].layer_norm.eps, 1e-5f);
  EXPECT_EQ(imp.spec.nodes[1].name, "fc");
  EXPECT_EQ(imp.spec.nodes[1].op, "linear");
  EXPECT_EQ(imp.spec.nodes[1].linear.out_features, 3);
  EXPECT_EQ(imp.spec.output, "fc");
  EXPECT_TRUE(imp.renamed.empty());  // nn.Linear's weight, as stored: [out, in]
  ASSERT_EQ(imp.weights.size(), 4u);
  EXPECT_EQ(imp.weights[2].name, "fc.weight");
  EXPECT_EQ(imp.weights[2].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(imp.fused, (std::vector<std::string>{"ln: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add -> layer_norm",
                                                 "fc: MatMul + Add -> linear"}));
  const ModelSpec spec = parse_model_json(model_spec_json(imp.spec), "imported");
  const Graph graph = Graph::build(spec);
  auto backend = make_backend("reference");
  Network net(graph, *backend, 0);
  shard_from_torch(graph, imp.weights, net);

  // Anything but the pattern is not taken for it: the cube of the deviation is no LayerNorm.
  const std::string e = error_of([&] { import_bytes(tabular(3.0f)); });
  EXPECT_NE(e.find("1 problem (ops: ReduceMean)"), std::string::npos) << e;
  EXPECT_NE(e.find("  node '/ln/ReduceMean' (ReduceMean, module ln): a mean that does not start a LayerNorm"), std::string::npos) << e;
  // Its Pow and Div read what the refused mean made: not reported again.
  EXPECT_EQ(e.find("/ln/Div"), std::string::npos) << e;
  EXPECT_EQ(e.find("/ln/Pow"), std::string::npos) << e;
}

// GELU as torch writes it (x * 0.5 * (1 + erf(x / sqrt 2))) comes back as gelu; with another
// factor it is no GELU: its Div is a general binary and its Erf is refused.
TEST(OnnxImport, GeluIsFusedOnlyWithItsOwnConstants) {
  auto graph = [](float half) {
    const std::vector<Pb> nodes = {
        scalar("c0", 1.41421356f), node("/act/Div", "Div", {"x", "c0_out"}, {"d"}), node("/act/Erf", "Erf", {"d"}, {"e"}),
        scalar("c1", 1.0f), node("/act/Add", "Add", {"e", "c1_out"}, {"a"}), node("/act/Mul", "Mul", {"x", "a"}, {"m"}),
        scalar("c2", half), node("/act/Mul_1", "Mul", {"m", "c2_out"}, {"g"}),
        node("/fc/Gemm", "Gemm", {"g", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)})};
    Pb g;
    for (const Pb& n : nodes) g.msg(1, n);
    g.msg(5, tensor("fc.weight", {3, 4})).msg(5, tensor("fc.bias", {3}));
    g.msg(11, value("x", {4})).msg(12, value("logits", {3}));
    const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  const OnnxImport imp = import_bytes(graph(0.5f));
  ASSERT_EQ(imp.spec.nodes.size(), 2u);
  EXPECT_EQ(imp.spec.nodes[0].name, "act");
  EXPECT_EQ(imp.spec.nodes[0].op, "gelu");
  EXPECT_EQ(imp.fused, (std::vector<std::string>{"act: Div, Erf, Add, Mul, Mul -> gelu"}));
  const std::string e = error_of([&] { import_bytes(graph(0.4f)); });
  // x / sqrt 2 is then a general binary; the Erf, which only GELU's pattern takes, is refused.
  EXPECT_NE(e.find("1 problem (ops: Erf)"), std::string::npos) << e;
  EXPECT_NE(e.find("  node '/act/Erf' (Erf, module act): tandem has no such op"), std::string::npos) << e;
}

// An int64 Constant node; its output is "<name>_out".
Pb ints(const std::string& name, const std::vector<int64_t>& dims, const std::vector<int64_t>& v) {
  Pb t;
  for (int64_t d : dims) t.num(1, d);
  t.num(2, 7).str(8, name);
  std::string raw(v.size() * 8, '\0');
  if (!v.empty()) std::memcpy(raw.data(), v.data(), raw.size());
  return node(name, "Constant", {}, {cat(name, "_out")}, {Pb().str(1, "value").msg(5, t.str(9, raw)).num(20, 4)});
}

// GlobalMaxPool (an image's maximum over rows and columns, [N, C, 1, 1]) is a max reduce over
// the stored [H, W, C]'s first two axes, flattened as a vector.
TEST(OnnxImport, GlobalMaxPoolIsAMaxReduce) {
  Pb g;
  for (const Pb& n : {node("/pool/GlobalMaxPool", "GlobalMaxPool", {"image"}, {"p"}), node("/Flatten", "Flatten", {"p"}, {"f"}),
                      node("/fc/Gemm", "Gemm", {"f", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)})})
    g.msg(1, n);
  g.msg(5, tensor("fc.weight", {2, 3})).msg(5, tensor("fc.bias", {2}));
  g.msg(11, value("image", {3, 4, 4})).msg(12, value("logits", {2}));
  const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
  const std::string j = model_spec_json(import_bytes(std::vector<uint8_t>(b.begin(), b.end())).spec);
  EXPECT_NE(j.find(R"({ name: "pool.globalmaxpool", op: "reduce", inputs: ["image"], reduce: { mode: "max", axes: [0, 1] } })"), std::string::npos) << j;
}

// Arithmetic and gathers no pattern takes: x (records [24] seen as [4, 6]) times its rows' sums [4, 1]
// (broadcast), minus 1 (a scalar), its last feature gathered (x[:, :, -1]: a slice and a
// view), a run of tokens (x[:, [1, 2]]); what they cannot take is refused by name.
TEST(OnnxImport, ArithmeticAndGathersOutsidePatternsAreGeneralOps) {
  auto graph = [](const std::vector<Pb>& extra, const std::string& out, std::vector<int64_t> out_dims) {
    std::vector<Pb> nodes = {ints("shape", {3}, {0, 4, 6}), node("/Reshape", "Reshape", {"r", "shape_out"}, {"x"})};
    nodes.insert(nodes.end(), extra.begin(), extra.end());
    nodes.push_back(node("/fc/MatMul", "MatMul", {out, "fc.weight"}, {"logits"}));
    Pb g;
    for (const Pb& n : nodes) g.msg(1, n);
    g.msg(5, tensor("fc.weight", {out_dims.back(), 3})).msg(5, tensor("block.gamma", {6}));
    g.msg(11, value("r", {24})).msg(12, value("logits", {}));
    const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  const std::vector<Pb> arith = {ints("axes", {1}, {-1}),
                                 node("/ReduceSum", "ReduceSum", {"x", "axes_out"}, {"s"}, {int_attr("keepdims", 1)}),
                                 node("/Mul", "Mul", {"x", "s"}, {"p"}), scalar("one", 1.0f),
                                 node("/Sub", "Sub", {"p", "one_out"}, {"d"})};
  const OnnxImport imp = import_bytes(graph(arith, "d", {4, 6}));
  ASSERT_GE(imp.spec.nodes.size(), 4u);
  EXPECT_EQ(model_spec_json(imp.spec).find(R"({ name: "mul", op: "binary", inputs: ["reshape", "reducesum.keepdims"], binary: { mode: "mul" } })") !=
                std::string::npos, true) << model_spec_json(imp.spec);
  EXPECT_NE(model_spec_json(imp.spec).find(R"({ name: "sub", op: "binary", inputs: ["mul"], binary: { mode: "sub", scalar: 1 } })"),
            std::string::npos) << model_spec_json(imp.spec);
  // A state-dict parameter beside the tensor: a trained operand under its own name (a layer scale).
  const std::vector<Pb> scale = {node("/block/Mul", "Mul", {"block.gamma", "x"}, {"g"})};
  const std::string sj = model_spec_json(import_bytes(graph(scale, "g", {4, 6})).spec);
  EXPECT_NE(sj.find(R"({ name: "block.mul", op: "binary", inputs: ["reshape"], binary: { mode: "mul", operand: [6] }, )"
                    R"(torch_names: [{ field: "operand", name: "block.gamma" }] })"),
            std::string::npos) << sj;
  std::vector<Pb> last = {ints("k", {}, {-1}), node("/Gather", "Gather", {"x", "k_out"}, {"g"}, {int_attr("axis", 2)})};
  const std::string lj = model_spec_json(import_bytes(graph(last, "g", {4})).spec);
  EXPECT_NE(lj.find(R"({ name: "gather", op: "slice", inputs: ["reshape"], slice: { axis: 1, start: 5, end: 6 } })"), std::string::npos) << lj;
  EXPECT_NE(lj.find(R"({ name: "reshape_1", op: "reshape", inputs: ["gather"], reshape: { shape: [4] } })"), std::string::npos) << lj;
  std::vector<Pb> run = {ints("k", {2}, {1, 2}), node("/Gather", "Gather", {"x", "k_out"}, {"g"}, {int_attr("axis", 1)})};
  const std::string rj = model_spec_json(import_bytes(graph(run, "g", {2, 6})).spec);
  EXPECT_NE(rj.find(R"({ name: "gather", op: "slice", inputs: ["reshape"], slice: { axis: 0, start: 1, end: 3 } })"), std::string::npos) << rj;
  struct Case {
    std::vector<Pb> nodes;
    std::string want;
  };
  const std::vector<Case> refused = {
      {{ints("k", {2}, {0, 2}), node("/Gather", "Gather", {"x", "k_out"}, {"g"}, {int_attr("axis", 1)})},
       "node '/Gather' (Gather): it gathers indices that are not a run (a, a+1, ..., b-1); tandem slices runs"},
      {{ints("k", {}, {6}), node("/Gather", "Gather", {"x", "k_out"}, {"g"}, {int_attr("axis", 2)})},
       "node '/Gather' (Gather): its index 6 is outside the axis's 6"},
      {{ints("k", {}, {0}), node("/Gather", "Gather", {"x", "k_out"}, {"g"}, {int_attr("axis", 0)})},
       "node '/Gather' (Gather): it gathers along axis 0 (the batch, or outside the tensor's 3)"},
      {{ints("axes", {1}, {-1}), node("/ReduceSum", "ReduceSum", {"x", "axes_out"}, {"s"}, {int_attr("keepdims", 0)}),
        node("/Add", "Add", {"x", "s"}, {"g"})},
       "node '/Add' (Add): it adds tensors of 3 and 2 dimensions; broadcast, their batch axes would not line up"},
      {{node("/Mul", "Mul", {"x", "fc.weight"}, {"g"})},
       "node '/Mul' (Mul): its trained operand 'fc.weight' of 6 at axis 1 does not broadcast with 4"},
  };
  for (const Case& c : refused) {
    const std::string e = error_of([&] { import_bytes(graph(c.nodes, "g", {6})); });
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
  }
}
// Comparisons, Where and Expand no pattern takes are tandem's binary comparisons, where and
// expand: x [4, 6] less than its rows' sums repeated over the columns (ReduceSum, Unsqueeze,
// Expand), masked with -inf where it is not (masked_fill), leaky where x > 0 fails, the two
// kept where either (Or) holds; what they cannot compute is refused by name.
TEST(OnnxImport, ComparisonsWhereAndExpandOutsidePatternsAreGeneralOps) {
  auto graph = [](const std::vector<Pb>& extra, const std::string& out, int64_t features) {
    std::vector<Pb> nodes = {ints("shape", {3}, {0, 4, 6}), node("/Reshape", "Reshape", {"r", "shape_out"}, {"x"})};
    nodes.insert(nodes.end(), extra.begin(), extra.end());
    nodes.push_back(node("/fc/MatMul", "MatMul", {out, "fc.weight"}, {"logits"}));
    Pb g;
    for (const Pb& n : nodes) g.msg(1, n);
    g.msg(5, tensor("fc.weight", {features, 3})).msg(5, tensor("mask.grid", {4, 6})).msg(5, tensor("mask.one", {1, 1, 1, 1}));
    g.msg(11, value("r", {24})).msg(12, value("logits", {}));
    const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  const std::vector<Pb> picks = {
      ints("axes", {1}, {-1}), node("/ReduceSum", "ReduceSum", {"x", "axes_out"}, {"s"}, {int_attr("keepdims", 0)}),
      ints("at", {1}, {2}), node("/Unsqueeze", "Unsqueeze", {"s", "at_out"}, {"s1"}),
      ints("to", {3}, {1, 1, 6}), node("/Expand", "Expand", {"s1", "to_out"}, {"e"}),
      node("/Less", "Less", {"x", "e"}, {"below"}), scalar("ninf", -INFINITY),
      node("/Where", "Where", {"below", "x", "ninf_out"}, {"masked"}),
      scalar("zero", 0.0f), node("/Greater", "Greater", {"zero_out", "x"}, {"negative"}),  // 0 > x: x < 0
      scalar("tenth", 0.1f), node("/Mul", "Mul", {"x", "tenth_out"}, {"leak"}),
      node("/Where_1", "Where", {"negative", "leak", "masked"}, {"w"}),
      node("/Or", "Or", {"below", "negative"}, {"either"}), node("/Cast", "Cast", {"either"}, {"kept"}, {int_attr("to", 1)}),
      node("/Mul_1", "Mul", {"w", "kept"}, {"y"})};
  // Split into slices; a scale computed from constants (Cast, Pow, Reciprocal) folded at import
  const std::vector<Pb> parts = {
      ints("parts", {2}, {2, 4}), node("/Split", "Split", {"x", "parts_out"}, {"a", "b"}, {int_attr("axis", -1)}),
      ints("four", {}, {4}), node("/Cast", "Cast", {"four_out"}, {"f"}, {int_attr("to", 1)}), scalar("half", 0.5f),
      node("/Pow", "Pow", {"f", "half_out"}, {"root"}), node("/Reciprocal", "Reciprocal", {"root"}, {"inv"}),
      node("/Mul", "Mul", {"b", "inv"}, {"y"})};
  const std::string pj = model_spec_json(import_bytes(graph(parts, "y", 4)).spec);
  EXPECT_NE(pj.find(R"({ name: "split_1", op: "slice", inputs: ["reshape"], slice: { axis: 1, start: 2, end: 6 } })"),
            std::string::npos) << pj;
  EXPECT_NE(pj.find(R"({ name: "mul", op: "binary", inputs: ["split_1"], binary: { mode: "mul", scalar: 0.5 } })"),
            std::string::npos) << pj;
  const OnnxImport imp = import_bytes(graph(picks, "y", 6));
  const std::string sj = model_spec_json(imp.spec);
  for (const char* want : {R"({ name: "unsqueeze", op: "reshape", inputs: ["reducesum"], reshape: { shape: [4, 1] } })",
                           R"({ name: "expand", op: "expand", inputs: ["unsqueeze"], expand: { shape: [4, 6] } })",
                           R"({ name: "less", op: "binary", inputs: ["reshape", "expand"], binary: { mode: "less" } })",
                           R"({ name: "where", op: "where", inputs: ["less", "reshape"], where: { b: -inf } })",
                           R"({ name: "greater", op: "binary", inputs: ["reshape"], binary: { mode: "less", scalar: 0 } })",
                           R"({ name: "where_1", op: "where", inputs: ["greater", "mul", "where"] })",
                           R"({ name: "or", op: "binary", inputs: ["less", "greater"], binary: { mode: "add" } })",
                           R"({ name: "or_1", op: "binary", inputs: ["or"], binary: { mode: "greater", scalar: 0 } })",
                           R"({ name: "mul_1", op: "mul", inputs: ["where_1", "or_1"] })"})
    EXPECT_NE(sj.find(want), std::string::npos) << want << "\n" << sj;
  struct Case {
    std::vector<Pb> nodes;
    std::string want;
  };
  const std::vector<Case> refused = {
      {{node("/Where", "Where", {"mask.grid", "x", "x"}, {"g"})},
       "node '/Where' (Where): its condition is a constant of the graph; tandem selects by a condition computed from the "
       "batch (a comparison of tensors)"},
      {{node("/Greater", "Greater", {"x", "x"}, {"c"}), node("/Where", "Where", {"c", "x", "mask.grid"}, {"g"})},
       "node '/Where' (Where): it selects from a constant of 24 values; tandem selects a constant scalar or a computed tensor"},
      {{node("/Greater", "Greater", {"x", "x"}, {"c"}), node("/Where", "Where", {"c", "x", "mask.one"}, {"g"})},
       "node '/Where' (Where): it selects a constant of 4 dimensions, more than the condition's 3 (its output would gain axes "
       "before the batch)"},
      {{ints("to", {3}, {1, 4, 12}), node("/Expand", "Expand", {"x", "to_out"}, {"g"})},
       "node '/Expand' (Expand): it expands axis 2 of 6 to 12; only an axis of 1 repeats"},
      {{ints("to", {3}, {2, 4, 6}), node("/Expand", "Expand", {"x", "to_out"}, {"g"})},
       "node '/Expand' (Expand): it expands the batch axis; tandem keeps each sample's values apart"},
      {{ints("to", {2}, {1, 6}), node("/Expand", "Expand", {"x", "to_out"}, {"g"})},
       "node '/Expand' (Expand): it expands a tensor of 3 dimensions to 2; tandem keeps the batch first (a shape of as many "
       "dimensions)"},
      {{node("/Cast", "Cast", {"x"}, {"g"}, {int_attr("to", 7)})},
       "node '/Cast' (Cast): it casts a computed tensor to ONNX type 7; tandem computes on floats and casts comparisons' "
       "results (0/1) only"},
      {{node("/Not", "Not", {"x"}, {"g"})},
       "node '/Not' (Not): its input 0 is not a comparison's result; tandem computes logic on comparisons of tensors only"},
      // a stored tensor sliced is no constant: it may train (read as one, it would not)
      {{ints("s0", {1}, {0}), ints("s1", {1}, {1}), node("/Slice", "Slice", {"mask.one", "s0_out", "s1_out"}, {"one"}),
        node("/Mul", "Mul", {"x", "one"}, {"g"})},
       "node '/Mul' (Mul): input 'one' is computed from a stored tensor; tandem reads such a value only as a causal mask (a "
       "buffer sliced to the tokens), never as a constant that would not train"},
      {{ints("parts", {2}, {2, 3}), node("/Split", "Split", {"x", "parts_out"}, {"g", "h"}, {int_attr("axis", 2)})},
       "node '/Split' (Split): its sizes add up to 5, not the axis's 6"},
      {{ints("parts", {2}, {3, 3}), node("/Split", "Split", {"x", "parts_out"}, {"g", "h"}, {int_attr("axis", 0)})},
       "node '/Split' (Split): it splits the batch; tandem keeps each sample whole"},
      {{ints("at", {1}, {0}), node("/Squeeze", "Squeeze", {"x", "at_out"}, {"g"})},
       "node '/Squeeze' (Squeeze): it squeezes the batch axis; tandem keeps each sample's values apart"},
      {{ints("at", {1}, {1}), node("/Squeeze", "Squeeze", {"x", "at_out"}, {"g"})},
       "node '/Squeeze' (Squeeze): it squeezes axis 1, which is not 1"},
  };
  for (const Case& c : refused) {
    const std::string e = error_of([&] { import_bytes(graph(c.nodes, "g", 6)); });
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
  }
}
// MaxPool's ceil_mode=1 is taken where rounding up adds no window (2x2 windows over 8 pixels:
// 4 either way; SqueezeNet's 3x3 at stride 2 over 15, 7 and 3) and refused where it adds one,
// which tandem's windows would not compute.
TEST(OnnxImport, CeilModeIsTakenWhereItAddsNoWindow) {
  auto with_pool = [](int64_t kernel) {
    std::vector<Pb> nodes = cnn_nodes();
    nodes[2] = node("/pool/MaxPool", "MaxPool", {"/act/Relu_output_0"}, {"/pool/MaxPool_output_0"},
                    {ints_attr("kernel_shape", {kernel, kernel}), ints_attr("strides", {2, 2}), int_attr("ceil_mode", 1)});
    return model(nodes, cnn_weights());
  };
  const OnnxImport imp = import_bytes(with_pool(2));
  EXPECT_EQ(imp.spec.nodes.at(2).op, "max_pool2d");
  EXPECT_EQ(imp.spec.nodes.at(2).pool.kernel, (Pair{2, 2}));
  const std::string e = error_of([&] { import_bytes(with_pool(3)); });
  EXPECT_NE(e.find("node '/pool/MaxPool' (MaxPool, module pool): ceil_mode=1 adds a window over its height of 8 (4 windows "
                   "rather than 3); tandem's windows floor the output size, so it takes ceil_mode only where rounding up "
                   "adds none"), std::string::npos) << e;
}

Pb typed_value(const std::string& name, int type, const std::vector<int64_t>& dims) {
  Pb shape;
  shape.msg(1, Pb().str(2, "batch"));
  for (int64_t d : dims) shape.msg(1, Pb().num(1, d));
  return Pb().str(1, name).msg(2, Pb().msg(1, Pb().num(1, type).msg(2, shape)));
}

// One BERT-style self-attention as torch writes it out: ids [N, 4] -> embedding [N, 4, 8] ->
// query, key, value (Transpose, MatMul, Add), viewed as 2 heads of 4 (the query's shape a
// constant [0, 0, 2, 4]; the key's computed: Shape, Gather, Unsqueeze, Concat), permuted, the
// scores divided by `divisor`, plus the mask (Unsqueeze twice, Cast, 1 - mask when `inverted`,
// times -1e4), Softmax, times the values, permuted back, reshaped, the first token, a linear.
// `keys_in_two_steps`: the keys permuted as the query, then their last two axes swapped (as
// Hugging Face's k.transpose(-1, -2) after the view), instead of in one permutation.
// `causal`: a stored [1, 4, 4] added after the mask, -inf above the diagonal (1: a causal mask)
// or below it (2: not one).
std::vector<uint8_t> attention_model(float divisor, bool inverted, bool keys_in_two_steps = false, float big = -10000.0f,
                                     bool mask_summed_too = false, int causal = 0) {
  std::vector<Pb> n = {node("/emb/Gather", "Gather", {"emb.weight", "ids"}, {"x"})};
  for (const std::string w : {"q", "k", "v"}) {
    n.push_back(node(cat("/att/", w, "/Transpose"), "Transpose", {cat("att.", w, ".weight")}, {cat(w, "_wt")}, {ints_attr("perm", {1, 0})}));
    n.push_back(node(cat("/att/", w, "/MatMul"), "MatMul", {"x", cat(w, "_wt")}, {cat(w, "_mm")}));
    n.push_back(node(cat("/att/", w, "/Add"), "Add", {cat("att.", w, ".bias"), cat(w, "_mm")}, {w}));
  }
  n.push_back(ints("/att/heads", {4}, {0, 0, 2, 4}));
  n.push_back(node("/att/Reshape", "Reshape", {"q", "/att/heads_out"}, {"qh"}));
  n.push_back(node("/att/Transpose", "Transpose", {"qh"}, {"qt"}, {ints_attr("perm", {0, 2, 1, 3})}));
  n.push_back(node("/att/Shape", "Shape", {"k"}, {"ks"}));
  n.push_back(ints("/att/zero", {}, {0}));
  n.push_back(node("/att/Gather", "Gather", {"ks", "/att/zero_out"}, {"kb"}, {int_attr("axis", 0)}));
  n.push_back(ints("/att/axes", {1}, {0}));
  n.push_back(node("/att/Unsqueeze", "Unsqueeze", {"kb", "/att/axes_out"}, {"kb1"}));
  n.push_back(ints("/att/rest", {3}, {4, 2, 4}));
  n.push_back(node("/att/Concat", "Concat", {"kb1", "/att/rest_out"}, {"kshape"}, {int_attr("axis", 0)}));
  n.push_back(node("/att/Reshape_1", "Reshape", {"k", "kshape"}, {"kh"}));
  if (keys_in_two_steps) {
    n.push_back(node("/att/Transpose_1", "Transpose", {"kh"}, {"kf"}, {ints_attr("perm", {0, 2, 1, 3})}));
    n.push_back(node("/att/Transpose_4", "Transpose", {"kf"}, {"kt"}, {ints_attr("perm", {0, 1, 3, 2})}));
  } else {
    n.push_back(node("/att/Transpose_1", "Transpose", {"kh"}, {"kt"}, {ints_attr("perm", {0, 2, 3, 1})}));
  }
  n.push_back(node("/att/Reshape_2", "Reshape", {"v", "/att/heads_out"}, {"vh"}));
  n.push_back(node("/att/Transpose_2", "Transpose", {"vh"}, {"vt"}, {ints_attr("perm", {0, 2, 1, 3})}));
  n.push_back(ints("/m/a1", {1}, {1}));
  n.push_back(node("/m/Unsqueeze", "Unsqueeze", {"mask", "/m/a1_out"}, {"m1"}));
  n.push_back(ints("/m/a2", {1}, {2}));
  n.push_back(node("/m/Unsqueeze_1", "Unsqueeze", {"m1", "/m/a2_out"}, {"m2"}));
  n.push_back(node("/m/Cast", "Cast", {"m2"}, {"m3"}, {int_attr("to", 1)}));
  n.push_back(scalar("/m/one", 1.0f));
  if (inverted) n.push_back(node("/m/Sub", "Sub", {"/m/one_out", "m3"}, {"m4"}));
  n.push_back(scalar("/m/big", big));
  n.push_back(node("/m/Mul", "Mul", {inverted ? "m4" : "m3", "/m/big_out"}, {"madd"}));
  n.push_back(node("/att/MatMul", "MatMul", {"qt", "kt"}, {"sc"}));
  n.push_back(scalar("/att/scale", divisor));
  n.push_back(node("/att/Div", "Div", {"sc", "/att/scale_out"}, {"sd"}));
  n.push_back(node("/att/Add", "Add", {"sd", "madd"}, {causal ? "sm0" : "sm"}));
  if (causal) n.push_back(node("/att/Add_1", "Add", {"sm0", "att.causal"}, {"sm"}));
  n.push_back(node("/att/Softmax", "Softmax", {"sm"}, {"p"}, {int_attr("axis", -1)}));
  n.push_back(node("/att/MatMul_1", "MatMul", {"p", "vt"}, {"c"}));
  n.push_back(node("/att/Transpose_3", "Transpose", {"c"}, {"ct"}, {ints_attr("perm", {0, 2, 1, 3})}));
  n.push_back(ints("/att/back", {3}, {0, 0, 8}));
  n.push_back(node("/att/Reshape_3", "Reshape", {"ct", "/att/back_out"}, {"ctx"}));
  n.push_back(node("/pool/Gather", "Gather", {"ctx", "/att/zero_out"}, {"first"}, {int_attr("axis", 1)}));
  if (mask_summed_too) {  // the first token times the mask's sum: a second reader of the mask
    n.push_back(ints("/sum/axes", {1}, {1}));
    n.push_back(node("/sum/ReduceSum", "ReduceSum", {"mask", "/sum/axes_out"}, {"kept"}));
    n.push_back(node("/sum/Mul", "Mul", {"first", "kept"}, {"scaled"}));
  }
  n.push_back(node("/fc/Gemm", "Gemm", {mask_summed_too ? "scaled" : "first", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)}));
  Pb g;
  for (const Pb& x : n) g.msg(1, x);
  g.msg(5, tensor("emb.weight", {10, 8}));
  for (const std::string w : {"q", "k", "v"}) g.msg(5, tensor(cat("att.", w, ".weight"), {8, 8})).msg(5, tensor(cat("att.", w, ".bias"), {8}));
  g.msg(5, tensor("fc.weight", {3, 8})).msg(5, tensor("fc.bias", {3}));
  if (causal) {
    Pb t;
    t.num(1, 1).num(1, 4).num(1, 4).num(2, 1).str(8, "att.causal");
    std::string raw(64, '\0');
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) {
        const float v = (causal == 1 ? c > r : c < r) ? -INFINITY : 0.0f;
        std::memcpy(&raw[static_cast<std::size_t>(r * 4 + c) * 4], &v, 4);
      }
    g.msg(5, t.str(9, raw));
  }
  g.msg(11, typed_value("ids", 7, {4})).msg(11, typed_value("mask", 7, {4})).msg(12, value("logits", {3}));
  const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
  return std::vector<uint8_t>(b.begin(), b.end());
}

// The floats of an imported tensor.
std::vector<float> floats_of(const OnnxImport& imp, const std::string& name) {
  for (const SafeTensor& t : imp.weights)
    if (t.name == name) {
      std::vector<float> v(t.data.size() / 4);
      std::memcpy(v.data(), t.data.data(), t.data.size());
      return v;
    }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

// What the ONNX graph of attention_model computes, written out: one sample's logits.
std::vector<float> attention_by_hand(const OnnxImport& imp, const float* ids, const float* mask) {
  const int T = 4, F = 8, H = 2, D = 4;
  const std::vector<float> emb = floats_of(imp, "emb.weight"), fc = floats_of(imp, "fc.weight"), fcb = floats_of(imp, "fc.bias");
  std::vector<float> x(T * F), q(T * F), k(T * F), v(T * F), ctx(T * F, 0.0f);
  for (int t = 0; t < T; ++t)
    for (int f = 0; f < F; ++f) x[t * F + f] = emb[static_cast<std::size_t>(ids[t]) * F + f];
  for (auto [out, w] : {std::pair{&q, "att.q"}, std::pair{&k, "att.k"}, std::pair{&v, "att.v"}}) {
    const std::vector<float> W = floats_of(imp, cat(w, ".weight")), b = floats_of(imp, cat(w, ".bias"));
    for (int t = 0; t < T; ++t)
      for (int o = 0; o < F; ++o) {
        double s = b[o];
        for (int i = 0; i < F; ++i) s += static_cast<double>(x[t * F + i]) * W[o * F + i];
        (*out)[t * F + o] = static_cast<float>(s);
      }
  }
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < T; ++t) {
      double scores[T], total = 0.0, top = -1e30;
      for (int s = 0; s < T; ++s) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(q[t * F + h * D + d]) * k[s * F + h * D + d];
        scores[s] = dot / 2.0 + (1.0 - mask[s]) * -10000.0;
        top = std::max(top, scores[s]);
      }
      for (double& s : scores) total += (s = std::exp(s - top));
      for (int d = 0; d < D; ++d) {
        double c = 0.0;
        for (int s = 0; s < T; ++s) c += scores[s] / total * v[s * F + h * D + d];
        ctx[t * F + h * D + d] = static_cast<float>(c);
      }
    }
  std::vector<float> logits(3);
  for (int o = 0; o < 3; ++o) {
    double s = fcb[o];
    for (int i = 0; i < F; ++i) s += static_cast<double>(ctx[i]) * fc[o * F + i];  // token 0
    logits[o] = static_cast<float>(s);
  }
  return logits;
}

TEST(OnnxImport, AttentionWithItsMaskComesBackAsOneOp) {
  const OnnxImport imp = import_bytes(attention_model(2.0f, true));
  std::vector<std::string> ops;
  for (const NodeSpec& n : imp.spec.nodes) ops.push_back(cat(n.name, ":", n.op));
  EXPECT_EQ(ops, (std::vector<std::string>{"emb:embedding", "att.q:linear", "att.k:linear", "att.v:linear", "att:attention",
                                           "pool.gather:token_pool", "fc:linear"}));
  const NodeSpec& att = imp.spec.nodes[4];
  EXPECT_EQ(att.inputs, (std::vector<std::string>{"att.q", "att.k", "att.v", "mask"}));
  EXPECT_EQ(att.attention.heads, 2);
  ASSERT_EQ(imp.spec.inputs.size(), 2u);
  EXPECT_TRUE(imp.spec.inputs[0].integer);
  EXPECT_EQ(imp.spec.inputs[0].shape, Shape{4});
  EXPECT_TRUE(imp.spec.inputs[1].mask);
  EXPECT_FALSE(imp.spec.inputs[1].integer);
  EXPECT_EQ(imp.spec.nodes[0].embedding.count, 10);
  EXPECT_EQ(imp.spec.nodes[0].embedding.features, 8);
  // It builds and the weights load under their own names.
  const Graph graph = Graph::build(parse_model_json(model_spec_json(imp.spec), "imported"));
  auto backend = make_backend("reference");
  Network net(graph, *backend, 0);
  shard_from_torch(graph, imp.weights, net);
  // And computes what the ONNX graph does: two samples, the second with its last token padding.
  const float ids[8] = {3, 1, 4, 1, 5, 9, 2, 6}, mask[8] = {1, 1, 1, 1, 1, 1, 1, 0};
  Tensor id_t = Tensor::empty({2, 4}), mask_t = Tensor::empty({2, 4});
  std::memcpy(id_t.data(), ids, sizeof ids);
  std::memcpy(mask_t.data(), mask, sizeof mask);
  const std::vector<Tensor> inputs{id_t, mask_t};
  const Tensor& y = net.forward(inputs, 0);
  for (int b = 0; b < 2; ++b) {
    const std::vector<float> want = attention_by_hand(imp, ids + 4 * b, mask + 4 * b);
    for (int o = 0; o < 3; ++o) EXPECT_NEAR(y[b * 3 + o], want[static_cast<std::size_t>(o)], 1e-5) << "sample " << b;
  }
  // The keys permuted in two steps (Hugging Face's order) come back as the same op.
  const OnnxImport two = import_bytes(attention_model(2.0f, true, true));
  ASSERT_EQ(two.spec.nodes.size(), imp.spec.nodes.size());
  EXPECT_EQ(two.spec.nodes[4].inputs, att.inputs);

  EXPECT_FALSE(imp.spec.inputs[1].marks_padding);
  // The mask added as it is, mask * -1e4: its data marks padding with 1 (torch's
  // key_padding_mask), which data sets read as 1 - mask; the same op, the same computation.
  const OnnxImport padding = import_bytes(attention_model(2.0f, false));
  ASSERT_EQ(padding.spec.nodes.size(), imp.spec.nodes.size());
  EXPECT_EQ(padding.spec.nodes[4].inputs, att.inputs);
  EXPECT_TRUE(padding.spec.inputs[1].mask);
  EXPECT_TRUE(padding.spec.inputs[1].marks_padding);
  // Read by something else too, that reader would see it flipped: refused. A mask read so
  // beside a Hugging Face mask (1 keep) is read as it is, and taken.
  std::string twice = error_of([&] { import_bytes(attention_model(2.0f, false, false, -10000.0f, true)); });
  EXPECT_NE(twice.find("node 'sum.reducesum' (tandem's reduce) reads the mask 'mask' whose 1s mark padding; tandem reads that "
                       "mask as 1 - mask, for attention only"), std::string::npos) << twice;
  EXPECT_EQ(import_bytes(attention_model(2.0f, true, false, -10000.0f, true)).spec.inputs[1].marks_padding, false);
  // A mask times -inf: 0 padding times that is NaN in torch, refused.
  twice = error_of([&] { import_bytes(attention_model(2.0f, true, false, -INFINITY)); });
  EXPECT_NE(twice.find("node '/m/Mul' (Mul, module m): it multiplies the mask by -inf (0 padding times that is NaN)"),
            std::string::npos) << twice;

  // Scaled by 1/3 where the head size is 4; a mask times -1, which leaves padding a weight:
  // refused, with why.
  std::string e = error_of([&] { import_bytes(attention_model(3.0f, true)); });
  EXPECT_NE(e.find("  node '/att/Softmax' (Softmax, module att): it scales attention scores by 1/3; tandem's attention scales by "
                   "1/sqrt(head size) = 1/2"), std::string::npos) << e;
  e = error_of([&] { import_bytes(attention_model(2.0f, false, false, -1.0f)); });
  EXPECT_NE(e.find("  node '/att/Add' (Add, module att): it adds a mask computed otherwise than (1 - mask) * c or mask * c with "
                   "c <= -1e4 (it is mask * -1)"), std::string::npos) << e;
  EXPECT_EQ(e.find("/att/MatMul_1"), std::string::npos) << "a refused step is reported once: " << e;
  e = error_of([&] { import_bytes(attention_model(NAN, true)); });
  EXPECT_NE(e.find("  node '/att/Div' (Div, module att): it scales attention scores by nan"), std::string::npos) << e;

  // A stored causal mask (-inf above the diagonal) added to the scores too: the same op,
  // causal, with its padding mask; -inf below the diagonal is no causal mask: refused.
  const OnnxImport causal = import_bytes(attention_model(2.0f, true, false, -10000.0f, false, 1));
  ASSERT_EQ(causal.spec.nodes.size(), imp.spec.nodes.size());
  EXPECT_EQ(causal.spec.nodes[4].inputs, att.inputs);
  EXPECT_TRUE(causal.spec.nodes[4].attention.causal);
  EXPECT_FALSE(att.attention.causal);
  e = error_of([&] { import_bytes(attention_model(2.0f, true, false, -10000.0f, false, 2)); });
  EXPECT_NE(e.find("  node '/att/Add_1' (Add, module att): it adds to attention scores something other than a key padding "
                   "mask from a graph input or a causal mask (0 on and below the diagonal, -inf above it)"),
            std::string::npos) << e;
}

// A boolean input is nn.MultiheadAttention's key_padding_mask and nothing else: read as
// numbers, selected between other values than a constant and zeros, or of another rank, it
// is refused with why (the happy path, torch's own export, is tests/e2e/onnx_import.sh's
// encoder: logits within 4e-7 of torch's, 3 training steps within 6e-8).
TEST(OnnxImport, ABooleanInputIsAKeyPaddingMaskOnly) {
  auto refusal = [](const std::vector<Pb>& nodes, std::vector<int64_t> pad_dims = {4}) {
    Pb g;
    for (const Pb& n : nodes) g.msg(1, n);
    g.msg(5, tensor("fc.weight", {3, 4})).msg(5, tensor("fc.bias", {3}));
    g.msg(11, value("x", {4})).msg(11, typed_value("pad", 9, pad_dims)).msg(12, value("logits", {3}));
    const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
    return error_of([&] { import_bytes(std::vector<uint8_t>(b.begin(), b.end())); });
  };
  const Pb fc = node("/fc/Gemm", "Gemm", {"x", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)});
  std::string e = refusal({node("/Add", "Add", {"x", "pad"}, {"y"}), fc});
  EXPECT_NE(e.find("node '/Add' (Add): it reads the boolean input 'pad' as numbers; tandem reads a boolean input only as "
                   "attention's key padding mask (nn.MultiheadAttention's key_padding_mask)"), std::string::npos) << e;
  e = refusal({scalar("/c", -1e9f), node("/Where", "Where", {"pad", "/c_out", "x"}, {"y"}), fc});
  EXPECT_NE(e.find("node '/Where' (Where): it selects by a key padding mask between other values than a constant and zeros "
                   "of the mask's shape"), std::string::npos) << e;
  e = refusal({scalar("/c", -1e9f), scalar("/z", 0.0f), node("/Where", "Where", {"x", "/c_out", "/z_out"}, {"y"}), fc});
  EXPECT_EQ(e, "(no error)");  // a float condition (nonzero picks): tandem's where, both branches constants
  e = refusal({ints("/s", {3}, {0, 2, 2}), node("/Reshape", "Reshape", {"pad", "/s_out"}, {"y"}), fc});
  EXPECT_NE(e.find("node '/Reshape' (Reshape): it reshapes a key padding mask otherwise than nn.MultiheadAttention does"),
            std::string::npos) << e;
  e = refusal({fc}, {4, 4});
  EXPECT_NE(e.find("input 'pad' is boolean with 3 dimensions; tandem reads a boolean input as a key padding mask "
                   "[batch, tokens] only"), std::string::npos) << e;
}

// LayoutLM's boxes [N, T, 4] are read by column only: as numbers, a column past 3, a span
// other than y1 - y0 or x1 - x0, or the two corners through different tables, each is refused
// with why (torch's own LayoutLM, the happy path, is tests/e2e/onnx_import.sh's layoutlm).
TEST(OnnxImport, BoxesAreReadAsLayoutLMReadsThem) {
  auto refusal = [](const std::vector<Pb>& nodes) {
    Pb g;
    for (const Pb& n : nodes) g.msg(1, n);
    g.msg(5, tensor("emb.weight", {10, 4})).msg(5, tensor("x.weight", {12, 4})).msg(5, tensor("x2.weight", {12, 4}));
    g.msg(5, tensor("fc.weight", {3, 4})).msg(5, tensor("fc.bias", {3}));
    g.msg(11, typed_value("ids", 7, {4})).msg(11, typed_value("bbox", 7, {4, 4})).msg(12, value("logits", {3}));
    const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
    return error_of([&] { import_bytes(std::vector<uint8_t>(b.begin(), b.end())); });
  };
  auto column = [](int64_t k, const std::string& out) {
    return std::vector<Pb>{ints(cat("/k", k, out), {}, {k}),
                           node(cat("/Gather_", out), "Gather", {"bbox", cat("/k", k, out, "_out")}, {out}, {int_attr("axis", 2)})};
  };
  const Pb words = node("/emb/Gather", "Gather", {"emb.weight", "ids"}, {"w"});
  const std::vector<Pb> head = {ints("/z", {}, {0}), node("/Gather_first", "Gather", {"s", "/z_out"}, {"f"}, {int_attr("axis", 1)}),
                                node("/fc/Gemm", "Gemm", {"f", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)})};
  auto model = [&](std::vector<Pb> body) {
    body.insert(body.begin(), words);
    body.insert(body.end(), head.begin(), head.end());
    return body;
  };
  std::string e = refusal(model({node("/Relu", "Relu", {"bbox"}, {"r"}), node("/Add", "Add", {"w", "r"}, {"s"})}));
  EXPECT_NE(e.find("node '/Relu' (Relu): it reads the boxes 'bbox' as numbers; tandem reads integers [batch, tokens, 4] only "
                   "as LayoutLM's boxes"), std::string::npos) << e;
  std::vector<Pb> past = column(5, "c5");
  past.push_back(node("/x/Gather", "Gather", {"x.weight", "c5"}, {"xr"}));
  past.push_back(node("/Add", "Add", {"w", "xr"}, {"s"}));
  e = refusal(model(past));
  EXPECT_NE(e.find("node '/Gather_c5' (Gather): it reads the boxes otherwise than one coordinate of every token's box "
                   "(bbox[:, :, k], k in 0..3)"), std::string::npos) << e;
  std::vector<Pb> span = column(1, "c1");
  for (const Pb& p : column(0, "c0")) span.push_back(p);
  span.push_back(node("/Sub", "Sub", {"c1", "c0"}, {"d"}));
  span.push_back(node("/h/Gather", "Gather", {"x.weight", "d"}, {"hr"}));
  span.push_back(node("/Add", "Add", {"w", "hr"}, {"s"}));
  e = refusal(model(span));
  EXPECT_NE(e.find("node '/Sub' (Sub): it subtracts box coordinates otherwise than LayoutLM does (y1 - y0 for the height, "
                   "x1 - x0 for the width)"), std::string::npos) << e;
  std::vector<Pb> corners = column(0, "c0");
  for (const Pb& p : column(2, "c2")) corners.push_back(p);
  corners.push_back(node("/x/Gather", "Gather", {"x.weight", "c0"}, {"left"}));
  corners.push_back(node("/x2/Gather", "Gather", {"x2.weight", "c2"}, {"right"}));
  corners.push_back(node("/Add", "Add", {"w", "left"}, {"a"}));
  corners.push_back(node("/Add_1", "Add", {"a", "right"}, {"s"}));
  e = refusal(model(corners));
  EXPECT_NE(e.find("node '/Add_1' (Add): its x1 and x0 read different tables; LayoutLM's share one"), std::string::npos) << e;
}

// Shape arithmetic as F.pad writes it: a Transpose of constants and a Slice backwards. The
// reshape's target [-1, 2, 2] comes out of [[2, -1], [2, 7]] transposed, flattened and read
// from index 2 down: a wrong transpose or reversal would give another shape.
TEST(OnnxImport, ConstantsTransposeAndSliceBackwards) {
  Pb g;
  const std::vector<Pb> nodes = {
      ints("/c", {2, 2}, {2, -1, 2, 7}), node("/T", "Transpose", {"/c_out"}, {"t"}, {ints_attr("perm", {1, 0})}),
      ints("/flat", {1}, {-1}), node("/R", "Reshape", {"t", "/flat_out"}, {"f"}),
      ints("/b", {1}, {2}), ints("/e", {1}, {-9223372036854775807}), ints("/a", {1}, {0}), ints("/s", {1}, {-1}),
      node("/S", "Slice", {"f", "/b_out", "/e_out", "/a_out", "/s_out"}, {"target"}),
      node("/view/Reshape", "Reshape", {"x", "target"}, {"v"}),
      node("/Flatten", "Flatten", {"v"}, {"fl"}, {int_attr("axis", 1)}),
      node("/fc/Gemm", "Gemm", {"fl", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)})};
  for (const Pb& n : nodes) g.msg(1, n);
  g.msg(5, tensor("fc.weight", {3, 4})).msg(5, tensor("fc.bias", {3}));
  g.msg(11, value("x", {4})).msg(12, value("logits", {3}));
  const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
  const OnnxImport imp = import_bytes(std::vector<uint8_t>(b.begin(), b.end()));
  ASSERT_FALSE(imp.spec.nodes.empty());
  EXPECT_EQ(imp.spec.nodes[0].op, "reshape");
  EXPECT_EQ(imp.spec.nodes[0].reshape, (std::vector<int64_t>{2, 2}));
}

// Shape arithmetic from a hostile file: too few inputs, axes twice, numbers past int64, a
// shape doubled until it is huge; each is a listed refusal, never a crash or a wrong read.
TEST(OnnxImport, MalformedShapeArithmeticIsRefused) {
  auto refusal = [](std::vector<Pb> extra) {
    extra.push_back(node("/fc/Gemm", "Gemm", {"x", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)}));
    Pb g;
    for (const Pb& n : extra) g.msg(1, n);
    g.msg(5, tensor("fc.weight", {3, 4})).msg(5, tensor("fc.bias", {3}));
    g.msg(11, value("x", {4})).msg(12, value("logits", {3}));
    const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
    return error_of([&] { import_bytes(std::vector<uint8_t>(b.begin(), b.end())); });
  };
  const Pb four = ints("c", {1}, {4}), big = ints("big", {}, {int64_t{1} << 62}), low = ints("low", {}, {INT64_MIN}),
           minus = ints("minus", {}, {-1}), twice = ints("twice", {2}, {0, 0}), scalar = ints("s", {}, {1});
  struct Case {
    std::vector<Pb> nodes;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{node("/Cast", "Cast", {}, {"o"}, {int_attr("to", 7)})}, "node '/Cast' (Cast): input 0 is missing"},
      {{four, node("/Add", "Add", {"c_out"}, {"o"})}, "node '/Add' (Add): it has 1 inputs"},
      {{four, node("/Concat", "Concat", {"c_out", ""}, {"o"}, {int_attr("axis", 0)})}, "node '/Concat' (Concat): input 1 is missing"},
      {{scalar, twice, node("/Unsqueeze", "Unsqueeze", {"s_out", "twice_out"}, {"o"})}, "node '/Unsqueeze' (Unsqueeze): it names an axis twice"},
      {{four, twice, node("/Squeeze", "Squeeze", {"c_out", "twice_out"}, {"o"})}, "node '/Squeeze' (Squeeze): it names an axis twice"},
      {{low, minus, node("/Div", "Div", {"low_out", "minus_out"}, {"o"})}, "node '/Div' (Div): it divides past what tandem computes with"},
      {{big, node("/Mul", "Mul", {"big_out", "big_out"}, {"o"})}, "node '/Mul' (Mul): it computes past what tandem computes with"},
      {{four, ints("i", {1}, {7}), node("/Gather", "Gather", {"c_out", "i_out"}, {"o"})}, "node '/Gather' (Gather): index 7 is outside 1 values"},
      // x.size(0) == 2 holds for one batch size only: refused (x.size(0) == -1, never true, folds)
      {{node("/Shape", "Shape", {"x"}, {"xs"}), ints("z", {}, {0}), node("/Gather", "Gather", {"xs", "z_out"}, {"n"}),
        ints("two", {}, {2}), node("/Equal", "Equal", {"n", "two_out"}, {"o"})},
       "node '/Equal' (Equal): it compares the batch size with a number; the graph would compute otherwise for some batches"},
      // Found by the onnx fuzzer (tests/fuzz/regressions/onnx/): a ReduceMean without inputs
      // starting the LayerNorm pattern, and a Constant of type TENSOR without its tensor.
      {{node("/ln/ReduceMean", "ReduceMean", {}, {"m"}, {ints_attr("axes", {-1})}), node("/ln/Sub", "Sub", {"x", "m"}, {"d"})},
       "node '/ln/ReduceMean' (ReduceMean, module ln): it lacks an input or output its op needs"},
      {{node("/k", "Constant", {}, {"k_out"}, {Pb().str(1, "value").num(20, 4)}), node("/Div", "Div", {"x", "k_out"}, {"o"})},
       "node '/Div' (Div): input 'k_out' is made by no node before it"},
      // F.pad's pads are computed by shape arithmetic (a backwards Slice, a Transpose): a perm
      // that is no permutation, a step of 0, a pad in another mode or of another value
      {{ints("m", {2, 2}, {1, 2, 3, 4}), node("/Transpose", "Transpose", {"m_out"}, {"o"}, {ints_attr("perm", {0, 0})})},
       "node '/Transpose' (Transpose): its perm is not a permutation"},
      {{four, ints("b", {1}, {0}), ints("e", {1}, {1}), ints("st", {1}, {0}), node("/Slice", "Slice", {"c_out", "b_out", "e_out", "b_out", "st_out"}, {"o"})},
       "node '/Slice' (Slice): it slices with step 0"},
      {{ints("p", {2}, {0, 1}), node("/Pad", "Pad", {"x", "p_out"}, {"o"}, {Pb().str(1, "mode").str(4, "reflect").num(20, 3)})},
       "node '/Pad' (Pad): it pads in mode 'reflect'; tandem pads with zeros only"},
      {{ints("p", {2}, {0, 1}), ::tandem::scalar("/v", 1.0f), node("/Pad", "Pad", {"x", "p_out", "/v_out"}, {"o"})},
       "node '/Pad' (Pad): it pads with a value other than 0; tandem pads with zeros only"},
      {{ints("p", {2}, {0, 1}), node("/Pad", "Pad", {"x", "p_out"}, {"o"})},
       "node '/Pad' (Pad): it pads otherwise than with zeros alike around an image's height and width before one average "
       "pool or convolution (pads 2 values)"},
  };
  for (const Case& c : cases) {
    const std::string e = refusal(c.nodes);
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
  }
  // Concat(c, c) again and again: refused once past 65536 values, not at 2^40.
  std::vector<Pb> doubling = {ints("c", {4096}, std::vector<int64_t>(4096, 1))};
  std::string last = "c_out";
  for (int i = 0; i < 30; ++i) {
    doubling.push_back(node(cat("/Concat_", i), "Concat", {last, last}, {cat("d", i)}, {int_attr("axis", 0)}));
    last = cat("d", i);
  }
  const std::string e = refusal(doubling);
  EXPECT_NE(e.find("node '/Concat_4' (Concat): it computes a shape of more than 65536 values"), std::string::npos) << e;
}

// A ViT as torchvision writes it, small: image [3, 4, 4] -> conv_proj (2x2, stride 2) -> [N, 4,
// 4] viewed as 4 patches (Reshape, Transpose) -> the class token expanded over the batch (its
// shape [N, -1, -1] made as torch 1.13 writes expand: Reshape, Shape, ConstantOfShape, Mul,
// Equal, Where) and joined before them, plus the positions -> nn.MultiheadAttention time-major
// (Transpose; the packed in-projection, sliced into query, key and value; each viewed as
// [T, N H, D] with N H computed from the shape, the query scaled by 1/`divisor`; the keys
// permuted to [N H, D, T]; back to [T N, E], out_proj, [T, N, E], Transpose) -> token 0 -> fc.
std::vector<uint8_t> vit_model(float divisor, int64_t slice_step = 1) {
  std::vector<Pb> n = {node("/conv_proj/Conv", "Conv", {"image", "conv_proj.weight", "conv_proj.bias"}, {"c"},
                            {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2})}),
                       ints("/pshape", {3}, {0, 4, 4}), node("/Reshape", "Reshape", {"c", "/pshape_out"}, {"p"}),
                       node("/Transpose", "Transpose", {"p"}, {"x"}, {ints_attr("perm", {0, 2, 1})}),
                       node("/Shape", "Shape", {"x"}, {"xs"}), ints("/zero", {}, {0}),
                       node("/Gather", "Gather", {"xs", "/zero_out"}, {"batch"}, {int_attr("axis", 0)}),
                       ints("/axes", {1}, {0}), node("/Unsqueeze", "Unsqueeze", {"batch", "/axes_out"}, {"b1"}),
                       ints("/rest", {2}, {-1, -1}), node("/Concat", "Concat", {"b1", "/rest_out"}, {"e0"}, {int_attr("axis", 0)}),
                       ints("/flat", {1}, {-1}), node("/Reshape_1", "Reshape", {"e0", "/flat_out"}, {"e1"}),
                       node("/Shape_1", "Shape", {"e1"}, {"e1s"})};
  Pb one;
  one.num(1, 1).num(2, 7).str(8, "one");
  const int64_t v1 = 1;
  one.str(9, std::string(reinterpret_cast<const char*>(&v1), 8));
  n.push_back(node("/ConstantOfShape", "ConstantOfShape", {"e1s"}, {"ones"}, {Pb().str(1, "value").msg(5, one).num(20, 4)}));
  n.push_back(ints("/minus", {}, {-1}));
  n.push_back(node("/Mul", "Mul", {"ones", "/minus_out"}, {"minus_ones"}));
  n.push_back(node("/Equal", "Equal", {"e1", "minus_ones"}, {"is_rest"}));
  n.push_back(node("/Where", "Where", {"is_rest", "ones", "e1"}, {"expand_to"}));
  n.push_back(node("/Expand", "Expand", {"class_token", "expand_to"}, {"cls"}));
  n.push_back(node("/Concat_1", "Concat", {"cls", "x"}, {"joined"}, {int_attr("axis", 1)}));
  n.push_back(node("/encoder/Add", "Add", {"joined", "encoder.pos_embedding"}, {"emb"}));
  // nn.MultiheadAttention, batch_first, as F.multi_head_attention_forward exports it
  const std::string a = "/encoder/att/";
  n.push_back(node(a + "Transpose", "Transpose", {"emb"}, {"tm"}, {ints_attr("perm", {1, 0, 2})}));
  n.push_back(node(a + "Transpose_1", "Transpose", {"encoder.att.in_proj_weight"}, {"wt"}, {ints_attr("perm", {1, 0})}));
  n.push_back(node(a + "MatMul", "MatMul", {"tm", "wt"}, {"mm"}));
  n.push_back(node(a + "Add", "Add", {"encoder.att.in_proj_bias", "mm"}, {"qkv"}));
  n.push_back(ints(a + "last", {1}, {-1}));
  n.push_back(ints(a + "step", {1}, {slice_step}));
  for (int64_t k = 0; k < 3; ++k) {
    n.push_back(ints(cat(a, "lo", k), {1}, {4 * k}));
    n.push_back(ints(cat(a, "hi", k), {1}, {4 * k + 4}));
    n.push_back(node(cat(a, "Slice_", k), "Slice", {"qkv", cat(a, "lo", k, "_out"), cat(a, "hi", k, "_out"), a + "last_out", a + "step_out"},
                     {cat("s", k)}));
  }
  n.push_back(node(a + "Shape", "Shape", {"tm"}, {"tms"}));
  n.push_back(ints(a + "one", {}, {1}));
  n.push_back(node(a + "Gather", "Gather", {"tms", a + "one_out"}, {"n"}, {int_attr("axis", 0)}));
  n.push_back(ints(a + "heads", {}, {2}));
  n.push_back(node(a + "Mul", "Mul", {"n", a + "heads_out"}, {"nh"}));
  n.push_back(node(a + "Unsqueeze", "Unsqueeze", {"nh", "/axes_out"}, {"nh1"}));
  n.push_back(ints(a + "t", {1}, {5}));
  n.push_back(ints(a + "d", {1}, {2}));
  n.push_back(node(a + "Concat", "Concat", {a + "t_out", "nh1", a + "d_out"}, {"hshape"}, {int_attr("axis", 0)}));
  const std::vector<std::vector<int64_t>> perms = {{1, 0, 2}, {1, 2, 0}, {1, 0, 2}};
  for (int k = 0; k < 3; ++k) {
    n.push_back(node(cat(a, "Reshape_", k), "Reshape", {cat("s", k), "hshape"}, {cat("h", k)}));
    n.push_back(node(cat(a, "Transpose_h", k), "Transpose", {cat("h", k)}, {cat("t", k)}, {ints_attr("perm", perms[static_cast<std::size_t>(k)])}));
  }
  n.push_back(scalar(a + "scale", divisor));
  n.push_back(node(a + "Div", "Div", {"t0", a + "scale_out"}, {"q"}));
  n.push_back(node(a + "MatMul_1", "MatMul", {"q", "t1"}, {"scores"}));
  n.push_back(node(a + "Softmax", "Softmax", {"scores"}, {"probs"}, {int_attr("axis", -1)}));
  n.push_back(node(a + "MatMul_2", "MatMul", {"probs", "t2"}, {"ctx"}));
  n.push_back(node(a + "Transpose_2", "Transpose", {"ctx"}, {"ctm"}, {ints_attr("perm", {1, 0, 2})}));
  n.push_back(ints(a + "five", {}, {5}));
  n.push_back(node(a + "Mul_1", "Mul", {a + "five_out", "n"}, {"tn"}));
  n.push_back(node(a + "Unsqueeze_1", "Unsqueeze", {"tn", "/axes_out"}, {"tn1"}));
  n.push_back(ints(a + "e", {1}, {4}));
  n.push_back(node(a + "Concat_1", "Concat", {"tn1", a + "e_out"}, {"flat_shape"}, {int_attr("axis", 0)}));
  n.push_back(node(a + "Reshape_3", "Reshape", {"ctm", "flat_shape"}, {"flat"}));
  n.push_back(node(a + "Gemm", "Gemm", {"flat", "encoder.att.out_proj.weight", "encoder.att.out_proj.bias"}, {"o"}, {int_attr("transB", 1)}));
  n.push_back(node(a + "Unsqueeze_2", "Unsqueeze", {"n", "/axes_out"}, {"n1"}));
  n.push_back(node(a + "Concat_2", "Concat", {a + "t_out", "n1", a + "e_out"}, {"back_shape"}, {int_attr("axis", 0)}));
  n.push_back(node(a + "Reshape_4", "Reshape", {"o", "back_shape"}, {"otm"}));
  n.push_back(node(a + "Transpose_3", "Transpose", {"otm"}, {"out"}, {ints_attr("perm", {1, 0, 2})}));
  n.push_back(node("/Gather_1", "Gather", {"out", "/zero_out"}, {"first"}, {int_attr("axis", 1)}));
  n.push_back(node("/fc/Gemm", "Gemm", {"first", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)}));
  Pb g;
  for (const Pb& x : n) g.msg(1, x);
  for (const Pb& w : {tensor("conv_proj.weight", {4, 3, 2, 2}), tensor("conv_proj.bias", {4}), tensor("class_token", {1, 1, 4}, 0.3f),
                      tensor("encoder.pos_embedding", {1, 5, 4}, -0.2f), tensor("encoder.att.in_proj_weight", {12, 4}),
                      tensor("encoder.att.in_proj_bias", {12}, 0.05f), tensor("encoder.att.out_proj.weight", {4, 4}),
                      tensor("encoder.att.out_proj.bias", {4}), tensor("fc.weight", {3, 4}), tensor("fc.bias", {3})})
    g.msg(5, w);
  g.msg(11, value("image", {3, 4, 4})).msg(12, value("logits", {3}));
  const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
  return std::vector<uint8_t>(b.begin(), b.end());
}

// The same model written as tandem's spec by hand (its slices, class token and attention).
const char* kVitByHand = R"({ name: "vit", inputs: [{ name: "image", shape: [4, 4, 3] }], nodes: [
  { name: "conv_proj", op: "conv2d", inputs: ["image"], conv2d: { out_channels: 4, kernel: [2], stride: [2] } },
  { name: "tokens", op: "tokens", inputs: ["conv_proj"] },
  { name: "encoder.class_token", op: "class_token", inputs: ["tokens"] },
  { name: "encoder.att.in_proj", op: "linear", inputs: ["encoder.class_token"], linear: { out_features: 12 } },
  { name: "q", op: "slice", inputs: ["encoder.att.in_proj"], slice: { axis: 1, start: 0, end: 4 } },
  { name: "k", op: "slice", inputs: ["encoder.att.in_proj"], slice: { axis: 1, start: 4, end: 8 } },
  { name: "v", op: "slice", inputs: ["encoder.att.in_proj"], slice: { axis: 1, start: 8, end: 12 } },
  { name: "encoder.att", op: "attention", inputs: ["q", "k", "v"], attention: { heads: 2 } },
  { name: "encoder.att.out_proj", op: "linear", inputs: ["encoder.att"], linear: { out_features: 4 } },
  { name: "first", op: "token_pool", inputs: ["encoder.att.out_proj"] },
  { name: "fc", op: "linear", inputs: ["first"], linear: { out_features: 3 } }] })";

TEST(OnnxImport, VisionTransformerComesBackAsTandemOps) {
  const OnnxImport imp = import_bytes(vit_model(std::sqrt(2.0f)));
  std::vector<std::string> ops;
  for (const NodeSpec& n : imp.spec.nodes) ops.push_back(cat(n.name, ":", n.op));
  EXPECT_EQ(ops, (std::vector<std::string>{"conv_proj:conv2d", "tokens:tokens", "encoder.class_token:class_token",
                                           "encoder.att.in_proj:linear", "encoder.att.slice_0:slice", "encoder.att.slice_1:slice",
                                           "encoder.att.slice_2:slice", "encoder.att:attention", "encoder.att.out_proj:linear",
                                           "gather_1:token_pool", "fc:linear"}));
  using Names = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(imp.spec.nodes[2].torch_names, (Names{{"cls_token", "class_token"}, {"position_embeddings", "encoder.pos_embedding"}}));
  EXPECT_EQ(imp.spec.nodes[3].torch_names, (Names{{"weight", "encoder.att.in_proj_weight"}, {"bias", "encoder.att.in_proj_bias"}}));
  EXPECT_EQ(imp.spec.nodes[5].slice.start, 4);
  EXPECT_EQ(imp.spec.nodes[5].slice.end, 8);
  EXPECT_EQ(imp.spec.nodes[7].attention.heads, 2);
  // The weights file holds the state dict's keys; the spec reads back as written, builds, loads
  // them, and computes what the same model written by hand computes with those weights.
  std::set<std::string> names;
  for (const SafeTensor& t : imp.weights) names.insert(t.name);
  EXPECT_EQ(names, (std::set<std::string>{"conv_proj.weight", "conv_proj.bias", "class_token", "encoder.pos_embedding",
                                          "encoder.att.in_proj_weight", "encoder.att.in_proj_bias", "encoder.att.out_proj.weight",
                                          "encoder.att.out_proj.bias", "fc.weight", "fc.bias"}));
  const std::string json = model_spec_json(imp.spec);
  EXPECT_EQ(model_spec_json(parse_model_json(json, "imported")), json);
  const Graph graph = Graph::build(parse_model_json(json, "imported"));
  const Graph by_hand = Graph::build(parse_model_json(kVitByHand, "by hand"));
  auto backend = make_backend("reference");
  Network net(graph, *backend, 0), hand(by_hand, *backend, 0);
  shard_from_torch(graph, imp.weights, net);
  std::vector<SafeTensor> renamed;  // the same tensors under the hand-written spec's names
  const std::map<std::string, std::string> to_hand = {
      {"class_token", "encoder.class_token.cls_token"}, {"encoder.pos_embedding", "encoder.class_token.position_embeddings"},
      {"encoder.att.in_proj_weight", "encoder.att.in_proj.weight"}, {"encoder.att.in_proj_bias", "encoder.att.in_proj.bias"}};
  for (SafeTensor t : imp.weights) {
    if (to_hand.count(t.name)) t.name = to_hand.at(t.name);
    renamed.push_back(std::move(t));
  }
  shard_from_torch(by_hand, renamed, hand);
  Tensor image = Tensor::empty({2, 4, 4, 3});
  for (int64_t i = 0; i < image.numel(); ++i) image[i] = std::sin(0.37f * static_cast<float>(i));
  const std::vector<Tensor> inputs{image};
  const Tensor& y = net.forward(inputs, 0);
  const Tensor& want = hand.forward(inputs, 0);
  ASSERT_EQ(y.numel(), 6);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(y[i], want[i]) << i;
  // tandem's files in PyTorch's layout keep those names both ways.
  std::set<std::string> exported;
  for (const SafeTensor& t : shard_to_torch(graph, net, 0)) exported.insert(t.name);
  EXPECT_EQ(exported, names);

  // The query scaled by 1/3 where the head size is 2; slices of every second feature: refused.
  std::string e = error_of([&] { import_bytes(vit_model(3.0f)); });
  EXPECT_NE(e.find("node '/encoder/att/Softmax' (Softmax, module encoder.att): it scales attention scores by 1/3; tandem's "
                   "attention scales by 1/sqrt(head size) = 1/1.41421"), std::string::npos) << e;
  e = error_of([&] { import_bytes(vit_model(std::sqrt(2.0f), 2)); });
  EXPECT_NE(e.find("3 problems (ops: Slice)"), std::string::npos) << e;
  EXPECT_NE(e.find("node '/encoder/att/Slice_0' (Slice, module encoder.att): it slices with step 2; tandem's slice takes every "
                   "element (step 1)"), std::string::npos) << e;
}

// x.mean(1) of a sequence (a sentence embedding's mean pooling) is token_pool's mean; with
// keepdim=True a general reduce whose kept axis is a view.
TEST(OnnxImport, MeanOverTheTokensIsTokenPool) {
  auto pooled = [](int64_t keepdims) {
    Pb g;
    g.msg(1, node("/emb/Gather", "Gather", {"emb.weight", "ids"}, {"x"}));
    g.msg(1, node("/ReduceMean", "ReduceMean", {"x"}, {"m"}, {ints_attr("axes", {1}), int_attr("keepdims", keepdims)}));
    g.msg(1, node("/fc/Gemm", "Gemm", {"m", "fc.weight", "fc.bias"}, {"logits"}, {int_attr("transB", 1)}));
    g.msg(5, tensor("emb.weight", {10, 8})).msg(5, tensor("fc.weight", {3, 8})).msg(5, tensor("fc.bias", {3}));
    g.msg(11, typed_value("ids", 7, {4})).msg(12, value("logits", {3}));
    const std::string b = Pb().msg(7, g).msg(8, Pb().num(2, 14)).b;
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  const OnnxImport imp = import_bytes(pooled(0));
  ASSERT_EQ(imp.spec.nodes.size(), 3u);
  EXPECT_EQ(imp.spec.nodes[1].op, "token_pool");
  EXPECT_TRUE(imp.spec.nodes[1].token_pool.mean);
  const Graph graph = Graph::build(parse_model_json(model_spec_json(imp.spec), "imported"));
  auto backend = make_backend("reference");
  Network net(graph, *backend, 0);
  shard_from_torch(graph, imp.weights, net);
  const float ids[4] = {3, 1, 4, 1};
  Tensor id_t = Tensor::empty({1, 4});
  std::memcpy(id_t.data(), ids, sizeof ids);
  const std::vector<Tensor> inputs{id_t};
  const Tensor& y = net.forward(inputs, 0);
  const std::vector<float> emb = floats_of(imp, "emb.weight"), fc = floats_of(imp, "fc.weight"), fcb = floats_of(imp, "fc.bias");
  for (int o = 0; o < 3; ++o) {
    double want = fcb[static_cast<std::size_t>(o)];
    for (int f = 0; f < 8; ++f) {
      double mean = 0.0;
      for (float id : ids) mean += emb[static_cast<std::size_t>(id) * 8 + static_cast<std::size_t>(f)] / 4.0;
      want += mean * fc[static_cast<std::size_t>(o * 8 + f)];
    }
    EXPECT_NEAR(y[o], want, 1e-5) << o;
  }
  // keepdim=True: a general reduce over the tokens, the axis kept by a view ([1, 8])
  const OnnxImport kept = import_bytes(pooled(1));
  ASSERT_GE(kept.spec.nodes.size(), 3u);
  EXPECT_EQ(kept.spec.nodes[1].op, "reduce");
  EXPECT_EQ(kept.spec.nodes[1].reduce.mode, ReduceAttrs::Mode::mean);
  EXPECT_EQ(kept.spec.nodes[1].reduce.axes, (std::vector<int>{0}));
  EXPECT_EQ(kept.spec.nodes[2].op, "reshape");
  EXPECT_EQ(kept.spec.nodes[2].reshape, (std::vector<int64_t>{1, 8}));
}

// torch_names: a node's tensors under the state dict's names where they are not
// "<node>.<field>"; a field the node lacks, or a name given twice, is refused.
TEST(SpecJson, TorchNamesRenameOnlyTheNodesOwnTensors) {
  auto spec = [](const std::string& names) {
    return cat(R"({ name: "m", inputs: [{ name: "x", shape: [4] }], nodes: [
      { name: "a", op: "linear", inputs: ["x"], linear: { out_features: 4 }, torch_names: [)", names, R"(] },
      { name: "b", op: "linear", inputs: ["a"], linear: { out_features: 2 } }] })");
  };
  const Graph g = Graph::build(parse_model_json(spec(R"({ field: "weight", name: "proj_weight" })"), "m"));
  EXPECT_EQ(torch_name(g, "a.weight"), "proj_weight");
  EXPECT_EQ(torch_name(g, "a.bias"), "a.bias");
  EXPECT_EQ(torch_name(g, "b.weight"), "b.weight");
  EXPECT_EQ(error_of([&] { Graph::build(parse_model_json(spec(R"({ field: "scale", name: "s" })"), "m")); }),
            "[graph] node 'a' (linear): field 'torch_names' renames 'scale', which is none of its tensors (weight, bias)");
  EXPECT_EQ(error_of([&] { Graph::build(parse_model_json(spec(R"({ field: "weight", name: "w" }, { field: "bias", name: "w" })"), "m")); }),
            "[graph] node 'a' (linear): its tensor 'bias' is 'w' in PyTorch's state dict, which another tensor of the model is "
            "called too (field 'torch_names' renames one)");
  // a rename onto another node's own name ("b.weight"): b's weight would load a's
  EXPECT_EQ(error_of([&] { Graph::build(parse_model_json(spec(R"({ field: "weight", name: "b.weight" })"), "m")); }),
            "[graph] node 'b' (linear): its tensor 'weight' is 'b.weight' in PyTorch's state dict, which another tensor of the "
            "model is called too (field 'torch_names' renames one)");
  EXPECT_EQ(error_of([&] { parse_model_json(spec(R"({ field: "weight", name: "w" }, { field: "weight", name: "v" })"), "m"); }),
            "[model spec] node 'a': field 'torch_names' names field 'weight' twice");
  EXPECT_EQ(error_of([&] { parse_model_json(spec(R"({ field: "weight" })"), "m"); }),
            "[model spec] node 'a': field 'torch_names' entry 0 needs a 'field' and a 'name'");
}

// slice's spec: an axis outside the input, an empty or outlying range, the tokens of a
// sequence that runs at length buckets' lengths: each refused, naming the node.
TEST(SpecJson, SliceRefusesWhatItCannotTake) {
  auto build = [](const std::string& slice, const std::string& input = R"({ name: "x", shape: [4, 6] })") {
    return error_of([&] {
      Graph::build(parse_model_json(cat(R"({ name: "m", inputs: [)", input, R"(], nodes: [
        { name: "s", op: "slice", inputs: ["x"], slice: )", slice, R"( },
        { name: "p", op: "token_pool", inputs: ["s"] }] })"), "m"));
    });
  };
  EXPECT_EQ(build("{ axis: 1, start: 2, end: 6 }"), "(no error)");
  EXPECT_EQ(build("{ axis: 2, start: 0, end: 1 }"), "[graph] node 's' (slice): field 'slice.axis' 2 is outside an input of 2 dimensions [4, 6]");
  EXPECT_EQ(build("{ axis: -1, start: 3, end: 3 }"), "[graph] node 's' (slice): field 'slice' [3, 3) is not a non-empty range of axis 1's 6 elements (input [4, 6])");
  EXPECT_EQ(build("{ axis: 0, start: 0, end: 5 }"), "[graph] node 's' (slice): field 'slice' [0, 5) is not a non-empty range of axis 0's 4 elements (input [4, 6])");
  // ids that run at the mask's length buckets: a slice of the features follows them, one of the tokens cannot
  auto bucketed = [](const std::string& slice) {
    return error_of([&] {
      Graph::build(parse_model_json(cat(R"({ name: "m", inputs: [{ name: "ids", shape: [4], dtype: "int32" },
        { name: "mask", shape: [4], mask: true, length_buckets: [2, 4] }], nodes: [
        { name: "e", op: "embedding", inputs: ["ids"], embedding: { count: 10, features: 6 } },
        { name: "s", op: "slice", inputs: ["e"], slice: )", slice, R"( },
        { name: "p", op: "token_pool", inputs: ["s", "mask"] }] })"), "m"));
    });
  };
  EXPECT_EQ(bucketed("{ axis: 1, start: 2, end: 6 }"), "(no error)");
  EXPECT_EQ(bucketed("{ axis: 0, start: 1, end: 4 }"),
            "[graph] node 's' (slice) reads 'e', a sequence that runs at the length buckets' lengths, but its output has another "
            "number of tokens; drop field 'length_buckets' or change the node");
}

// reshape's and transpose's specs: a shape of other elements or none, an order that is not
// one of the input's axes, a missing table: each refused, naming the node and the field.
TEST(SpecJson, ReshapeAndTransposeRefuseWhatTheyCannotTake) {
  auto build = [](const std::string& node) {
    return error_of([&] {
      Graph::build(parse_model_json(cat(R"({ name: "m", inputs: [{ name: "x", shape: [4, 6] }], nodes: [)", node, R"(,
        { name: "f", op: "flatten", inputs: ["y"] }] })"), "m"));
    });
  };
  EXPECT_EQ(build(R"({ name: "y", op: "reshape", inputs: ["x"], reshape: { shape: [2, 3, 4] } })"), "(no error)");
  EXPECT_EQ(build(R"({ name: "y", op: "reshape", inputs: ["x"], reshape: { shape: [5, 5] } })"),
            "[graph] node 'y' (reshape): field 'reshape.shape' [5, 5] does not hold the 24 elements of its input [4, 6]");
  EXPECT_EQ(build(R"({ name: "y", op: "reshape", inputs: ["x"], reshape: { shape: [24, 0] } })"),
            "[graph] node 'y' (reshape): field 'reshape.shape' has dimension 1 of 0 (each at least 1)");
  EXPECT_EQ(build(R"({ name: "y", op: "reshape", inputs: ["x"], reshape: { shape: [] } })"),
            "[graph] node 'y' (reshape): field 'reshape.shape' has 0 dimensions (1 to 5 a sample)");
  EXPECT_EQ(build(R"({ name: "y", op: "reshape", inputs: ["x"] })"),
            "[model spec] node 'y' (reshape): missing field 'reshape' (shape: the per-sample dimensions)");
  EXPECT_EQ(build(R"({ name: "y", op: "transpose", inputs: ["x"], transpose: { perm: [1, 0] } })"), "(no error)");
  EXPECT_EQ(build(R"({ name: "y", op: "transpose", inputs: ["x"], transpose: { perm: [0, 0] } })"),
            "[graph] node 'y' (transpose): field 'transpose.perm' is not an order of the axes 0 to 1 (axis 0 at 1)");
  EXPECT_EQ(build(R"({ name: "y", op: "transpose", inputs: ["x"], transpose: { perm: [2, 0, 1] } })"),
            "[graph] node 'y' (transpose): field 'transpose.perm' has 3 axes; its input [4, 6] has 2");
  EXPECT_EQ(build(R"({ name: "y", op: "transpose", inputs: ["x"] })"),
            "[model spec] node 'y' (transpose): missing field 'transpose' (perm: the axes' new order)");
  EXPECT_EQ(build(R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { mode: "mean", axes: [-1] } })"), "(no error)");
  EXPECT_EQ(build(R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { axes: [0, -2] } })"),
            "[graph] node 'y' (reduce): field 'reduce.axes' names axis -2 twice");
  EXPECT_EQ(build(R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { axes: [2] } })"),
            "[graph] node 'y' (reduce): field 'reduce.axes' names axis 2, outside an input of 2 dimensions");
  EXPECT_EQ(build(R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { axes: [] } })"),
            "[graph] node 'y' (reduce): field 'reduce.axes' is empty (name the axes to reduce)");
  EXPECT_EQ(build(R"({ name: "y", op: "reduce", inputs: ["x"], reduce: { mode: "median", axes: [0] } })"),
            "[model spec] node 'y' (reduce): field 'reduce.mode' is 'median' (\"sum\", \"mean\", \"max\" or \"min\")");
  // written back as JSON, read again: the same spec
  const ModelSpec spec = parse_model_json(R"({ name: "m", inputs: [{ name: "x", shape: [4, 6] }], nodes: [
    { name: "r", op: "reshape", inputs: ["x"], reshape: { shape: [2, 2, 6] } },
    { name: "t", op: "transpose", inputs: ["r"], transpose: { perm: [2, 0, 1] } },
    { name: "y", op: "reduce", inputs: ["t"], reduce: { mode: "mean", axes: [0, -1] } }] })", "m");
  const ModelSpec again = parse_model_json(model_spec_json(spec), "again");
  EXPECT_EQ(again.nodes[0].reshape, (std::vector<int64_t>{2, 2, 6}));
  EXPECT_EQ(again.nodes[1].perm, (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(again.nodes[2].reduce.mode, ReduceAttrs::Mode::mean);
  EXPECT_EQ(again.nodes[2].reduce.axes, (std::vector<int>{0, -1}));
}

// tandem's own BERT specs export a zero token-type table, as Hugging Face's BertModel has one;
// an imported model that has none says so (torch_names' empty name), and export adds none.
TEST(SpecJson, AnImportedBertWithoutTokenTypesExportsNone) {
  auto spec = [](const std::string& names) {
    return parse_model_json(cat(R"({ name: "m", inputs: [{ name: "ids", shape: [4], dtype: "int32" }], nodes: [
      { name: "bert.embeddings.word_embeddings", op: "embedding", inputs: ["ids"], embedding: { count: 10, features: 6 } },
      { name: "bert.embeddings.position_embeddings", op: "position_embedding", inputs: ["bert.embeddings.word_embeddings"],
        embedding: { count: 4 })", names, R"( },
      { name: "fc", op: "linear", inputs: ["bert.embeddings.position_embeddings"], linear: { out_features: 2 } }] })"), "m");
  };
  const std::vector<SafeTensor> hf = hugging_face_export_extras(Graph::build(spec("")));
  ASSERT_EQ(hf.size(), 1u);
  EXPECT_EQ(hf[0].name, "bert.embeddings.token_type_embeddings.weight");
  EXPECT_EQ(hf[0].shape, (std::vector<int64_t>{2, 6}));
  const std::string none = R"(, torch_names: [{ field: "token_type_embeddings", name: "" }])";
  EXPECT_TRUE(hugging_face_export_extras(Graph::build(spec(none))).empty());
  EXPECT_EQ(parse_model_json(model_spec_json(spec(none)), "again").nodes[1].torch_names, spec(none).nodes[1].torch_names);
  // An empty name for anything else is no name.
  EXPECT_EQ(error_of([&] { spec(R"(, torch_names: [{ field: "weight", name: "" }])"); }),
            "[model spec] node 'bert.embeddings.position_embeddings': field 'torch_names' entry 0 needs a 'field' and a 'name'");
}

// A position table with its own token-type table (embedding.types; an imported one-segment
// BERT): Hugging Face's loader reads both tables as they are (no row folded into the
// positions), export adds no zero table, the spec reads back; the field belongs on
// position_embedding only and contradicts a "no token-type table" name.
TEST(SpecJson, APositionTableWithItsTokenTypesLoadsBothAsTheyAre) {
  auto spec = [](const std::string& attrs, const std::string& op = "position_embedding") {
    return parse_model_json(cat(R"({ name: "m", inputs: [{ name: "ids", shape: [4], dtype: "int32" }], nodes: [
      { name: "bert.embeddings.word_embeddings", op: "embedding", inputs: ["ids"], embedding: { count: 10, features: 6 } },
      { name: "bert.embeddings.position_embeddings", op: ")", op, R"(", inputs: ["bert.embeddings.word_embeddings"], )", attrs, R"( },
      { name: "fc", op: "linear", inputs: ["bert.embeddings.position_embeddings"], linear: { out_features: 2 } }] })"), "m");
  };
  const std::string types = R"(embedding: { count: 4, types: 2 }, torch_names: [{ field: "token_type_embeddings", name: "bert.embeddings.token_type_embeddings.weight" }])";
  const ModelSpec m = spec(types);
  EXPECT_EQ(m.nodes[1].embedding.types, 2);
  EXPECT_EQ(parse_model_json(model_spec_json(m), "again").nodes[1].embedding.types, 2);
  const Graph g = Graph::build(m);
  EXPECT_TRUE(hugging_face_export_extras(g).empty());
  std::vector<float> positions(24), type_rows(12);
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = 0.5f + static_cast<float>(i);
  for (std::size_t i = 0; i < type_rows.size(); ++i) type_rows[i] = -0.25f * static_cast<float>(i);
  const std::vector<SafeTensor> hf = {f32_tensor("bert.embeddings.position_embeddings.weight", {4, 6}, positions.data()),
                                      f32_tensor("bert.embeddings.token_type_embeddings.weight", {2, 6}, type_rows.data())};
  const std::optional<SafeTensor> p = hugging_face_tensor(g, hf, "bert.embeddings.position_embeddings.weight");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->data, hf[0].data);  // not folded with the type row
  const std::optional<SafeTensor> t = hugging_face_tensor(g, hf, "bert.embeddings.token_type_embeddings.weight");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->data, hf[1].data);
  // Without types the same tables fold segment A's row into the positions, as before.
  const Graph folded = Graph::build(spec("embedding: { count: 4 }"));
  const std::optional<SafeTensor> f = hugging_face_tensor(folded, hf, "bert.embeddings.position_embeddings.weight");
  ASSERT_TRUE(f.has_value());
  float first = 0;
  std::memcpy(&first, f->data.data() + 4, 4);  // row 0, feature 1: 1.5 + (-0.25)
  EXPECT_FLOAT_EQ(first, 1.25f);

  EXPECT_EQ(error_of([&] { spec("embedding: { count: 4, types: -1 }"); }),
            "[model spec] node 'bert.embeddings.position_embeddings' (position_embedding): field 'embedding.types' (a "
            "token-type table) belongs on position_embedding, at least 1, got -1");
  EXPECT_EQ(error_of([&] { spec("embedding: { count: 10, features: 6, types: 2 }", "embedding"); }),
            "[model spec] node 'bert.embeddings.position_embeddings' (embedding): field 'embedding.types' (a token-type "
            "table) belongs on position_embedding, at least 1, got 2");
  EXPECT_EQ(error_of([&] { spec(R"(embedding: { count: 4, types: 2 }, torch_names: [{ field: "token_type_embeddings", name: "" }])"); }),
            "[model spec] node 'bert.embeddings.position_embeddings': field 'torch_names' says PyTorch's model has no "
            "token-type table, and field 'embedding.types' gives it one");
}

// An image's trained operand (binary.image_operand): tandem holds it [H, W, C] as the image
// is, PyTorch [C, H, W]; written and read back through that permutation. Any other operand,
// of three axes too, as it is; image_operand needs three.
TEST(SpecJson, AnImagesTrainedOperandIsChannelsFirstInTorch) {
  const ModelSpec m = parse_model_json(R"({ name: "m", inputs: [{ name: "x", shape: [2, 2, 3] }], nodes: [
    { name: "s", op: "binary", inputs: ["x"], binary: { mode: "mul", operand: [2, 2, 3], image_operand: true } },
    { name: "t", op: "binary", inputs: ["s"], binary: { mode: "mul", operand: [2, 2, 3] } },
    { name: "v", op: "binary", inputs: ["t"], binary: { mode: "add", operand: [3] } },
    { name: "f", op: "flatten", inputs: ["v"] },
    { name: "fc", op: "linear", inputs: ["f"], linear: { out_features: 2 } }] })", "m");
  const Graph g = Graph::build(m);
  Tensor ours = Tensor::empty({2, 2, 3});
  for (int64_t i = 0; i < 12; ++i) ours[i] = static_cast<float>(i);  // (h, w, c) = i / 6, i / 3 % 2, i % 3
  const SafeTensor t = to_torch(g, "s.operand", ours);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 2, 2}));
  std::vector<float> theirs(12);
  std::memcpy(theirs.data(), t.data.data(), 48);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t hw = 0; hw < 4; ++hw) EXPECT_EQ(theirs[static_cast<std::size_t>(c * 4 + hw)], static_cast<float>(hw * 3 + c));
  Tensor back = Tensor::zeros({2, 2, 3});
  from_torch(g, "s.operand", t, back);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(back[i], ours[i]);
  Tensor row = Tensor::empty({3});
  for (int64_t i = 0; i < 3; ++i) row[i] = static_cast<float>(i);
  EXPECT_EQ(to_torch(g, "v.operand", row).shape, (std::vector<int64_t>{3}));
  const SafeTensor same = to_torch(g, "t.operand", ours);
  EXPECT_EQ(same.shape, (std::vector<int64_t>{2, 2, 3}));
  EXPECT_EQ(std::memcmp(same.data.data(), ours.data(), 48), 0);
  EXPECT_NE(model_spec_json(parse_model_json(model_spec_json(m), "again")).find("image_operand: true"), std::string::npos);
  EXPECT_EQ(error_of([] {
              parse_model_json(R"({ name: "m", inputs: [{ name: "x", shape: [3] }], nodes: [
                { name: "s", op: "binary", inputs: ["x"], binary: { mode: "mul", operand: [3], image_operand: true } }] })", "m");
            }),
            "[model spec] node 's' (binary): field 'binary.image_operand' needs an operand of 3 dimensions [H, W, C], got 1");
}

TEST(SpecJson, BinaryBroadcastsAsNumpyAndRefusesWhatItCannot) {
  auto shape_of = [](const std::string& nodes) {
    std::string shape;
    const std::string error = error_of([&] {
      const Graph g = Graph::build(parse_model_json(cat(R"({ name: "m", inputs: [{ name: "x", shape: [4, 6] }], nodes: [
        { name: "c", op: "reduce", inputs: ["x"], reduce: { axes: [1] } },
        { name: "r", op: "reshape", inputs: ["c"], reshape: { shape: [4, 1] } },
        { name: "s", op: "slice", inputs: ["x"], slice: { axis: 0, start: 0, end: 1 } },)", nodes, "] }"), "m"));
      shape = g.nodes().back().shape.str();
    });
    return error == "(no error)" ? shape : error;
  };
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x", "r"], binary: { mode: "sub" } })"), "[4, 6]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["s", "x"], binary: { mode: "div" } })"), "[4, 6]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["r", "s"], binary: { mode: "mul" } })"), "[4, 6]");  // both repeat
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["c", "x"], binary: { mode: "add" } })"),
            "[graph] node 'y' (binary): inputs of shapes [4] and [4, 6] do not broadcast (their axis -1 is 4 and 6; each must be "
            "equal or 1)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "add", scalar: 2 } })"), "[4, 6]");
  const std::string modes = R"("add", "sub", "mul", "div", "equal", "not_equal", "less", "greater", "less_equal", "greater_equal")";
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x", "r"], binary: { mode: "pow" } })"),
            cat("[model spec] node 'y' (binary): field 'binary.mode' is 'pow' (one of ", modes, ")"));
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x", "r"] })"),
            cat("[model spec] node 'y' (binary): missing field 'binary' (mode: one of ", modes, ")"));
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x", "r"], binary: { mode: "less_equal" } })"), "[4, 6]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "greater", operand: [6] } })"),
            "[graph] node 'y' (binary): field 'binary.operand' with mode 'greater': a comparison passes no gradient, so its "
            "operand would never train (give 'scalar' or a second input)");
  // where: cond, then the branches not given as constants, broadcast as numpy
  EXPECT_EQ(shape_of(R"({ name: "y", op: "where", inputs: ["r", "x", "s"] })"), "[4, 6]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "where", inputs: ["r", "s"], where: { b: -inf } })"), "[4, 6]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "where", inputs: ["s"], where: { a: 1, b: 0 } })"), "[1, 6]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "where", inputs: ["r", "x"] })"),
            "[graph] node 'y' (where): field 'inputs' needs 3 inputs (cond, a, b; field 'where.a' or 'where.b' gives a constant "
            "instead), got 2");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "where", inputs: ["c", "x", "x"] })"),
            "[graph] node 'y' (where): inputs of shapes [4] and [4, 6] do not broadcast (their axis -1 is 4 and 6; each must be "
            "equal or 1)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "where", inputs: ["x", "x"], where: { a: nan } })"),
            "[model spec] node 'y' (where): field 'where.a' or 'where.b' is NaN (give a number or an infinity)");
  // expand: axes of 1 repeated, a leading axis added; any other size refused
  EXPECT_EQ(shape_of(R"({ name: "y", op: "expand", inputs: ["r"], expand: { shape: [4, 5] } })"), "[4, 5]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "expand", inputs: ["s"], expand: { shape: [3, 4, 1] } })"), "[3, 4, 6]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "expand", inputs: ["x"], expand: { shape: [4, 3] } })"),
            "[graph] node 'y' (expand): inputs of shapes [4, 6] and [4, 3] do not broadcast (their axis -1 is 6 and 3; each must "
            "be equal or 1)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "expand", inputs: ["x"], expand: { shape: [4, 0] } })"),
            "[graph] node 'y' (expand): field 'expand.shape' has dimension 1 of 0 (each 1 to 2147483648)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "expand", inputs: ["x"] })"),
            "[model spec] node 'y' (expand): missing field 'expand' (shape: the per-sample dimensions)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x", "r"], binary: { mode: "sub", scalar_first: true } })"),
            "[graph] node 'y' (binary): field 'binary.scalar_first' is set, but the node has two inputs (no scalar)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x", "r", "s"], binary: { mode: "add" } })"),
            "[graph] node 'y' (binary): field 'inputs' needs 2 inputs (or 1 and field 'binary.scalar' or 'binary.operand'), got 3");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "add" } })"),
            "[graph] node 'y' (binary): one input, and no field 'binary.scalar' or 'binary.operand' (the other operand)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "mul", operand: [1, 6] } })"), "[4, 6]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "mul", operand: [5] } })"),
            "[graph] node 'y' (binary): inputs of shapes [4, 6] and [5] do not broadcast (their axis -1 is 6 and 5; each must be "
            "equal or 1)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "mul", operand: [6, 0] } })"),
            "[graph] node 'y' (binary): field 'binary.operand' has dimension 1 of 0 (each 1 to 2147483648)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "mul", operand: [65536, 65536, 65536] } })"),
            "[graph] node 'y' (binary): field 'binary.operand' [65536, 65536, 65536] holds too many values");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x"], binary: { mode: "mul", scalar: 2, operand: [6] } })"),
            "[graph] node 'y' (binary): fields 'binary.scalar' and 'binary.operand' both give the other operand; give one");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "binary", inputs: ["x", "r"], binary: { mode: "add", scalar: 0 } })"),
            "[graph] node 'y' (binary): field 'binary.scalar' or 'binary.operand' is set, but the node has two inputs");
  EXPECT_EQ(shape_of(R"({ name: "t", op: "transpose", inputs: ["x"], transpose: { perm: [1, 0] } },
    { name: "y", op: "matmul", inputs: ["x", "t"] })"), "[4, 4]");
  EXPECT_EQ(shape_of(R"({ name: "h", op: "reshape", inputs: ["x"], reshape: { shape: [2, 2, 6] } },
    { name: "t", op: "transpose", inputs: ["x"], transpose: { perm: [1, 0] } },
    { name: "y", op: "matmul", inputs: ["h", "t"] })"), "[2, 2, 4]");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "matmul", inputs: ["x", "x"] })"),
            "[graph] node 'y' (matmul): inputs of shapes [4, 6] and [4, 6] (a's last axis, 6, must be b's next to last, 4)");
  EXPECT_EQ(shape_of(R"({ name: "y", op: "matmul", inputs: ["c", "x"] })"),
            "[graph] node 'y' (matmul): inputs of shapes [4] and [4, 6] (matmul needs matrices: at least 2 axes a sample)");
  EXPECT_EQ(shape_of(R"({ name: "h", op: "reshape", inputs: ["x"], reshape: { shape: [3, 4, 2] } },
    { name: "g", op: "reshape", inputs: ["x"], reshape: { shape: [2, 2, 6] } },
    { name: "y", op: "matmul", inputs: ["h", "g"] })"),
            "[graph] node 'y' (matmul): inputs of shapes [3, 4, 2] and [2, 2, 6] do not broadcast (their axis -3 is 3 and 2; each "
            "must be equal or 1)");
  // written back as JSON, read again: the same spec
  const ModelSpec spec = parse_model_json(R"({ name: "m", inputs: [{ name: "x", shape: [4, 6] }], nodes: [
    { name: "t", op: "binary", inputs: ["x"], binary: { mode: "div", scalar: 0.125, scalar_first: true } },
    { name: "y", op: "binary", inputs: ["t", "x"], binary: { mode: "mul" } }] })", "m");
  const ModelSpec again = parse_model_json(model_spec_json(spec), "again");
  EXPECT_EQ(again.nodes[0].binary.mode, BinaryAttrs::Mode::div);
  EXPECT_EQ(again.nodes[0].binary.scalar, 0.125f);
  EXPECT_TRUE(again.nodes[0].binary.scalar_first);
  EXPECT_EQ(again.nodes[1].binary.mode, BinaryAttrs::Mode::mul);
  EXPECT_FALSE(again.nodes[1].binary.scalar_first);
  // a comparison, a where with -inf and an expand read back as written
  const ModelSpec picks = parse_model_json(R"({ name: "m", inputs: [{ name: "x", shape: [1, 6] }], nodes: [
    { name: "c", op: "binary", inputs: ["x"], binary: { mode: "greater_equal", scalar: 0.5 } },
    { name: "w", op: "where", inputs: ["c", "x"], where: { b: -inf } },
    { name: "y", op: "expand", inputs: ["w"], expand: { shape: [3, 6] } }] })", "m");
  const std::string written = model_spec_json(picks);
  EXPECT_NE(written.find(R"({ name: "c", op: "binary", inputs: ["x"], binary: { mode: "greater_equal", scalar: 0.5 } })"),
            std::string::npos) << written;
  EXPECT_NE(written.find(R"({ name: "w", op: "where", inputs: ["c", "x"], where: { b: -inf } })"), std::string::npos) << written;
  EXPECT_NE(written.find(R"({ name: "y", op: "expand", inputs: ["w"], expand: { shape: [3, 6] } })"), std::string::npos) << written;
  const ModelSpec read = parse_model_json(written, "again");
  EXPECT_EQ(read.nodes[0].binary.mode, BinaryAttrs::Mode::greater_equal);
  EXPECT_FALSE(read.nodes[1].where.a.has_value());
  EXPECT_EQ(read.nodes[1].where.b, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(read.nodes[2].expand, (std::vector<int64_t>{3, 6}));
}

// A cut named by module (the nodes' names before a dot, as the import names them) is that
// module's last node, wherever a cut is given: tandem train, stage and tandem-edge ask Graph.
TEST(OnnxImport, ModuleNamesCutAtTheirLastNode) {
  const Graph g = Graph::build(parse_model_json(R"({ name: "m", inputs: [{ name: "x", shape: [4] }], nodes: [
      { name: "enc.0.fc", op: "linear", inputs: ["x"], linear: { out_features: 4 } },
      { name: "enc.0.act", op: "relu", inputs: ["enc.0.fc"] },
      { name: "enc.1", op: "linear", inputs: ["enc.0.act"], linear: { out_features: 4 } },
      { name: "enc.10", op: "relu", inputs: ["enc.1"] },
      { name: "head", op: "linear", inputs: ["enc.10"], linear: { out_features: 2 } }] })"));
  EXPECT_EQ(g.cut_nodes("enc.0"), "enc.0.act");
  EXPECT_EQ(g.cut_nodes("enc.1"), "enc.1");  // a node's own name, not enc.10's module
  EXPECT_EQ(g.cut_nodes("enc"), "enc.10");
  EXPECT_EQ(g.cut_nodes("enc.0, enc.1"), "enc.0.act,enc.1");
  EXPECT_EQ(g.cut_nodes("enc.1, head"), "enc.1, head");  // node names come back as given
  EXPECT_EQ(g.cut_nodes("auto"), "auto");
  EXPECT_EQ(g.cut_nodes("nothing"), "nothing");  // left for split's own error
  EXPECT_EQ(g.partition(cut_list(g.cut_nodes("enc.0,enc"))).size(), 3u);
}

TEST(OnnxProtobuf, EveryTruncationIsRefusedOrReadsAPrefix) {
  const std::vector<uint8_t> bytes = model(cnn_nodes(), cnn_weights());
  int refused = 0;
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    try {
      parse_onnx(std::span(bytes.data(), n), "t.onnx");
    } catch (const Error& e) {
      ++refused;
      EXPECT_EQ(std::string(e.what()).rfind("[onnx] t.onnx: not a readable ONNX model (", 0), 0u) << e.what();
    }
  }
  EXPECT_GT(refused, static_cast<int>(bytes.size()) * 9 / 10);  // a cut inside the graph breaks its length
}

TEST(OnnxProtobuf, MalformedFieldsAreNamed) {
  auto parse_graph = [](const Pb& g) {
    const std::string b = Pb().msg(7, g).b;
    return error_of([&] { parse_onnx(std::span(reinterpret_cast<const uint8_t*>(b.data()), b.size()), "x.onnx"); });
  };
  Pb short_raw = Pb().num(1, 4).num(2, 1).str(8, "w").str(9, std::string(12, '\0'));
  EXPECT_EQ(parse_graph(Pb().msg(5, short_raw)),
            "[onnx] x.onnx: not a readable ONNX model (x.onnx: initializer 'w': raw_data holds 12 bytes for 4 values of 4 bytes)");
  Pb external = Pb().num(1, 4).num(2, 1).str(8, "w").num(14, 1);
  EXPECT_NE(parse_graph(Pb().msg(5, external)).find("keeps its values in an external file"), std::string::npos);
  Pb strings = Pb().num(1, 1).num(2, 8).str(8, "s");
  EXPECT_EQ(parse_graph(Pb().msg(5, strings)),
            "[onnx] x.onnx: not a readable ONNX model (x.onnx: initializer 's': tensor data type 8 is not read (float, "
            "double, int64, int32, int8, uint8 and bool are))");
  Pb huge = Pb().num(1, int64_t{1} << 32).num(1, int64_t{1} << 32).num(2, 1).str(8, "h");
  EXPECT_EQ(parse_graph(Pb().msg(5, huge)), "[onnx] x.onnx: not a readable ONNX model (x.onnx: initializer 'h': more than 2^32 values)");
  Pb group;
  group.key(3, 3);
  EXPECT_EQ(parse_graph(group), "[onnx] x.onnx: not a readable ONNX model (wire type 3 (groups are not read))");
  const std::string no_graph = Pb().str(2, "pytorch").b;
  EXPECT_EQ(error_of([&] { parse_onnx(std::span(reinterpret_cast<const uint8_t*>(no_graph.data()), no_graph.size()), "y"); }),
            "[onnx] y: not a readable ONNX model (no graph: the file is not an ONNX model)");
}

// Every sample spec, written as JSON and read back, writes the same JSON and builds the same
// graph (ops, inputs, parameters).
TEST(SpecJson, SampleSpecsReadBackAsWritten) {
  int specs = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(std::string(TANDEM_SOURCE_DIR) + "/samples")) {
    const std::string path = entry.path().string();
    if (entry.path().extension() != ".json" || path.find("node_modules") != std::string::npos ||
        path.find("package") != std::string::npos)
      continue;
    ++specs;
    const ModelSpec a = load_model_spec(path);
    const std::string json = model_spec_json(a);
    const ModelSpec b = parse_model_json(json, path);
    EXPECT_EQ(model_spec_json(b), json) << path;
    ASSERT_EQ(a.nodes.size(), b.nodes.size()) << path;
    for (std::size_t i = 0; i < a.nodes.size(); ++i) {
      EXPECT_EQ(a.nodes[i].op, b.nodes[i].op) << path;
      EXPECT_EQ(a.nodes[i].inputs, b.nodes[i].inputs) << path;
    }
    EXPECT_EQ(a.cut, b.cut) << path;
    auto backend = make_backend("reference");
    const Graph ga = Graph::build(a), gb = Graph::build(b);
    Network na(ga, *backend, 0), nb(gb, *backend, 0);
    EXPECT_EQ(na.param_count(), nb.param_count()) << path;
  }
  EXPECT_GE(specs, 10);
}

}  // namespace
}  // namespace tandem
