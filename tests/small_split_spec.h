// The small split model the unit tests and the fuzz harnesses share, in a header of its own
// so that the harnesses need no GoogleTest.
#pragma once

namespace tandem::test {

// A small CNN on 8x8 quadrant images (test_support.h's quadrant_data), cut after its first block.
inline constexpr const char* kSmallSplitSpec = R"({ name: "split-test", inputs: [ { name: "image", shape: [8, 8, 1] } ], nodes: [
  { name: "conv1", op: "conv2d", inputs: ["image"], conv2d: { out_channels: 6, kernel: [3], padding: [1] } },
  { name: "relu1", op: "relu", inputs: ["conv1"] },
  { name: "pool1", op: "max_pool2d", inputs: ["relu1"], pool: { kernel: [2] } },
  { name: "flatten", op: "flatten", inputs: ["pool1"] },
  { name: "fc1", op: "linear", inputs: ["flatten"], linear: { out_features: 24 } },
  { name: "relu2", op: "relu", inputs: ["fc1"] },
  { name: "fc2", op: "linear", inputs: ["relu2"], linear: { out_features: 4 } } ], cut: "pool1" })";

}  // namespace tandem::test
