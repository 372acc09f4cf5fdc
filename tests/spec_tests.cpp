// Model spec and graph tests: the JSON form parses, bad specs are refused with an error that
// names the node and field, and split() cuts where one tensor crosses and refuses otherwise.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"

namespace tandem::test {
namespace {

std::string sample_path() { return std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json"; }

// Runs f and returns the Error message it throws ("" when it does not throw).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Graph graph_of(const std::string& json) { return Graph::build(parse_model_json(json)); }

std::string with_nodes(const std::string& nodes, const std::string& extra = "") {
  return R"({ name: "t", inputs: [ { name: "x", shape: [8, 8, 2] } ], nodes: [ )" + nodes + " ] " + extra + "}";
}

TEST(Spec, SampleParsesWithShapesAndParams) {
  ModelSpec spec = load_model_spec(sample_path());
  EXPECT_EQ(spec.cut, "pool2");
  Graph g = Graph::build(spec);
  ASSERT_EQ(g.nodes().size(), 10u);
  EXPECT_EQ(g.node("pool2").shape, (Shape{7, 7, 64}));
  EXPECT_EQ(g.node("flatten").shape, (Shape{3136}));
  EXPECT_EQ(g.node("fc2").shape, (Shape{10}));
  const auto names = g.param_names();
  ASSERT_EQ(names.size(), 8u);
  EXPECT_EQ(names[0], "conv1.weight");
  EXPECT_EQ(names[7], "fc2.bias");
}

TEST(Spec, HeadsSampleParsesWithItsGroups) {
  const Graph g = Graph::build(load_model_spec(std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/heads.json"));
  EXPECT_EQ(g.node("heads").shape, (Shape{80}));
  EXPECT_EQ(g.output_groups(), 8);
  const auto names = g.param_names();
  EXPECT_EQ(std::vector<std::string>(names.end() - 4, names.end()),
            (std::vector<std::string>{"heads.w1", "heads.b1", "heads.w2", "heads.b2"}));
  const std::string msg = error_of([] {
    graph_of(with_nodes(R"({ name: "f", op: "flatten", inputs: ["x"] },
                           { name: "h", op: "heads", inputs: ["f"], heads: { count: 4, hidden: 0, out_features: 3 } })"));
  });
  EXPECT_EQ(msg, "[model spec] node 'h' (heads): field 'heads.hidden' must be > 0, got 0");
}

TEST(Spec, AddNeedsTwoInputsOfOneShape) {
  EXPECT_EQ(error_of([] { graph_of(with_nodes(R"({ name: "s", op: "add", inputs: ["x"] })")); }),
            "[graph] node 's' (add): field 'inputs' needs 2 inputs, got 1");
  EXPECT_EQ(error_of([] {
              graph_of(with_nodes(R"({ name: "p", op: "max_pool2d", inputs: ["x"], pool: { kernel: [2] } },
                                     { name: "s", op: "add", inputs: ["x", "p"] })"));
            }),
            "[graph] node 's' (add): inputs of shapes [8, 8, 2] and [4, 4, 2] (add needs equal shapes)");
}

TEST(Spec, ConcatNeedsMatchingLeadingDimensions) {
  EXPECT_EQ(error_of([] {
              graph_of(with_nodes(R"({ name: "p", op: "max_pool2d", inputs: ["x"], pool: { kernel: [2] } },
                                     { name: "c", op: "concat", inputs: ["x", "p"] })"));
            }),
            "[graph] node 'c' (concat): input [4, 4, 2] differs from [8, 8, 2] in more than the last dimension");
}

TEST(Spec, DropoutProbabilityMustBeBelowOne) {
  EXPECT_EQ(error_of([] { graph_of(with_nodes(R"({ name: "d", op: "dropout", inputs: ["x"], dropout: { p: 1.0 } })")); }),
            "[model spec] node 'd' (dropout): field 'dropout.p' must be in [0, 1), got 1");
}

TEST(Spec, BinaryRoundTrip) {
  ModelSpec spec = load_model_spec(sample_path());
  ModelSpec again = parse_model_binary(spec.binary.data(), spec.binary.size());
  EXPECT_EQ(again.nodes.size(), spec.nodes.size());
  EXPECT_EQ(again.binary, spec.binary);
}

TEST(Spec, NodesOutOfOrderAreSorted) {
  Graph g = graph_of(with_nodes(R"({ name: "b", op: "relu", inputs: ["a"] }, { name: "a", op: "relu", inputs: ["x"] })",
                                R"(, output: "b")"));
  EXPECT_EQ(g.nodes()[0].spec.name, "a");
  EXPECT_EQ(g.nodes()[1].spec.name, "b");
}

TEST(Spec, MalformedJsonIsRefusedWithPosition) {
  const std::string msg = error_of([] { parse_model_json("{ name: \"t\", nodes: [ { name: ", "bad.json"); });
  EXPECT_NE(msg.find("[model spec] bad.json"), std::string::npos) << msg;
}

TEST(Spec, UnknownFieldIsNamed) {
  const std::string msg = error_of([] { parse_model_json(with_nodes(R"({ name: "a", op: "relu", inputs: ["x"], colour: 3 })")); });
  EXPECT_NE(msg.find("colour"), std::string::npos) << msg;
}

TEST(Spec, UnknownOpNamesTheNode) {
  const std::string msg = error_of([] { graph_of(with_nodes(R"({ name: "mystery", op: "frobnicate", inputs: ["x"] })")); });
  EXPECT_EQ(msg.rfind("[model spec] node 'mystery': field 'op' has unknown op 'frobnicate'", 0), 0u) << msg;
}

TEST(Spec, MissingAttributeNamesNodeAndField) {
  const std::string msg = error_of([] { graph_of(with_nodes(R"({ name: "c1", op: "conv2d", inputs: ["x"], conv2d: { kernel: [3] } })")); });
  EXPECT_EQ(msg, "[model spec] node 'c1' (conv2d): field 'conv2d.out_channels' must be > 0, got 0");
}

TEST(Spec, BadPairNamesField) {
  const std::string msg = error_of([] {
    graph_of(with_nodes(R"({ name: "c1", op: "conv2d", inputs: ["x"], conv2d: { out_channels: 2, kernel: [3, 3, 3] } })"));
  });
  EXPECT_EQ(msg, "[model spec] node 'c1': field 'conv2d.kernel' takes 1 or 2 values, got 3");
}

TEST(Spec, ShapeMismatchNamesTheNode) {
  const std::string msg = error_of([] { graph_of(with_nodes(R"({ name: "fc", op: "linear", inputs: ["x"], linear: { out_features: 3 } })")); });
  EXPECT_EQ(msg, "[graph] node 'fc' (linear): expects a vector [features] or a sequence [tokens, features] per sample, "
                 "got [8, 8, 2] (add a flatten node before it)");
}

// A BERT-style encoder layer in the JSON form: ids and mask as inputs, the embeddings,
// attention with the mask, the pooled first token.
constexpr const char* kEncoder = R"({ name: "enc", inputs: [ { name: "ids", shape: [6] }, { name: "mask", shape: [6] } ],
  nodes: [
    { name: "tok", op: "embedding", inputs: ["ids"], embedding: { count: 50, features: 8 } },
    { name: "pos", op: "position_embedding", inputs: ["tok"], embedding: { count: 16 } },
    { name: "ln", op: "layer_norm", inputs: ["pos"], layer_norm: { eps: 1e-12 } },
    { name: "q", op: "linear", inputs: ["ln"], linear: { out_features: 8 } },
    { name: "k", op: "linear", inputs: ["ln"], linear: { out_features: 8 } },
    { name: "v", op: "linear", inputs: ["ln"], linear: { out_features: 8 } },
    { name: "att", op: "attention", inputs: ["q", "k", "v", "mask"], attention: { heads: 2 } },
    { name: "cls", op: "token_pool", inputs: ["att"] },
    { name: "mean", op: "token_pool", inputs: ["att", "mask"], token_pool: { mode: "mean" } },
    { name: "fc", op: "linear", inputs: ["cls"], linear: { out_features: 2 } } ], output: "fc" })";

TEST(Spec, TransformerNodesParseWithTheirShapes) {
  const Graph g = graph_of(kEncoder);
  EXPECT_EQ(g.node("tok").shape, (Shape{6, 8}));
  EXPECT_EQ(g.node("att").shape, (Shape{6, 8}));
  EXPECT_EQ(g.node("cls").shape, (Shape{8}));
  EXPECT_EQ(g.node("mean").shape, (Shape{8}));
  EXPECT_EQ(g.node("fc").shape, (Shape{2}));
  EXPECT_EQ(g.nodes()[static_cast<std::size_t>(g.find("att"))].spec.attention.heads, 2);
  EXPECT_TRUE(g.nodes()[static_cast<std::size_t>(g.find("mean"))].spec.token_pool.mean);
}

TEST(Spec, FreezeAndLoraParseAndAreChecked) {
  const Graph g = graph_of(with_nodes(R"({ name: "f", op: "flatten", inputs: ["x"] },
    { name: "fc", op: "linear", inputs: ["f"], linear: { out_features: 4 }, lora: { rank: 2, alpha: 8 } },
    { name: "out", op: "linear", inputs: ["fc"], linear: { out_features: 2 }, freeze: true })"));
  const NodeSpec& fc = g.node("fc").spec;
  EXPECT_EQ(fc.lora.rank, 2);
  EXPECT_FLOAT_EQ(fc.lora.scale(), 4.0f);
  EXPECT_TRUE(g.node("out").spec.freeze);
  EXPECT_EQ(error_of([] {
              graph_of(with_nodes(R"({ name: "p", op: "max_pool2d", inputs: ["x"], pool: { kernel: [2] }, lora: { rank: 2 } })"));
            }),
            "[model spec] node 'p': field 'lora' applies to linear nodes only");
  EXPECT_EQ(error_of([] {
              graph_of(with_nodes(R"({ name: "f", op: "flatten", inputs: ["x"] },
                { name: "fc", op: "linear", inputs: ["f"], linear: { out_features: 4 }, lora: { rank: 0 } })"));
            }),
            "[model spec] node 'fc' (linear): field 'lora.rank' must be > 0, got 0");
  EXPECT_EQ(error_of([] {
              graph_of(with_nodes(R"({ name: "f", op: "flatten", inputs: ["x"] },
                { name: "fc", op: "linear", inputs: ["f"], linear: { out_features: 4 }, lora: { rank: 2, dropout: 1 } })"));
            }),
            "[model spec] node 'fc' (linear): field 'lora.dropout' must be in [0, 1), got 1");
  EXPECT_FLOAT_EQ(graph_of(with_nodes(R"({ name: "f", op: "flatten", inputs: ["x"] },
                { name: "fc", op: "linear", inputs: ["f"], linear: { out_features: 4 }, lora: { rank: 2, dropout: 0.1 } })"))
                      .node("fc")
                      .spec.lora.dropout,
                  0.1f);
  EXPECT_EQ(error_of([] { graph_of(with_nodes(R"({ name: "b", op: "batch_norm", inputs: ["x"], freeze: true })")); }),
            "[model spec] node 'b': field 'freeze': freezing a batch_norm node is not supported yet (linear, conv2d, "
            "layer_norm and the embeddings can be frozen)");
}

TEST(Spec, TransformerNodesAreCheckedWithNodeAndField) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = kEncoder;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  EXPECT_EQ(error_of([&] { graph_of(with("heads: 2", "heads: 3")); }),
            "[graph] node 'att' (attention): 8 features do not split into 3 heads (field 'attention.heads')");
  EXPECT_EQ(error_of([&] { graph_of(with("heads: 2", "heads: 0")); }),
            "[model spec] node 'att' (attention): field 'attention.heads' must be > 0, got 0");
  EXPECT_EQ(error_of([&] { graph_of(with(R"(["q", "k", "v", "mask"])", R"(["q", "k", "ids"])")); }),
            "[graph] node 'att' (attention): query, key and value must have one shape, got [6, 8], [6, 8], [6]");
  EXPECT_EQ(error_of([&] { graph_of(with(R"(["q", "k", "v", "mask"])", R"(["q", "k", "v", "ln"])")); }),
            "[graph] node 'att' (attention): its mask must be [tokens] = [6], got [6, 8]");
  EXPECT_EQ(error_of([&] { graph_of(with("count: 16", "count: 4")); }),
            "[graph] node 'pos' (position_embedding): 6 tokens exceed the table's 4 positions (field 'embedding.count')");
  EXPECT_EQ(error_of([&] { graph_of(with("count: 50, features: 8", "count: 50")); }),
            "[model spec] node 'tok' (embedding): field 'embedding.features' must be > 0, got 0");
  EXPECT_EQ(error_of([&] { graph_of(with(R"(mode: "mean")", R"(mode: "max")")); }),
            "[model spec] node 'mean' (token_pool): field 'token_pool.mode' is 'first' or 'mean', got 'max'");
}

TEST(Spec, KernelLargerThanInputNamesTheNode) {
  const std::string msg = error_of([] {
    graph_of(with_nodes(R"({ name: "big", op: "conv2d", inputs: ["x"], conv2d: { out_channels: 2, kernel: [9] } })"));
  });
  EXPECT_EQ(msg.rfind("[graph] node 'big' (conv2d): kernel larger than the padded input", 0), 0u) << msg;
}

TEST(Spec, UnknownInputNamesTheNode) {
  const std::string msg = error_of([] { graph_of(with_nodes(R"({ name: "r", op: "relu", inputs: ["nowhere"] })")); });
  EXPECT_EQ(msg, "[graph] node 'r': field 'inputs' names unknown tensor 'nowhere'");
}

TEST(Spec, CycleIsRefused) {
  const std::string msg = error_of([] {
    graph_of(with_nodes(R"({ name: "a", op: "relu", inputs: ["b"] }, { name: "b", op: "relu", inputs: ["a"] })"));
  });
  EXPECT_EQ(msg, "[graph] the graph has a cycle through nodes 'a', 'b'");
}

TEST(Spec, DuplicateNameIsRefused) {
  const std::string msg = error_of([] {
    graph_of(with_nodes(R"({ name: "a", op: "relu", inputs: ["x"] }, { name: "a", op: "relu", inputs: ["x"] })"));
  });
  EXPECT_EQ(msg, "[model spec] node 'a': field 'name' repeats a name already used");
}

TEST(Spec, GarbageBinaryIsRefused) {
  const uint8_t junk[16] = {1, 2, 3, 4, 'T', 'D', 'M', 'S', 9, 9, 9, 9, 9, 9, 9, 9};
  EXPECT_EQ(error_of([&] { parse_model_binary(junk, sizeof junk); }),
            "[model spec] binary model spec failed FlatBuffers verification");
  EXPECT_EQ(error_of([&] { parse_model_binary(junk, 4); }),
            "[model spec] not a tandem model spec (missing file identifier 'TDMS')");
}

// Found by tests/fuzz (model_spec; the input is tests/fuzz/regressions/model_spec/): an input
// shape of ~2^60 elements per sample overflowed int64 in Shape::numel (a flatten node's shape
// inference); a node's output could overflow too. Both are refused, naming the input or node.
TEST(Spec, ShapesTooLargeToComputeAreRefused) {
  EXPECT_EQ(error_of([] {
              graph_of(R"({ name: "t", inputs: [ { name: "x", shape: [926927447620845575, 12] } ],
                            nodes: [ { name: "f", op: "flatten", inputs: ["x"] } ] })");
            }),
            "[model spec] input 'x': field 'shape' has more than 2147483648 elements per sample");
  EXPECT_EQ(error_of([] {
              graph_of(with_nodes(R"({ name: "c", op: "conv2d", inputs: ["x"], conv2d: { out_channels: 2147483647, kernel: [1] } },
                                     { name: "f", op: "flatten", inputs: ["c"] })"));
            }),
            "[graph] node 'c' (conv2d): its output per sample [8, 8, 2147483647] has more than 2147483648 elements");
  // At the limit is fine.
  EXPECT_EQ(error_of([] { graph_of(R"({ name: "t", inputs: [ { name: "x", shape: [2147483648] } ],
                                         nodes: [ { name: "r", op: "relu", inputs: ["x"] } ] })"); }),
            "");
}

TEST(Split, SampleAtPool2) {
  Graph g = Graph::build(load_model_spec(sample_path()));
  auto [front, back] = g.split("pool2");
  ASSERT_EQ(front.nodes().size(), 6u);
  ASSERT_EQ(back.nodes().size(), 4u);
  EXPECT_EQ(front.nodes()[front.output()].spec.name, "pool2");
  ASSERT_EQ(back.inputs().size(), 1u);
  EXPECT_EQ(back.inputs()[0].name, "pool2");
  EXPECT_EQ(back.inputs()[0].shape, (Shape{7, 7, 64}));
  EXPECT_EQ(back.nodes()[back.output()].spec.name, "fc2");
  EXPECT_EQ(front.param_names().size() + back.param_names().size(), g.param_names().size());
}

TEST(Split, CutCrossedByTwoTensorsIsRefused) {
  // Two branches from 'x': a cut on one of them leaves the other reading 'x' across the cut.
  const std::string json = R"({ name: "t", inputs: [ { name: "x", shape: [4] } ], nodes: [
      { name: "a", op: "relu", inputs: ["x"] },
      { name: "b", op: "linear", inputs: ["a"], linear: { out_features: 2 } },
      { name: "c", op: "linear", inputs: ["x"], linear: { out_features: 2 } },
      { name: "d", op: "relu", inputs: ["c"] } ], output: "b" })";
  Graph g = graph_of(json);
  // Cutting at 'c' leaves 'a' reading the graph input and 'd' reading the cut.
  const std::string msg = error_of([&] { g.split("c"); });
  EXPECT_EQ(msg.rfind("[split] cut at 'c' is crossed by 2 tensors: 'c' (read by 'd'), 'x' (read by 'a')", 0), 0u) << msg;
}

TEST(Split, CutAtOutputOrUnknownIsRefused) {
  Graph g = Graph::build(load_model_spec(sample_path()));
  EXPECT_EQ(error_of([&] { g.split("fc2"); }),
            "[split] cut node 'fc2' is the output: nothing would be left for the back shard");
  EXPECT_EQ(error_of([&] { g.split("nope"); }), "[split] cut node 'nope' is not in the graph");
}

}  // namespace
}  // namespace tandem::test
