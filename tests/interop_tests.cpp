// safetensors reading and writing (every malformed header refused with its reason) and
// PyTorch layouts: OIHW convolutions and (c, h, w) flatten order, checked element by element.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "core/error.h"
#include "core/graph.h"
#include "core/interop/safetensors.h"
#include "core/interop/torch_layout.h"
#include "tests/test_support.h"

namespace tandem {
namespace {

std::vector<uint8_t> file_with_header(const std::string& header, std::size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<uint8_t>(header.size() >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const int64_t b = 42;
  const auto file = write_safetensors({f32_tensor("x.weight", {2, 3}, a), i64_tensor("bn.num_batches_tracked", {}, &b)},
                                      {{"format", "pt"}});
  EXPECT_EQ((file.size() - 8 - 24 - 8) % 8, 0u);  // data starts 8-byte aligned
  std::map<std::string, std::string> meta;
  const auto back = read_safetensors(file, &meta);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(meta["format"], "pt");
  EXPECT_EQ(back[0].name, "x.weight");
  EXPECT_EQ(back[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(back[0].data.data(), a, sizeof a), 0);
  EXPECT_EQ(back[1].dtype, "I64");
  EXPECT_TRUE(back[1].shape.empty());
}

TEST(Safetensors, MalformedFilesAreRefusedWithTheReason) {
  const std::vector<uint8_t> short_file = {1, 2, 3};
  EXPECT_NE(test::error_of([&] { read_safetensors(short_file); }).find("shorter than its 8-byte header"), std::string::npos);
  auto past = file_with_header("{}", 0);
  past[0] = 200;
  EXPECT_NE(test::error_of([&] { read_safetensors(past); }).find("runs past the end"), std::string::npos);
  const auto range = file_with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8);
  EXPECT_NE(test::error_of([&] { read_safetensors(range); }).find("spans bytes 0..16 of 8"), std::string::npos);
  const auto count = file_with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(test::error_of([&] { read_safetensors(count); }).find("holds 8 bytes for 3 F32 values"), std::string::npos);
  const auto twice = file_with_header(
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  EXPECT_NE(test::error_of([&] { read_safetensors(twice); }).find("appears twice"), std::string::npos);
  const auto f64 = file_with_header(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(test::error_of([&] { read_safetensors(f64); }).find("dtype 'F64' is not supported"), std::string::npos);
  // Hugging Face's half-precision weights are read (hugging_face.h widens them on import).
  const auto bf16 = file_with_header(R"({"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})", 2);
  EXPECT_EQ(read_safetensors(bf16).at(0).dtype, "BF16");
  const auto garbage = file_with_header(R"({"w":[1,2})", 0);
  EXPECT_NE(test::error_of([&] { read_safetensors(garbage); }).find("malformed header"), std::string::npos);
  const auto negative = file_with_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(test::error_of([&] { read_safetensors(negative); }).find("malformed header"), std::string::npos);
}

// image [1, 2, 3] -> conv (OHWI [2, 1, 1, 3]) -> flatten (h, w, c) -> linear [1, 4] -> batch
// norm: the linear's columns and nothing else move.
Graph tiny_graph() {
  return Graph::build(parse_model_json(R"({"name": "t", "inputs": [{"name": "image", "shape": [1, 2, 3]}],
    "nodes": [
      {"name": "conv", "op": "conv2d", "inputs": ["image"], "conv2d": {"out_channels": 2, "kernel": [1]}},
      {"name": "flat", "op": "flatten", "inputs": ["conv"]},
      {"name": "bnf", "op": "batch_norm", "inputs": ["flat"]},
      {"name": "fc", "op": "linear", "inputs": ["bnf"], "linear": {"out_features": 1}}]})"));
}

TEST(TorchLayout, ConvolutionsBecomeOihwAndFlattenedColumnsChwOrder) {
  const Graph g = tiny_graph();
  Tensor conv = Tensor::empty({2, 1, 1, 3});  // [O, kh, kw, I]
  for (int i = 0; i < 6; ++i) conv[i] = static_cast<float>(i);
  const SafeTensor t = to_torch(g, "conv.weight", conv);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3, 1, 1}));
  const auto* v = reinterpret_cast<const float*>(t.data.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], static_cast<float>(i));  // 1x1 kernels: the same order

  // tandem's columns are (h, w, c) over [1, 2, 2]: column (w, c) = 2w + c; torch's are
  // (c, h, w): c * 2 + w.
  Tensor fc = Tensor::empty({1, 4});
  for (int i = 0; i < 4; ++i) fc[i] = static_cast<float>(10 + i);
  const SafeTensor f = to_torch(g, "fc.weight", fc);
  const auto* w = reinterpret_cast<const float*>(f.data.data());
  EXPECT_EQ(w[0], 10.0f);  // c0 w0 <- tandem (w0, c0)
  EXPECT_EQ(w[1], 12.0f);  // c0 w1 <- tandem (w1, c0)
  EXPECT_EQ(w[2], 11.0f);  // c1 w0 <- tandem (w0, c1)
  EXPECT_EQ(w[3], 13.0f);
  const SafeTensor bn = to_torch(g, "bnf.running_mean", fc.reshape({4}));
  EXPECT_EQ(reinterpret_cast<const float*>(bn.data.data())[1], 12.0f);  // a flattened batch norm moves too
  EXPECT_EQ(to_torch(g, "fc.bias", Tensor::zeros({1})).shape, (std::vector<int64_t>{1}));
}

TEST(TorchLayout, WholeNetworkRoundTripsAndMisfitsAreNamed) {
  const Graph g = tiny_graph();
  auto backend = test::make_test_backend("reference");
  Network a(g, *backend, 1), b(g, *backend, 2);
  const auto tensors = shard_to_torch(g, a, 7);
  shard_from_torch(g, tensors, b);
  for (Param* p : a.params())
    EXPECT_EQ(std::memcmp(p->value().data(), b.param(p->name()).value().data(), p->value().bytes()), 0) << p->name();
  bool tracked = false;
  for (const SafeTensor& t : tensors) tracked |= t.name == "bnf.num_batches_tracked";
  EXPECT_TRUE(tracked);

  auto wrong = tensors;
  for (SafeTensor& t : wrong)
    if (t.name == "fc.weight") t.shape = {4, 1};
  EXPECT_NE(test::error_of([&] { shard_from_torch(g, wrong, b); }).find("'fc.weight' is [4, 1] in the file, the model needs [1, 4]"),
            std::string::npos);
  wrong.erase(wrong.begin());
  EXPECT_NE(test::error_of([&] { shard_from_torch(g, wrong, b); }).find("no tensor 'conv.weight'"), std::string::npos);
}

}  // namespace
}  // namespace tandem
