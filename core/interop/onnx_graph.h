// An ONNX model as plain values: what ports/onnx reads from the protobuf file and what
// onnx_import.h turns into a tandem spec. Only what import needs: nodes in graph order,
// initializers (weights) and constants as f32 or i64 values, the graph's inputs and outputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct OnnxTensor {
  std::string name;
  std::vector<int64_t> dims;
  bool integer = false;       // int64/int32/bool values, in `ints`; otherwise f32 in `floats`
  std::vector<float> floats;  // row-major, as ONNX (and PyTorch) lay them out
  std::vector<int64_t> ints;
  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
};

struct OnnxAttribute {
  std::string name;
  enum class Kind { Int, Float, String, Ints, Floats, Tensor, Other } kind = Kind::Other;
  int64_t i = 0;
  float f = 0.0f;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  OnnxTensor t;
};

struct OnnxNode {
  std::string name;     // torch's scope path, e.g. "/layer1/layer1.0/conv1/Conv"
  std::string op_type;  // "Conv", "BatchNormalization", ...
  std::string domain;   // "" (ai.onnx) for every op tandem imports
  std::vector<std::string> inputs;   // value names; "" for an omitted optional input
  std::vector<std::string> outputs;
  std::vector<OnnxAttribute> attributes;
  const OnnxAttribute* attribute(const std::string& key) const {
    for (const OnnxAttribute& a : attributes)
      if (a.name == key) return &a;
    return nullptr;
  }
};

// A graph input or output: its element type (ONNX's TensorProto.DataType numbers: 1 float,
// 6 int32, 7 int64, 9 bool) and dimensions, a symbolic one (a named batch) as -1 with its name.
struct OnnxValue {
  std::string name;
  int32_t elem_type = 0;
  std::vector<int64_t> dims;
  std::vector<std::string> dim_names;  // per dimension; "" where the dimension is a number
};

struct OnnxGraph {
  std::string producer;  // "pytorch" and its version, from the file
  int64_t opset = 0;     // the default domain's opset version
  std::vector<OnnxNode> nodes;
  std::vector<OnnxTensor> initializers;
  std::vector<OnnxValue> inputs;  // graph inputs that are not initializers
  std::vector<OnnxValue> outputs;
};

}  // namespace tandem
