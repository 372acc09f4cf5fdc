// Gradient checks: for each layer on the backend under test, the analytic gradients of
// L = sum(output * R) with respect to the input and every parameter are compared with
// central finite differences of the same backend's forward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/graph.h"
#include "core/loss.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "core/ops/op.h"
#include "grad_support.h"
#include "test_support.h"

namespace tandem::test {
namespace {

// Builds the network on the backend under test and checks every gradient (input and
// parameters) of a random weighted sum of its output. `more` are the graph's further inputs
// (masks, boxes, ids: not differentiated); `input_grad` false when input 0 is not
// differentiable either (token ids).
void check_spec(const ModelSpec& spec, Tensor x, const std::string& what, std::vector<Tensor> more = {},
                bool input_grad = true, const std::function<void(Network&)>& prepare = nullptr) {
  auto backend = make_test_backend(backend_under_test());
  Graph graph = Graph::build(spec);
  Network net(graph, *backend, 11);
  if (prepare) prepare(net);
  Rng rng(99);
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), more.begin(), more.end());
  const Tensor& y0 = net.forward(inputs, 0);
  Tensor r = random_tensor(y0.shape(), rng);
  net.zero_grad();
  Tensor dx = net.backward(r, 0, input_grad);
  if (input_grad) dx = dx.clone();
  check_network_gradients(net, inputs, r, dx, input_grad, what, "", rng);
}

// A one-node network.
void check_node(const Shape& in, const NodeSpec& node, Tensor x) { check_spec(one_node_spec(in, node), x, node.name); }

NodeSpec node(const std::string& op) {
  NodeSpec n;
  n.name = op + "0";
  n.op = op;
  return n;
}

TEST(GradConv2d, Padded) {
  NodeSpec n = node("conv2d");
  n.conv2d.out_channels = 4;
  n.conv2d.kernel = {3, 3};
  n.conv2d.padding = {1, 1};
  Rng rng(1);
  check_node({6, 5, 3}, n, random_tensor({2, 6, 5, 3}, rng));
}

// Channels in 16s: xnnpack's forward and input gradient run as Winograd F(2x2, 3x3).
TEST(GradConv2d, WinogradShape) {
  NodeSpec n = node("conv2d");
  n.conv2d.out_channels = 16;
  n.conv2d.kernel = {3, 3};
  n.conv2d.padding = {1, 1};
  Rng rng(5);
  check_node({5, 3, 16}, n, random_tensor({2, 5, 3, 16}, rng));
}

TEST(GradConv2d, GroupedAndDepthwise) {
  NodeSpec n = node("conv2d");
  n.conv2d.out_channels = 4;
  n.conv2d.kernel = {3, 3};
  n.conv2d.padding = {1, 1};
  n.conv2d.groups = 2;
  Rng rng(11);
  check_node({5, 5, 6}, n, random_tensor({2, 5, 5, 6}, rng));
  n.conv2d.out_channels = 6;
  n.conv2d.groups = 6;
  n.conv2d.stride = {2, 2};
  check_node({5, 6, 6}, n, random_tensor({2, 5, 6, 6}, rng));
}

TEST(GradConv2d, StrideDilationNoBias) {
  NodeSpec n = node("conv2d");
  n.conv2d.out_channels = 3;
  n.conv2d.kernel = {3, 2};
  n.conv2d.stride = {2, 1};
  n.conv2d.dilation = {2, 2};
  n.conv2d.padding = {1, 2};
  n.conv2d.bias = false;
  Rng rng(2);
  check_node({9, 7, 2}, n, random_tensor({2, 9, 7, 2}, rng));
}

// 16 output channels: xnnpack's weight gradient is the direct SIMD kernel.
TEST(GradConv2d, SimdWeightGradStride2) {
  NodeSpec n = node("conv2d");
  n.conv2d.out_channels = 16;
  n.conv2d.kernel = {3, 3};
  n.conv2d.stride = {2, 2};
  n.conv2d.padding = {1, 1};
  Rng rng(3);
  check_node({7, 6, 2}, n, random_tensor({2, 7, 6, 2}, rng));
}

TEST(GradLinear, Basic) {
  NodeSpec n = node("linear");
  n.linear.out_features = 6;
  Rng rng(3);
  check_node({10}, n, random_tensor({3, 10}, rng));
}

// On a sequence [tokens, features]: each token's row through the same weights.
TEST(GradLinear, Sequence) {
  NodeSpec n = node("linear");
  n.linear.out_features = 6;
  Rng rng(23);
  check_node({4, 7}, n, random_tensor({2, 4, 7}, rng));
  check_node({5, 8}, n, random_tensor({3, 5, 8}, rng));
}

NodeSpec wired(NodeSpec n, std::vector<std::string> inputs) {
  n.inputs = std::move(inputs);
  return n;
}

NodeSpec linear_node(const std::string& name, int64_t out) {
  NodeSpec n = node("linear");
  n.name = name;
  n.linear.out_features = out;
  return n;
}

// A padding mask [batch, tokens]: sample 0 keeps its first `kept` tokens, the others keep
// every token but the second.
Tensor padding_mask(int64_t batch, int64_t tokens, int64_t kept) {
  Tensor m = Tensor::zeros({batch, tokens});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t) m[b * tokens + t] = (b == 0 ? t < kept : t != 1) ? 1.0f : 0.0f;
  return m;
}

// BERT's self-attention block: query, key and value linears, attention over 2 heads with a
// key padding mask (causal too), the output linear.
TEST(GradAttention, SelfAttentionBlock) {
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    ModelSpec spec;
    spec.name = "test.attention";
    spec.inputs = {{"x", {5, 8}}, {"mask", {5}}};
    NodeSpec att = node("attention");
    att.attention = {2, causal};
    spec.nodes = {wired(linear_node("q", 8), {"x"}), wired(linear_node("k", 8), {"x"}), wired(linear_node("v", 8), {"x"}),
                  wired(att, {"q", "k", "v", "mask"}), wired(linear_node("o", 6), {att.name})};
    spec.output = "o";
    Rng rng(29);
    check_spec(spec, random_tensor({3, 5, 8}, rng), "attention", {padding_mask(3, 5, 3)});
  }
}

// Token ids pick rows: only the table has a gradient (ids are not differentiable).
TEST(GradEmbedding, TokenIds) {
  NodeSpec n = node("embedding");
  n.embedding = {7, 4};
  Tensor ids = Tensor::empty({2, 5});
  const float picks[10] = {0, 3, 3, 6, 1, 2, 2, 2, 5, 0};  // repeated ids sum their gradients
  for (int i = 0; i < 10; ++i) ids[i] = picks[i];
  check_spec(one_node_spec({5}, n), ids, "embedding", {}, false);
}

TEST(GradEmbedding, Positions) {
  NodeSpec n = node("position_embedding");
  n.embedding = {9, 0};
  Rng rng(37);
  check_node({6, 4}, n, random_tensor({2, 6, 4}, rng));
}

// LayoutLM's 2-D positions: boxes whose corners share rows of the x and y tables.
TEST(GradEmbedding, Layout) {
  ModelSpec spec;
  spec.name = "test.layout";
  spec.inputs = {{"x", {3, 4}}, {"boxes", {3, 4}}};
  NodeSpec n = node("layout_embedding");
  n.embedding = {10, 0};
  spec.nodes = {wired(n, {"x", "boxes"})};
  spec.output = n.name;
  Tensor boxes = Tensor::empty({2, 3, 4});
  const float corners[24] = {0, 0, 3, 2, 3, 2, 9, 2, 1, 1, 1, 1, 5, 0, 9, 9, 0, 4, 4, 8, 2, 2, 7, 3};
  for (int i = 0; i < 24; ++i) boxes[i] = corners[i];
  Rng rng(41);
  check_spec(spec, random_tensor({2, 3, 4}, rng), "layout_embedding", {boxes});
}

// Ids and boxes come from the edge's own data: a bad one stops the forward with an Error that
// names the node, the value and where it is.
TEST(GradEmbedding, BadIdsAndBoxesAreRefusedWithTheNode) {
  auto backend = make_test_backend(backend_under_test());
  NodeSpec n = node("embedding");
  n.embedding = {7, 4};
  Network net(Graph::build(one_node_spec({3}, n)), *backend, 1);
  for (const auto& [bad, text] : std::vector<std::pair<float, std::string>>{
           {7.0f, "token id 7 at element 4"}, {-1.0f, "token id -1 at element 4"}, {2.5f, "token id 2.5 at element 4"}}) {
    Tensor ids = Tensor::zeros({2, 3});
    ids[4] = bad;
    EXPECT_EQ(error_of([&] { net.forward(ids, 0); }),
              "[embedding] node 'embedding0': " + text + " is not an integer in [0, 7)");
  }
  ModelSpec spec;
  spec.name = "test.layout";
  spec.inputs = {{"x", {2, 4}}, {"boxes", {2, 4}}};
  NodeSpec l = node("layout_embedding");
  l.embedding = {10, 0};
  spec.nodes = {wired(l, {"x", "boxes"})};
  spec.output = l.name;
  Network layout(Graph::build(spec), *backend, 1);
  Tensor boxes = Tensor::zeros({1, 2, 4});
  boxes[4] = 5.0f, boxes[6] = 3.0f;  // box 1: x0 5, x1 3
  const std::vector<Tensor> in{Tensor::zeros({1, 2, 4}), boxes};
  EXPECT_EQ(error_of([&] { layout.forward(in, 0); }),
            "[embedding] node 'layout_embedding0': box 1 [5, 0, 3, 0] ends before it starts (boxes are [x0, y0, x1, y1])");
}

// A sample whose every key is padding: its attention output and every gradient stay finite
// (0), and the other samples are unaffected by it.
TEST(GradAttention, FullyMaskedSampleStaysFinite) {
  auto backend = make_test_backend(backend_under_test());
  ModelSpec spec;
  spec.name = "test.masked";
  spec.inputs = {{"x", {4, 8}}, {"mask", {4}}};
  NodeSpec att = node("attention");
  att.attention = {2, false};
  spec.nodes = {wired(linear_node("q", 8), {"x"}), wired(att, {"q", "x", "x", "mask"})};
  spec.output = att.name;
  Network net(Graph::build(spec), *backend, 1);
  Rng rng(47);
  Tensor mask = Tensor::zeros({2, 4});
  for (int t = 0; t < 4; ++t) mask[t] = 1.0f;  // sample 0 keeps all; sample 1 none
  const std::vector<Tensor> in{random_tensor({2, 4, 8}, rng, -30.0f, 30.0f), mask};
  const Tensor y = net.forward(in, 0).clone();
  for (int64_t i = 32; i < 64; ++i) ASSERT_EQ(y[i], 0.0f) << i;
  net.zero_grad();
  const Tensor dx = net.backward(random_tensor({2, 4, 8}, rng), 0, true);
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_TRUE(std::isfinite(dx[i])) << i;
  for (Param* p : net.params())
    for (int64_t i = 0; i < p->grad().numel(); ++i) ASSERT_TRUE(std::isfinite(p->grad()[i])) << p->name();
}

// ViT's embeddings: patches by a strided convolution seen as tokens, a [CLS] vector before
// them and position embeddings added.
TEST(GradEmbedding, PatchesAndClassToken) {
  ModelSpec spec;
  spec.name = "test.vit";
  spec.inputs = {{"image", {4, 6, 2}}};
  NodeSpec conv = node("conv2d");
  conv.name = "patch";
  conv.conv2d.out_channels = 5;
  conv.conv2d.kernel = {2, 2};
  conv.conv2d.stride = {2, 2};
  NodeSpec tokens = node("tokens"), cls = node("class_token");
  spec.nodes = {wired(conv, {"image"}), wired(tokens, {"patch"}), wired(cls, {tokens.name})};
  spec.output = cls.name;
  EXPECT_EQ(Graph::build(spec).node(cls.name).shape, (Shape{7, 5}));  // 2 x 3 patches and [CLS]
  Rng rng(53);
  check_spec(spec, random_tensor({2, 4, 6, 2}, rng), "class_token");
}

NodeSpec lora_linear(int64_t out, int64_t rank, float alpha) {
  NodeSpec n = linear_node("fc", out);
  n.lora = {rank, alpha};
  return n;
}

// LoRA on a linear (on a sequence): the adapter's A and B get their gradients, the input its
// own through the base and the adapter; B starts at zero, so it is set first (else A's
// gradient would be zero and prove nothing).
TEST(GradLora, AdapterAndInputGradients) {
  Rng rng(59);
  check_spec(one_node_spec({3, 7}, lora_linear(5, 2, 4.0f)), random_tensor({2, 3, 7}, rng), "lora", {}, true,
             [](Network& net) {
               Rng r(61);
               Param& b = net.param("fc.lora_B.weight");
               for (int64_t i = 0; i < b.value().numel(); ++i) b.value()[i] = r.uniform(-1.0f, 1.0f);
               b.bump_version();
             });
}

// The adapted layer is the base layer with W + (alpha / r) B A: the same output as a plain
// linear holding the merged weights; only A and B train, the base has no gradient buffer.
TEST(GradLora, EqualsTheMergedWeightsAndTrainsOnlyTheAdapter) {
  auto backend = make_test_backend(backend_under_test());
  Network adapted(Graph::build(one_node_spec({7}, lora_linear(5, 3, 6.0f))), *backend, 3);
  Network merged(Graph::build(one_node_spec({7}, linear_node("fc", 5))), *backend, 4);
  ASSERT_EQ(adapted.params().size(), 2u);
  EXPECT_EQ(adapted.params()[0]->name(), "fc.lora_A.weight");
  EXPECT_EQ(adapted.params()[1]->name(), "fc.lora_B.weight");
  EXPECT_EQ(adapted.all_params().size(), 4u);
  EXPECT_FALSE(adapted.param("fc.weight").trainable());
  EXPECT_FALSE(adapted.param("fc.weight").grad().defined());
  Rng rng(67);
  Param& b = adapted.param("fc.lora_B.weight");
  for (int64_t i = 0; i < b.value().numel(); ++i) b.value()[i] = rng.uniform(-1.0f, 1.0f);
  b.bump_version();
  const Tensor& a = adapted.param("fc.lora_A.weight").value();
  Tensor w = adapted.param("fc.weight").value().clone();
  for (int64_t o = 0; o < 5; ++o)
    for (int64_t i = 0; i < 7; ++i) {
      double d = 0;
      for (int64_t r = 0; r < 3; ++r) d += static_cast<double>(b.value()[o * 3 + r]) * a[r * 7 + i];
      w[o * 7 + i] += static_cast<float>(2.0 * d);  // alpha / rank = 2
    }
  merged.param("fc.weight").value().copy_from(w);
  merged.param("fc.bias").value().copy_from(adapted.param("fc.bias").value());
  for (Param* p : merged.all_params()) p->bump_version();
  const Tensor x = random_tensor({4, 7}, rng);
  const Tensor y = adapted.forward(x, 0).clone();
  expect_close(y.data(), merged.forward(x, 0).data(), y.numel(), "adapted vs merged", 1e-5f);
  // One SGD step moves A and B only.
  const Tensor base = adapted.param("fc.weight").value().clone(), a_before = a.clone();
  Sgd sgd(adapted.params(), {.lr = 0.1f});
  adapted.zero_grad();
  adapted.forward(x, 0);
  adapted.backward(random_tensor({4, 5}, rng), 0, false);
  sgd.step();
  EXPECT_EQ(max_abs_diff(base, adapted.param("fc.weight").value()), 0.0f);
  EXPECT_GT(max_abs_diff(a_before, adapted.param("fc.lora_A.weight").value()), 0.0f);
}

// Frozen nodes: no gradient buffers, not in params() (so no optimizer state, checkpoint or
// round), their values unchanged by training, while the input gradient still flows through.
TEST(GradLora, FrozenNodesDoNotTrain) {
  auto backend = make_test_backend(backend_under_test());
  ModelSpec spec;
  spec.name = "test.frozen";
  spec.inputs = {{"ids", {4}, true, false}};
  NodeSpec emb = node("embedding"), ln = node("layer_norm"), fc = linear_node("fc", 3), head = linear_node("head", 2);
  emb.embedding = {9, 6};
  emb.freeze = ln.freeze = fc.freeze = true;
  spec.nodes = {wired(emb, {"ids"}), wired(ln, {emb.name}), wired(fc, {ln.name}), wired(node("token_pool"), {"fc"}),
                wired(head, {"token_pool0"})};
  spec.output = "head";
  Network net(Graph::build(spec), *backend, 5);
  ASSERT_EQ(net.params().size(), 2u);  // head.weight, head.bias
  EXPECT_EQ(net.all_params().size(), 7u);
  for (Param* p : net.all_params()) EXPECT_EQ(p->trainable(), p->name().rfind("head.", 0) == 0) << p->name();
  std::vector<Tensor> before;
  for (Param* p : net.all_params()) before.push_back(p->value().clone());
  Tensor ids = Tensor::zeros({3, 4});
  for (int64_t i = 0; i < 12; ++i) ids[i] = static_cast<float>(i % 9);
  Sgd sgd(net.params(), {.lr = 0.5f});
  Rng rng(71);
  for (int s = 0; s < 3; ++s) {
    net.zero_grad();
    net.forward(ids, 0);
    net.backward(random_tensor({3, 2}, rng), 0, false);
    sgd.step();
  }
  for (std::size_t i = 0; i < before.size(); ++i) {
    const float moved = max_abs_diff(before[i], net.all_params()[i]->value());
    if (net.all_params()[i]->trainable()) EXPECT_GT(moved, 0.0f) << net.all_params()[i]->name();
    else EXPECT_EQ(moved, 0.0f) << net.all_params()[i]->name();
  }
}

// LoRA's input dropout (PEFT's lora_dropout): evaluation computes what an adapter without
// dropout does; in training each forward draws a new mask, replayed by rewinding the layer's
// call counter (what a resumed checkpoint does); and the gradients of A, B and the input,
// checked by finite differences under one mask, follow the dropped input.
TEST(GradLora, InputDropout) {
  auto backend = make_test_backend(backend_under_test());
  NodeSpec n = lora_linear(5, 3, 6.0f);
  n.lora.dropout = 0.5f;
  Network net(Graph::build(one_node_spec({3, 7}, n)), *backend, 3);
  Network plain(Graph::build(one_node_spec({3, 7}, lora_linear(5, 3, 6.0f))), *backend, 3);
  Rng rng(73);
  Param& b = net.param("fc.lora_B.weight");
  for (int64_t i = 0; i < b.value().numel(); ++i) b.value()[i] = rng.uniform(-1.0f, 1.0f);
  b.bump_version();
  plain.param("fc.lora_B.weight").value().copy_from(b.value());
  plain.param("fc.lora_B.weight").bump_version();
  const Tensor x = random_tensor({4, 3, 7}, rng, 0.5f, 1.5f);
  uint64_t* calls = nullptr;
  for (auto& [name, value] : net.counters())
    if (name == "fc.lora_dropout.calls") calls = value;
  ASSERT_NE(calls, nullptr) << "the dropout's call counter is not among the network's counters";

  net.set_training(false);
  const Tensor evaluated = net.forward(x, 0).clone();
  expect_close(evaluated.data(), plain.forward(x, 0).data(), evaluated.numel(), "evaluation, no dropout", 1e-6f);
  net.set_training(true);
  const uint64_t start = *calls;
  const Tensor first = net.forward(x, 0).clone();
  EXPECT_GT(max_abs_diff(first, evaluated), 1e-3f) << "training dropped nothing";
  EXPECT_GT(max_abs_diff(net.forward(x, 0), first), 1e-3f) << "the next forward drew the same mask";
  *calls = start;
  EXPECT_EQ(max_abs_diff(net.forward(x, 0), first), 0.0f) << "a rewound counter did not replay the mask";

  // loss = sum(y * dy) under the mask of call start + 1.
  const Tensor dy = random_tensor(first.shape(), rng);
  auto loss = [&](const Tensor& input) {
    *calls = start;
    const Tensor& y = net.forward(input, 0);
    double l = 0.0;
    for (int64_t i = 0; i < y.numel(); ++i) l += static_cast<double>(y[i]) * dy[i];
    return l;
  };
  loss(x);
  net.zero_grad();
  const Tensor dx = net.backward(dy, 0, true).clone();
  const float h = 1e-2f;
  for (const char* name : {"fc.lora_A.weight", "fc.lora_B.weight"}) {
    Param& p = net.param(name);
    const Tensor analytic = p.grad().clone();
    for (int64_t i = 0; i < p.value().numel(); ++i) {
      const float v = p.value()[i];
      p.value()[i] = v + h;
      p.bump_version();
      const double up = loss(x);
      p.value()[i] = v - h;
      p.bump_version();
      const double down = loss(x);
      p.value()[i] = v;
      p.bump_version();
      EXPECT_NEAR(analytic[i], (up - down) / (2.0 * h), 2e-2) << name << "[" << i << "]";
    }
  }
  Tensor moved = x.clone();
  for (int64_t i = 0; i < x.numel(); ++i) {
    moved[i] = x[i] + h;
    const double up = loss(moved);
    moved[i] = x[i] - h;
    const double down = loss(moved);
    moved[i] = x[i];
    EXPECT_NEAR(dx[i], (up - down) / (2.0 * h), 2e-2) << "x[" << i << "]";
  }
}

TEST(GradTokenPool, FirstAndMaskedMean) {
  Rng rng(43);
  check_node({4, 6}, node("token_pool"), random_tensor({2, 4, 6}, rng));
  ModelSpec spec;
  spec.name = "test.token_pool";
  spec.inputs = {{"x", {4, 6}}, {"mask", {4}}};
  NodeSpec n = node("token_pool");
  n.token_pool.mean = true;
  spec.nodes = {wired(n, {"x", "mask"})};
  spec.output = n.name;
  check_spec(spec, random_tensor({3, 4, 6}, rng), "token_pool mean", {padding_mask(3, 4, 2)});
}

TEST(GradRelu, AwayFromKink) {
  Rng rng(4);
  Tensor x = Tensor::empty({2, 4, 4, 3});
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = (rng.uniform01() < 0.5f ? -1.0f : 1.0f) * rng.uniform(0.1f, 1.0f);
  check_node({4, 4, 3}, node("relu"), x);
}

Tensor distinct_values(const Shape& shape, Rng& rng) {
  // Values 0.05 apart, shuffled: a +-eps nudge never changes which element is the maximum.
  Tensor x = Tensor::empty(shape);
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(i) * 0.05f - 1.0f;
  for (int64_t i = x.numel() - 1; i > 0; --i) std::swap(x[i], x[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)))]);
  return x;
}

TEST(GradMaxPool2d, Tiled) {
  NodeSpec n = node("max_pool2d");
  n.pool.kernel = {2, 2};
  n.pool.stride = {2, 2};
  Rng rng(5);
  check_node({6, 4, 3}, n, distinct_values({2, 6, 4, 3}, rng));
}

TEST(GradMaxPool2d, OverlappingPadded) {
  NodeSpec n = node("max_pool2d");
  n.pool.kernel = {3, 3};
  n.pool.stride = {2, 2};
  n.pool.padding = {1, 1};
  Rng rng(6);
  check_node({7, 5, 2}, n, distinct_values({2, 7, 5, 2}, rng));
}

TEST(GradAvgPool2d, TiledAndPaddedOverlapping) {
  Rng rng(8);
  NodeSpec n = node("avg_pool2d");
  n.pool.kernel = {2, 2};
  n.pool.stride = {2, 2};
  check_node({6, 4, 3}, n, random_tensor({2, 6, 4, 3}, rng));
  n.pool.kernel = {3, 3};
  n.pool.padding = {1, 1};
  check_node({7, 5, 2}, n, random_tensor({2, 7, 5, 2}, rng));
}

TEST(GradFlatten, View) {
  Rng rng(7);
  check_node({3, 2, 4}, node("flatten"), random_tensor({2, 3, 2, 4}, rng));
}

// Batch norm in training mode: the statistics depend on the input, so the finite differences
// see the whole function. Then evaluation: running statistics as torch updates them.
TEST(GradBatchNorm, TrainingAndRunningStatistics) {
  Rng rng(18);
  Tensor x = random_tensor({4, 3, 2, 5}, rng, -2.0f, 2.0f);
  check_node({3, 2, 5}, node("batch_norm"), x);

  auto backend = make_test_backend(backend_under_test());
  Network net(Graph::build(one_node_spec({3, 2, 5}, node("batch_norm"))), *backend, 1);
  Tensor y = net.forward(x, 0).clone();  // training: per channel mean 0, variance ~1
  const int64_t c = 5, rows = x.numel() / c;
  for (int64_t k = 0; k < c; ++k) {
    double m = 0, v = 0, xm = 0, xv = 0;
    for (int64_t r = 0; r < rows; ++r) m += y[r * c + k], xm += x[r * c + k];
    m /= rows, xm /= rows;
    for (int64_t r = 0; r < rows; ++r) v += (y[r * c + k] - m) * (y[r * c + k] - m), xv += (x[r * c + k] - xm) * (x[r * c + k] - xm);
    EXPECT_NEAR(m, 0.0, 1e-5);
    EXPECT_NEAR(v / rows, 1.0, 1e-3);
    // Evaluation after that one step: running mean 0.1 * mean, variance 0.9 + 0.1 * unbiased var.
    const double rm = 0.1 * xm, rv = 0.9 + 0.1 * xv / (rows - 1);
    net.set_training(false);
    const Tensor& e = net.forward(x, 1);
    EXPECT_NEAR(e[k], (x[k] - rm) / std::sqrt(rv + 1e-5), 1e-4) << "channel " << k;
    net.set_training(true);
  }
}

// Dropout: in training about p of the values are zeroed and the rest scaled by 1 / (1 - p),
// the backward uses the same mask, the same seed gives the same masks, evaluation passes
// values through.
TEST(Dropout, MaskScaleBackwardAndEvaluation) {
  NodeSpec n = node("dropout");
  n.dropout.p = 0.25f;
  Rng rng(19);
  Tensor x = random_tensor({4, 2500}, rng, 0.5f, 1.5f);  // no zeros: a zero output means dropped
  auto backend = make_test_backend(backend_under_test());
  auto run = [&](Network& net) { return net.forward(x, 0).clone(); };
  Network a(Graph::build(one_node_spec({2500}, n)), *backend, 5), b(Graph::build(one_node_spec({2500}, n)), *backend, 5);
  const Tensor ya = run(a), yb = run(b);
  int64_t dropped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(ya[i], yb[i]) << "same seed, same mask";
    if (ya[i] == 0.0f)
      ++dropped;
    else
      ASSERT_FLOAT_EQ(ya[i], x[i] / 0.75f);
  }
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(x.numel()), 0.25, 0.02);
  Tensor dy = random_tensor(x.shape(), rng);
  Tensor dx = a.backward(dy, 0, true).clone();
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_FLOAT_EQ(dx[i], ya[i] == 0.0f ? 0.0f : dy[i] / 0.75f);
  EXPECT_NE(std::memcmp(run(a).data(), ya.data(), static_cast<std::size_t>(x.numel()) * sizeof(float)), 0)
      << "the next training forward draws a new mask";
  a.set_training(false);
  const Tensor ye = run(a);
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(ye[i], x[i]);
}

// A residual connection: s = linear(x) + x, so x's gradient adds up from two consumers.
TEST(GradAdd, Residual) {
  ModelSpec spec;
  spec.name = "test.add";
  spec.inputs.push_back({"x", Shape{4}});
  NodeSpec lin;
  lin.name = "lin";
  lin.op = "linear";
  lin.inputs = {"x"};
  lin.linear.out_features = 4;
  NodeSpec add;
  add.name = "sum";
  add.op = "add";
  add.inputs = {"lin", "x"};
  spec.nodes = {lin, add};
  spec.output = "sum";
  Rng rng(16);
  check_spec(spec, random_tensor({3, 4}, rng), "add");
}

// Channels side by side: a linear branch and the input itself.
TEST(GradConcat, TwoBranches) {
  ModelSpec spec;
  spec.name = "test.concat";
  spec.inputs.push_back({"x", Shape{2, 3}});
  NodeSpec act;
  act.name = "act";
  act.op = "tanh";
  act.inputs = {"x"};
  NodeSpec cat_node;
  cat_node.name = "joined";
  cat_node.op = "concat";
  cat_node.inputs = {"x", "act", "x"};
  spec.nodes = {act, cat_node};
  spec.output = "joined";
  Rng rng(17);
  check_spec(spec, random_tensor({2, 2, 3}, rng), "concat");
  EXPECT_EQ(Graph::build(spec).node("joined").shape, (Shape{2, 9}));
}

// Layer normalisation over tokens' features ([tokens, features] a sample); its forward gives
// each row mean 0 and variance 1 / (1 + eps / var) before the scale and shift, with the spec's eps.
TEST(GradLayerNorm, TokensAndFeatures) {
  Rng rng(19);
  check_node({5, 12}, node("layer_norm"), random_tensor({3, 5, 12}, rng, -2.0f, 2.0f));

  NodeSpec ln = node("layer_norm");
  ln.layer_norm.eps = 0.5f;
  auto backend = make_test_backend(backend_under_test());
  Network net(Graph::build(one_node_spec({4, 6}, ln)), *backend, 1);
  const Tensor x = random_tensor({2, 4, 6}, rng, -2.0f, 2.0f);
  const Tensor& y = net.forward(x, 0);
  for (int64_t r = 0; r < 8; ++r) {
    double m = 0, v = 0, ym = 0, yv = 0;
    for (int64_t i = 0; i < 6; ++i) m += x[r * 6 + i], ym += y[r * 6 + i];
    m /= 6, ym /= 6;
    for (int64_t i = 0; i < 6; ++i) v += (x[r * 6 + i] - m) * (x[r * 6 + i] - m), yv += (y[r * 6 + i] - ym) * (y[r * 6 + i] - ym);
    v /= 6, yv /= 6;
    EXPECT_NEAR(ym, 0.0, 1e-5) << "row " << r;
    EXPECT_NEAR(yv, v / (v + 0.5), 1e-4) << "row " << r;
  }
}

TEST(GradSoftmax, LastDimension) {
  Rng rng(15);
  check_node({6}, node("softmax"), random_tensor({3, 6}, rng, -2.0f, 2.0f));
}

TEST(GradGlobalAvgPool, Mean) {
  Rng rng(14);
  check_node({3, 4, 5}, node("global_avg_pool"), random_tensor({2, 3, 4, 5}, rng));
}

// Activations by finite differences, on values away from their kinks (relu6 at 0 and 6,
// hardswish at +-3).
TEST(GradActivation, AllKinds) {
  int tested = 0;
  for (const std::string& name : op_names()) {
    if (!find_activation(name)) continue;
    const char* op = name.c_str();
    ++tested;
    SCOPED_TRACE(op);
    Rng rng(13);
    Tensor x = Tensor::empty({2, 3, 5});
    for (int64_t i = 0; i < x.numel(); ++i) {
      float v = rng.uniform(-7.5f, 7.5f);
      for (float kink : {-3.0f, 0.0f, 3.0f, 6.0f})
        if (std::fabs(v - kink) < 0.05f) v = kink + 0.1f;
      x[i] = v;
    }
    check_node({3, 5}, node(op), x);
  }
  EXPECT_GE(tested, 6) << "the registry lost activation ops";
}

// Heads: 3 heads of Linear(5 -> 4), ReLU, Linear(4 -> 2). Backends without a grouped linear
// kernel (xnnpack) say so through supports(), and the test skips with their words.
TEST(GradHeads, ThreeHeads) {
  NodeSpec n = node("heads");
  n.heads = {3, 4, 2};
  if (const Support s = make_test_backend(backend_under_test())->supports("heads", {}); !s)
    GTEST_SKIP() << backend_under_test() << ": " << s.why;
  Rng rng(12);
  check_node({5}, n, random_tensor({4, 5}, rng));
}

TEST(GradSoftmaxCrossEntropy, Logits) {
  Rng rng(8);
  Tensor logits = random_tensor({5, 7}, rng, -3.0f, 3.0f);
  const int32_t labels[5] = {0, 6, 3, 3, 1};
  Tensor grad = Tensor::empty(logits.shape());
  softmax_cross_entropy(logits, labels, 1.0f, &grad);
  check_gradient(logits, grad, [&] { return softmax_cross_entropy(logits, labels, 1.0f, nullptr); },
                 "softmax_cross_entropy.logits", rng);
}

// Three heads' logits side by side: each head's loss against the same label, averaged.
TEST(GradSoftmaxCrossEntropy, Heads) {
  Rng rng(9);
  Tensor logits = random_tensor({4, 3 * 5}, rng, -3.0f, 3.0f);
  const int32_t labels[4] = {0, 4, 2, 2};
  Tensor grad = Tensor::empty(logits.shape());
  const double loss = softmax_cross_entropy(logits, labels, 1.0f, &grad, 3);
  check_gradient(logits, grad, [&] { return softmax_cross_entropy(logits, labels, 1.0f, nullptr, 3); },
                 "softmax_cross_entropy.heads", rng);
  double by_hand = 0.0;  // the mean over heads of each head's loss
  for (int h = 0; h < 3; ++h) {
    Tensor one = Tensor::empty({4, 5});
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 5; ++c) one[r * 5 + c] = logits[r * 15 + h * 5 + c];
    by_hand += softmax_cross_entropy(one, labels, 1.0f, nullptr) / 3.0;
  }
  EXPECT_NEAR(loss, by_hand, 1e-9);
}

// torch.nn.MSELoss (mean over N * C) against one-hot labels: the value by hand, the gradient
// by finite differences, heads averaged, and the loss chosen by name.
TEST(GradMse, OneHotTargets) {
  Rng rng(10);
  Tensor y = random_tensor({3, 4}, rng);
  const int32_t labels[3] = {2, 0, 3};
  double by_hand = 0.0;  // sum over rows of the row's mean squared error
  for (int r = 0; r < 3; ++r) {
    double row = 0.0;
    for (int c = 0; c < 4; ++c) {
      const double d = y[r * 4 + c] - (c == labels[r] ? 1.0 : 0.0);
      row += d * d;
    }
    by_hand += row / 4.0;
  }
  Tensor grad = Tensor::empty(y.shape());
  EXPECT_NEAR(mse_onehot(y, labels, 1.0f / 3.0f, &grad), by_hand, 1e-6);
  EXPECT_NEAR(compute_loss("mse", y, labels, 1.0f, nullptr), by_hand, 1e-6);
  check_gradient(y, grad, [&] { return mse_onehot(y, labels, 1.0f, nullptr) / 3.0; }, "mse.outputs", rng);

  Tensor heads = random_tensor({2, 2 * 3}, rng);
  const int32_t two[2] = {1, 2};
  Tensor hgrad = Tensor::empty(heads.shape());
  mse_onehot(heads, two, 1.0f, &hgrad, 2);
  check_gradient(heads, hgrad, [&] { return mse_onehot(heads, two, 1.0f, nullptr, 2); }, "mse.heads", rng);
  EXPECT_EQ(error_of([&] { compute_loss("hinge", y, labels, 1.0f, nullptr); }),
            "[loss] unknown loss 'hinge' (known: softmax_cross_entropy, mse)");
}

}  // namespace
}  // namespace tandem::test
