// The op registry (core/ops) against independent arithmetic: every op's FLOPs recomputed
// here from the shapes (grouped and depthwise convolutions and heads included), each op's
// declared parameters against the layer it makes, and the planner's estimate built on them.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "core/graph.h"
#include "core/layers/layer.h"
#include "core/network.h"
#include "core/ops/op.h"
#include "core/optimizer.h"
#include "core/planner.h"
#include "test_support.h"

namespace tandem::test {
namespace {

NodeSpec named(const std::string& op) {
  NodeSpec n;
  n.name = op + "_node";
  n.op = op;
  return n;
}

struct Case {
  NodeSpec node;
  std::vector<Shape> in;
  double forward, backward;  // FLOPs of one sample, counted here from the shapes
};

// One case (or more) for every op; an op added to the registry without a case here fails
// EveryOpHasAnIndependentFlopCount.
std::vector<Case> cases() {
  std::vector<Case> c;
  auto conv = [](int64_t out, int64_t k, int64_t groups, int64_t stride, int64_t pad, bool bias) {
    NodeSpec n = named("conv2d");
    n.conv2d.out_channels = out;
    n.conv2d.kernel = {k, k};
    n.conv2d.stride = {stride, stride};
    n.conv2d.padding = {pad, pad};
    n.conv2d.groups = groups;
    n.conv2d.bias = bias;
    return n;
  };
  // Dense 3x3 on 8x8x4 -> 8x8x6: each of 384 outputs is 3*3*4 multiply-adds; backward the
  // same twice (data, weights) plus the bias' 384 adds.
  c.push_back({conv(6, 3, 1, 1, 1, true), {{8, 8, 4}}, 2.0 * 384 * 36, 2.0 * 2 * 384 * 36 + 384});
  // Grouped: 2 groups on 8x8x4 -> 8x8x6, so each output sees 2 input channels.
  c.push_back({conv(6, 3, 2, 1, 1, false), {{8, 8, 4}}, 2.0 * 384 * 18, 2.0 * 2 * 384 * 18});
  // Depthwise 3x3 stride 2 on 8x8x8 -> 4x4x8: one input channel an output.
  c.push_back({conv(8, 3, 8, 2, 1, false), {{8, 8, 8}}, 2.0 * 128 * 9, 2.0 * 2 * 128 * 9});
  // 1x1 on a pooled [8] -> [4] (a squeeze-excitation's): 4 outputs of 8 multiply-adds, the bias' 4.
  c.push_back({conv(4, 1, 1, 1, 0, true), {{8}}, 2.0 * 4 * 8, 2.0 * 2 * 4 * 8 + 4});
  NodeSpec lin = named("linear");
  lin.linear = {10, true};
  c.push_back({lin, {{20}}, 2.0 * 200, 2.0 * 2 * 200 + 10});
  // Heads: 3 heads of 20 -> 8 -> 5: 160 + 40 multiply-adds each, the ReLU on 8 values.
  NodeSpec heads = named("heads");
  heads.heads = {3, 8, 5};
  c.push_back({heads, {{20}}, 3 * (2.0 * 200 + 8), 3 * (2.0 * 200 + 8) + 3 * (2.0 * 200 + 8 + 5)});
  NodeSpec maxp = named("max_pool2d"), avgp = named("avg_pool2d");
  maxp.pool = avgp.pool = {{2, 2}, {2, 2}, {0, 0}};
  // 4x4x3 = 48 outputs of 2x2 windows: 3 comparisons or 4 adds each; backward routes one
  // value (max) or spreads over the window (avg).
  c.push_back({maxp, {{8, 8, 3}}, 48 * 3.0, 48 * 1.0});
  c.push_back({avgp, {{8, 8, 3}}, 48 * 4.0, 48 * 4.0});
  // Elementwise over 30 values: the arithmetic of each definition.
  const std::map<std::string, std::pair<double, double>> per_value{
      {"relu", {1, 1}},    {"relu6", {2, 2}},   {"hardswish", {5, 4}}, {"gelu", {6, 10}}, {"sigmoid", {3, 3}},
      {"tanh", {1, 3}},    {"silu", {4, 7}},    {"dropout", {2, 1}},   {"softmax", {3, 4}},
      {"gelu_tanh", {9, 19}}, {"hardsigmoid", {4, 2}}};
  for (const auto& [op, f] : per_value) c.push_back({named(op), {{5, 6}}, 30 * f.first, 30 * f.second});
  c.push_back({named("batch_norm"), {{5, 6}}, 30 * 7.0, 30 * 8.0 + 30 * 3.0});
  c.push_back({named("layer_norm"), {{5, 6}}, 30 * 6.0, 30 * 8.0 + 30 * 3.0});
  c.push_back({named("add"), {{5, 6}, {5, 6}}, 30.0, 0.0});
  // mul: a product a value; backward dy b and dy a (summed into b's 6 where b is repeated).
  c.push_back({named("mul"), {{5, 6}, {6}}, 30.0, 90.0});
  c.push_back({named("mul"), {{5, 6}, {5, 6}}, 30.0, 90.0});
  c.push_back({named("concat"), {{5, 6}, {5, 2}}, 0.0, 0.0});
  NodeSpec cut = named("slice");  // copies: features 2..5 of 5 tokens
  cut.slice = {1, 2, 5};
  c.push_back({cut, {{5, 6}}, 0.0, 0.0});
  NodeSpec view = named("reshape");  // a view: no work
  view.reshape = {4, 2, 12};
  c.push_back({view, {{4, 4, 6}}, 0.0, 0.0});
  NodeSpec turn = named("transpose");  // copies
  turn.perm = {2, 0, 1};
  c.push_back({turn, {{4, 4, 6}}, 0.0, 0.0});
  NodeSpec sum = named("reduce");  // [4, 4, 6] summed over axis 0: 96 adds, 24 scales; back a copy a value
  sum.reduce.axes = {0};
  c.push_back({sum, {{4, 4, 6}}, 96.0 + 24, 96.0});
  NodeSpec top = sum;  // the maximum over axis 0: 96 compares; back a routed copy, no arithmetic
  top.reduce.mode = ReduceAttrs::Mode::max;
  c.push_back({top, {{4, 4, 6}}, 96.0, 0.0});
  NodeSpec quotient = named("binary");  // [4, 4, 6] / [6]: 96 divisions; back dy / b and -dy a / b^2
  quotient.binary.mode = BinaryAttrs::Mode::div;
  c.push_back({quotient, {{4, 4, 6}, {6}}, 96.0, 5 * 96.0});
  NodeSpec shift = named("binary");  // [4, 4, 6] + 1: 96 adds; back a copy
  shift.binary.has_scalar = true;
  shift.binary.scalar = 1.0f;
  c.push_back({shift, {{4, 4, 6}}, 96.0, 0.0});
  NodeSpec below = named("binary");  // [4, 4, 6] < 0: 96 comparisons; no gradient
  below.binary.mode = BinaryAttrs::Mode::less;
  below.binary.has_scalar = true;
  c.push_back({below, {{4, 4, 6}}, 96.0, 0.0});
  // cond [4, 1] ? [4, 6] : [6]: 24 selects; back one select for each branch
  c.push_back({named("where"), {{4, 1}, {4, 6}, {6}}, 24.0, 48.0});
  NodeSpec repeat = named("expand");  // [1, 6] to [4, 6]: a copy; back 24 sums
  repeat.expand = {4, 6};
  c.push_back({repeat, {{1, 6}}, 0.0, 24.0});
  // [3, 4, 6] @ [6, 5]: 3 * 4 * 5 dot products of 6, so 360 multiply-adds; back dA and dB as many
  c.push_back({named("matmul"), {{3, 4, 6}, {6, 5}}, 2.0 * 360, 4.0 * 360});
  c.push_back({named("global_avg_pool"), {{4, 4, 6}}, 96.0 + 6, 96.0});
  c.push_back({named("flatten"), {{4, 4, 6}}, 0.0, 0.0});
  // Layer shards' joins: a copy (and the group's sum, which is the network's, not arithmetic here).
  c.push_back({named("tp_copy"), {{5, 6}}, 0.0, 0.0});
  c.push_back({named("tp_reduce"), {{5, 6}}, 0.0, 0.0});
  // A linear on a sequence of 7 tokens of 20: 7 rows of 200 multiply-adds.
  c.push_back({lin, {{7, 20}}, 7 * 2.0 * 200, 7 * 2.0 * 2 * 200 + 10});
  // With a rank-2 LoRA adapter: x A^T (20 -> 2) and B (2 -> 10) on 7 rows are 7 * (40 + 20)
  // multiply-adds each way, the scaled add 2 a value of 70 forward; backward the adapter's
  // products, its scaled gradient (70) and its add into dx (140); the frozen base has no
  // weight gradient, the adapter's two are another 7 * 60 multiply-adds and the scale (70).
  NodeSpec adapted = lin;
  adapted.lora = {2, 0.0f};
  c.push_back({adapted, {{7, 20}}, 7 * 2.0 * 200 + 7 * 2.0 * 60 + 140,
               (7 * 2.0 * 200 + 7 * 2.0 * 60 + 70 + 140) + (7 * 2.0 * 60 + 70)});
  // Attention on 6 tokens of 8 features in 2 heads: S = QK^T is 6*6 dot products of 8
  // (2 heads x 4), O = PV the same; the softmax 5 FLOPs on each of 2*6*6 scores. Backward:
  // four such products, 3 FLOPs a score.
  NodeSpec att = named("attention");
  att.attention = {2, false};
  c.push_back({att, {{6, 8}, {6, 8}, {6, 8}, {6}}, 2 * (2.0 * 36 * 8) + 5.0 * 72, 4 * (2.0 * 36 * 8) + 3.0 * 72});
  // Embeddings of 5 tokens of 6 features: token ids copy rows (their gradient adds, 30);
  // positions add a row (30 each way); LayoutLM's six rows add 6 a value each way.
  NodeSpec emb = named("embedding"), pos = named("position_embedding"), layout = named("layout_embedding");
  emb.embedding = {11, 6};
  pos.embedding = layout.embedding = {9, 0};
  c.push_back({emb, {{5}}, 0.0, 30.0});
  c.push_back({pos, {{5, 6}}, 30.0, 30.0});
  c.push_back({layout, {{5, 6}, {5, 4}}, 6 * 30.0, 6 * 30.0});
  // tokens: a view; class_token on 5 tokens of 6: 36 adds each way (6 tokens out).
  c.push_back({named("tokens"), {{2, 3, 6}}, 0.0, 0.0});
  c.push_back({named("class_token"), {{5, 6}}, 36.0, 36.0});
  // token_pool over 5 tokens of 6: first is a copy; mean adds 30 values and scales 6, and
  // spreads 30 scaled values back.
  NodeSpec first = named("token_pool"), mean = named("token_pool");
  mean.token_pool.mean = true;
  c.push_back({first, {{5, 6}}, 0.0, 0.0});
  c.push_back({mean, {{5, 6}, {5}}, 36.0, 30.0});
  return c;
}

TEST(OpRegistry, EveryOpHasAnIndependentFlopCount) {
  std::map<std::string, int> seen;
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.node.op);
    const Shape out = infer_shape(k.node, k.in);
    const OpCost cost = op_cost(k.node, k.in, out);
    EXPECT_DOUBLE_EQ(cost.forward_flops, k.forward);
    EXPECT_DOUBLE_EQ(cost.backward_flops(), k.backward);
    ++seen[k.node.op];
  }
  for (const std::string& op : op_names()) EXPECT_TRUE(seen.count(op)) << "no FLOP case for op '" << op << "'";
}

// Bytes: a convolution moves its input, output and weights; a view (flatten) moves nothing.
TEST(OpRegistry, BytesMovedFollowTheShapes) {
  const Case dense = cases()[0];
  const OpCost c = op_cost(dense.node, dense.in, infer_shape(dense.node, dense.in));
  const double x = 8 * 8 * 4, y = 8 * 8 * 6, w = 6 * 3 * 3 * 4 + 6;
  EXPECT_DOUBLE_EQ(c.forward_bytes, 4 * (x + y + w));
  EXPECT_DOUBLE_EQ(c.backward_bytes, 4 * (y + 2 * x + 2 * w));
  const NodeSpec flat = named("flatten");
  const OpCost v = op_cost(flat, std::vector<Shape>{{4, 4, 6}}, Shape{96});
  EXPECT_EQ(v.forward_bytes, 0.0);
  EXPECT_EQ(v.backward_bytes, 0.0);
}

// What the registry says an op's parameters are is what its layer holds, name and shape.
TEST(OpRegistry, DeclaredParametersAreTheLayersParameters) {
  auto reference = make_backend("reference");
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.node.name + " (" + k.node.op + ")");
    ModelSpec spec;
    spec.name = "params";
    std::vector<std::string> inputs;
    for (std::size_t i = 0; i < k.in.size(); ++i) {
      spec.inputs.push_back({"x" + std::to_string(i), k.in[i]});
      inputs.push_back("x" + std::to_string(i));
    }
    NodeSpec n = k.node;
    n.inputs = inputs;
    spec.nodes.push_back(n);
    spec.output = n.name;
    Network net(Graph::build(spec), *reference, 1);
    const std::vector<ParamSpec> declared = op_params(n, k.in);
    const std::vector<Param*> held = net.all_params();  // frozen ones too (a LoRA adapter's base)
    ASSERT_EQ(declared.size(), held.size());
    for (std::size_t i = 0; i < held.size(); ++i) {
      EXPECT_EQ(n.name + "." + declared[i].field, held[i]->name());
      EXPECT_EQ(declared[i].shape, held[i]->value().shape());
    }
  }
}

// The planner's schedule: the cloud sends each input gradient before its weight gradients
// and runs those while no activations wait. Two micro-batches, every pass 1 s, a free link:
// the edge gets its gradients at 2 and 3 instead of 3 and 5, and the step takes 4 s, not 6.
// When the edge is slower, deferred work fills the cloud's gaps and costs nothing.
TEST(Planner, InputGradientsFirstShortenTheStep) {
  MicrobatchCost split{1, 1, 1, 1, 0, 0}, whole{1, 1, 2, 0, 0, 0};
  const StepTimeline zb = simulate_step({split, split}), inline_weights = simulate_step({whole, whole});
  EXPECT_DOUBLE_EQ(zb.step_s, 4.0);
  EXPECT_DOUBLE_EQ(inline_weights.step_s, 6.0);
  // The edge hands mb 0 up at 1, computes mb 1's forward until 2, and takes gradient 0 up at
  // 2 (zero bubble) or when it arrives at 3 (inline).
  EXPECT_DOUBLE_EQ(zb.first_grad_s, 1.0);
  EXPECT_DOUBLE_EQ(inline_weights.first_grad_s, 2.0);
  EXPECT_DOUBLE_EQ(zb.edge_idle_s, 0.0);  // 4 s of its own work in a 4 s step
  EXPECT_DOUBLE_EQ(inline_weights.edge_idle_s, 2.0);
  EXPECT_DOUBLE_EQ(inline_weights.bubble(), 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(zb.cloud_idle_s, 0.0);
  MicrobatchCost slow_edge{2, 1, 1, 1, 0, 0};
  EXPECT_DOUBLE_EQ(simulate_step({slow_edge, slow_edge}).step_s, 6.0);
  // A cloud whose deferred tail outlasts the edge's backward delays the next step's start.
  MicrobatchCost heavy_weights{1, 1, 1, 5, 0, 0};
  EXPECT_DOUBLE_EQ(simulate_step({heavy_weights, heavy_weights}).step_s, 3.0 + 10.0 - 1.0);
}

TEST(OpRegistry, UnknownOpIsRefusedWithTheKnownOnes) {
  const std::string e = error_of([] { (void)op_def("swishy"); });
  EXPECT_NE(e.find("unknown op 'swishy'"), std::string::npos) << e;
  EXPECT_NE(e.find("silu"), std::string::npos) << e;
}

// The plan of one sample at K = 1, cut at `cut`, on links too fast to count, with compute at a
// FLOP a second: each row's edge_s and cloud_s are the shards' FLOP counts.
std::vector<PlanRow> flop_plan(const ModelSpec& spec, const std::string& cut) {
  PlanOptions o;
  o.batch = 1;
  o.microbatches = {1};
  o.cuts = {cut};
  o.uplink_mbps = o.downlink_mbps = 1e9;
  o.edge_gflops = o.cloud_gflops = 1e-9;
  auto reference = make_backend("reference");
  return plan_split(Graph::build(spec), o, *reference, *reference);
}

// The planner's estimate is the registry's FLOPs: a depthwise model costs what its
// depthwise convolution does, not a dense one (the planner counted grouped convolutions as
// dense before the registry).
TEST(OpRegistry, PlannerEstimatesDepthwiseFlops) {
  const ModelSpec spec = parse_model_json(R"({ name: "dw", inputs: [ { name: "x", shape: [8, 8, 8] } ], nodes: [
    { name: "dw", op: "conv2d", inputs: ["x"], conv2d: { out_channels: 8, kernel: [3], padding: [1], groups: 8, bias: false } },
    { name: "flat", op: "flatten", inputs: ["dw"] },
    { name: "fc", op: "linear", inputs: ["flat"], linear: { out_features: 4, bias: false } } ], cut: "dw" })");
  const std::vector<PlanRow> rows = flop_plan(spec, "dw");
  ASSERT_EQ(rows.size(), 1u);
  const double dw = 2.0 * 8 * 8 * 8 * 9;  // 512 outputs of 9 multiply-adds
  EXPECT_NEAR(rows[0].edge_s, dw + dw, 1e-6);  // forward, and weights only (it reads the input)
  const double fc = 2.0 * 512 * 4;
  EXPECT_NEAR(rows[0].cloud_s, fc + 2 * fc, 1e-6);
}

// The estimate counts only what the edge's backward computes: no gradient for a frozen
// layer's weights, no input gradient where nothing below wants one. fc1 8 -> 8 and fc2
// 8 -> 4 on the edge (each pass 2 I O FLOPs a sample), fc3 4 -> 2 on the cloud.
TEST(Planner, EstimateCountsOnlyWhatABackwardComputes) {
  const auto edge_flops = [](bool freeze_fc1, bool freeze_fc2) {
    const std::string spec = cat(R"({ name: "f", inputs: [ { name: "x", shape: [8] } ], nodes: [
      { name: "fc1", op: "linear", inputs: ["x"], linear: { out_features: 8, bias: false }, freeze: )",
                                 freeze_fc1 ? "true" : "false", R"( },
      { name: "fc2", op: "linear", inputs: ["fc1"], linear: { out_features: 4, bias: false }, freeze: )",
                                 freeze_fc2 ? "true" : "false", R"( },
      { name: "fc3", op: "linear", inputs: ["fc2"], linear: { out_features: 2, bias: false } } ], cut: "fc2" })");
    const std::vector<PlanRow> rows = flop_plan(parse_model_json(spec), "fc2");
    EXPECT_EQ(rows.size(), 1u);
    return rows.at(0).edge_s;
  };
  const double fc1 = 2.0 * 8 * 8, fc2 = 2.0 * 8 * 4;
  EXPECT_NEAR(edge_flops(false, false), (fc1 + fc2) + fc1 + (fc2 + fc2), 1e-6) << "fc1 no input gradient (the edge's input)";
  EXPECT_NEAR(edge_flops(true, false), (fc1 + fc2) + fc2, 1e-6) << "fc2's weights only: nothing below it trains";
  EXPECT_NEAR(edge_flops(false, true), (fc1 + fc2) + fc1 + fc2, 1e-6) << "fc2 passes the gradient down to fc1's weights";
}

// A cut inside an encoder sends the mask with the activations: a byte a token per sample on
// top of the activations and the label (samples/forms-layoutlm: 16 tokens of 32 features).
TEST(Planner, TheMaskGoesUpWithTheActivations) {
  const Graph g = Graph::build(load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/forms-layoutlm/model.json"));
  PlanOptions o;
  o.batch = 8;
  o.microbatches = {1};
  o.cuts = {g.default_cut(), "layoutlm.pooler.first"};
  o.uplink_mbps = o.downlink_mbps = 1e3;
  o.edge_gflops = o.cloud_gflops = 1.0;
  auto reference = make_backend("reference");
  const std::vector<PlanRow> rows = plan_split(g, o, *reference, *reference);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].bytes_up_per_step - rows[1].bytes_up_per_step, 8 * (16 * 32 * 4 + 16) - 8 * (32 * 4))
      << "inside the encoder: [16, 32] activations and 16 mask bytes a sample; after the pool: [32], no mask";
}

// A shard's training memory, as the planner and the cloud's admission at Hello count it: a
// linear 4 -> 3 with bias trained by SGD with momentum keeps its 15 parameters three times
// (value, gradient, momentum); each of the batch's 8 samples keeps its input and output (7
// floats) for backward; and a micro-batch (4 of them at K = 2, or all 8) passes through every
// tensor and back through as many gradient buffers. A frozen one keeps its value only, and
// Adam keeps two moments.
TEST(Planner, TrainingMemoryCountsWhatTheShardKeeps) {
  NodeSpec fc = named("linear");
  fc.linear.out_features = 3;
  auto reference = make_backend("reference");
  Network net(Graph::build(one_node_spec({4}, fc)), *reference, 1);
  EXPECT_EQ(training_memory_bytes(net, 8, 4, 1), (15 * 3 + 7 * 8 + 2 * 7 * 4) * 4.0);
  EXPECT_EQ(training_memory_bytes(net, 8, 4, 2), (15 * 4 + 7 * 8 + 2 * 7 * 4) * 4.0);
  EXPECT_EQ(training_memory_bytes(net, 8, 8, 1), (15 * 3 + 7 * 8 + 2 * 7 * 8) * 4.0) << "one micro-batch of 8";
  fc.freeze = true;
  Network frozen(Graph::build(one_node_spec({4}, fc)), *reference, 1);
  EXPECT_EQ(training_memory_bytes(frozen, 8, 4, 1), (15 + 7 * 8 + 2 * 7 * 4) * 4.0);
  EXPECT_EQ(optimizer_state_floats({.momentum = 0.9f}), 1);
  EXPECT_EQ(optimizer_state_floats({}), 0);
  EXPECT_EQ(optimizer_state_floats({.kind = "adamw"}), 2);
}

// Capability answers: every backend says what it runs; xnnpack declines heads with a reason,
// and a network refuses such a node by name instead of failing at its first step.
TEST(OpRegistry, BackendsAnswerWhatTheySupport) {
  for (const std::string& name : backend_names()) {
    SCOPED_TRACE(name);
    auto backend = make_backend(name);
    for (const std::string& op : op_names()) {
      const Support s = backend->supports(op, {});
      if (name == "xnnpack" && op == "heads") {
        EXPECT_FALSE(s.ok);
        EXPECT_NE(s.why.find("grouped linear"), std::string::npos) << s.why;
        NodeSpec h = named("heads");
        h.heads = {2, 3, 4};
        const std::string e = error_of([&] { Network net(Graph::build(one_node_spec({5}, h)), *backend, 1); });
        EXPECT_NE(e.find("node 'heads_node' (heads) cannot run on the xnnpack backend"), std::string::npos) << e;
      } else {
        EXPECT_TRUE(s.ok) << op << ": " << s.why;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::test
