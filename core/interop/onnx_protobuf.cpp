#include "core/interop/onnx_protobuf.h"

#include <cstring>
#include <set>

#include "core/error.h"

namespace tandem {
namespace {

constexpr const char* kWhere = "onnx";
constexpr int64_t kMaxValues = int64_t{1} << 32;  // values in one tensor: 16 GiB of floats

// ONNX's TensorProto.DataType numbers import reads.
enum : int64_t { kFloat = 1, kUint8 = 2, kInt8 = 3, kInt32 = 6, kInt64 = 7, kBool = 9, kDouble = 11 };
// Protobuf wire types.
enum : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

// One protobuf message's bytes: fields read in order, each checked against the end.
class Message {
 public:
  Message(std::span<const uint8_t> bytes, const std::string* origin) : p_(bytes.data()), end_(bytes.data() + bytes.size()), origin_(origin) {}

  bool next() {
    if (p_ >= end_) return false;
    const uint64_t tag = varint();
    field_ = static_cast<uint32_t>(tag >> 3);
    wire_ = static_cast<uint32_t>(tag & 7);
    if (field_ == 0) bad("field number 0");
    return true;
  }
  uint32_t field() const { return field_; }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) bad("a number runs past the end");
      const uint8_t b = *p_++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    bad("a number longer than 10 bytes");
  }
  int64_t integer() {
    expect(kVarint, "a number");
    return static_cast<int64_t>(varint());
  }
  std::span<const uint8_t> bytes() {
    expect(kBytes, "bytes");
    const uint64_t n = varint();
    if (n > static_cast<uint64_t>(end_ - p_)) bad("a length runs past the end");
    std::span<const uint8_t> out(p_, static_cast<std::size_t>(n));
    p_ += n;
    return out;
  }
  std::string text() {
    const auto b = bytes();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  Message message() { return Message(bytes(), origin_); }
  float f32() {
    expect(kFixed32, "a float");
    return fixed<float>();
  }
  // A repeated number: one value (unpacked) or a packed run of them.
  template <typename T>
  void numbers(std::vector<T>& out) {
    if (wire_ == kBytes) {
      Message packed(bytes(), origin_);
      while (packed.p_ < packed.end_) {
        if (out.size() >= static_cast<std::size_t>(kMaxValues)) bad("too many values");
        out.push_back(packed.scalar<T>());
      }
    } else {
      out.push_back(scalar<T>());
    }
  }
  void skip() {
    switch (wire_) {
      case kVarint: varint(); break;
      case kFixed64: advance(8); break;
      case kFixed32: advance(4); break;
      case kBytes: bytes(); break;
      default: bad(cat("wire type ", wire_, " (groups are not read)"));
    }
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail(kWhere, cat(*origin_, ": not a readable ONNX model (", what, ")"));
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const std::string* origin_;
  uint32_t field_ = 0, wire_ = 0;

  void expect(uint32_t wire, const char* what) {
    if (wire_ != wire) bad(cat("field ", field_, " should hold ", what, ", wire type ", wire_));
  }
  void advance(std::size_t n) {
    if (n > static_cast<std::size_t>(end_ - p_)) bad("a value runs past the end");
    p_ += n;
  }
  template <typename T>
  T fixed() {
    advance(sizeof(T));
    T v;
    std::memcpy(&v, p_ - sizeof(T), sizeof(T));
    return v;
  }
  // In a packed run the wire type is the element's: varint for integers, fixed for float/double.
  template <typename T>
  T scalar() {
    if constexpr (std::is_same_v<T, float>) return fixed<float>();
    else if constexpr (std::is_same_v<T, double>) return fixed<double>();
    else return static_cast<T>(varint());
  }
};

template <typename T>
std::vector<T> raw_values(std::span<const uint8_t> raw, int64_t count, const Message& m, const std::string& label) {
  if (raw.size() != static_cast<std::size_t>(count) * sizeof(T))
    m.bad(cat(label, ": raw_data holds ", raw.size(), " bytes for ", count, " values of ", sizeof(T), " bytes"));
  std::vector<T> out(static_cast<std::size_t>(count));
  if (count) std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

OnnxTensor read_tensor(Message m, const std::string& where) {
  OnnxTensor t;
  int64_t type = 0, location = 0;
  std::span<const uint8_t> raw;
  bool has_raw = false;
  std::vector<float> floats;
  std::vector<double> doubles;
  std::vector<int64_t> int64s, int32s;
  while (m.next()) {
    switch (m.field()) {
      case 1: m.numbers(t.dims); break;
      case 2: type = m.integer(); break;
      case 4: m.numbers(floats); break;
      case 5: m.numbers(int32s); break;
      case 7: m.numbers(int64s); break;
      case 8: t.name = m.text(); break;
      case 9: raw = m.bytes(); has_raw = true; break;
      case 10: m.numbers(doubles); break;
      case 14: location = m.integer(); break;
      default: m.skip();
    }
  }
  const std::string label = cat(where, " '", t.name, "'");
  if (location == 1)
    m.bad(cat(label, " keeps its values in an external file; export the model with its weights inside (torch.onnx.export "
                     "does for models under 2 GB)"));
  int64_t count = 1;
  for (int64_t d : t.dims) {
    if (d < 0 || d > kMaxValues) m.bad(cat(label, ": dimension ", d, " out of range"));
    if (d != 0 && count > kMaxValues / d) m.bad(cat(label, ": more than 2^32 values"));
    count *= d;
    if (count > kMaxValues) m.bad(cat(label, ": more than 2^32 values"));
  }
  auto check = [&](std::size_t have) {
    if (static_cast<int64_t>(have) != count) m.bad(cat(label, ": ", have, " values for dimensions holding ", count));
  };
  switch (type) {
    case kFloat:
      t.floats = has_raw ? raw_values<float>(raw, count, m, label) : std::move(floats);
      check(t.floats.size());
      break;
    case kDouble: {
      const std::vector<double> d = has_raw ? raw_values<double>(raw, count, m, label) : std::move(doubles);
      check(d.size());
      t.floats.assign(d.begin(), d.end());
      break;
    }
    case kInt64:
      t.integer = true;
      t.ints = has_raw ? raw_values<int64_t>(raw, count, m, label) : std::move(int64s);
      check(t.ints.size());
      break;
    case kInt32: case kInt8: case kUint8: case kBool:
      t.integer = true;
      if (!has_raw) t.ints = std::move(int32s);
      else if (type == kInt32) for (int32_t v : raw_values<int32_t>(raw, count, m, label)) t.ints.push_back(v);
      else if (type == kInt8) for (int8_t v : raw_values<int8_t>(raw, count, m, label)) t.ints.push_back(v);
      else for (uint8_t v : raw_values<uint8_t>(raw, count, m, label)) t.ints.push_back(v);
      check(t.ints.size());
      break;
    default:
      m.bad(cat(label, ": tensor data type ", type, " is not read (float, double, int64, int32, int8, uint8 and bool are)"));
  }
  return t;
}

OnnxAttribute read_attribute(Message m, const std::string& where) {
  OnnxAttribute a;
  using K = OnnxAttribute::Kind;
  int64_t type = 0;
  while (m.next()) {
    switch (m.field()) {
      case 1: a.name = m.text(); break;
      case 2: a.f = m.f32(); break;
      case 3: a.i = m.integer(); break;
      case 4: a.s = m.text(); break;
      case 5: a.t = read_tensor(m.message(), cat(where, " attribute")); break;
      case 7: m.numbers(a.floats); break;
      case 8: m.numbers(a.ints); break;
      case 20: type = m.integer(); break;
      default: m.skip();  // graphs, strings, sparse tensors, type protos: import reads none
    }
  }
  // AttributeProto.AttributeType: 1 FLOAT, 2 INT, 3 STRING, 4 TENSOR, 6 FLOATS, 7 INTS.
  switch (type) {
    case 1: a.kind = K::Float; break;
    case 2: a.kind = K::Int; break;
    case 3: a.kind = K::String; break;
    case 4: a.kind = K::Tensor; break;
    case 6: a.kind = K::Floats; break;
    case 7: a.kind = K::Ints; break;
    default: a.kind = K::Other;
  }
  return a;
}

OnnxValue read_value(Message m) {
  OnnxValue v;
  while (m.next()) {
    if (m.field() == 1) v.name = m.text();
    else if (m.field() == 2) {
      Message type = m.message();
      while (type.next()) {
        if (type.field() != 1) {  // TypeProto.tensor_type; sequences and maps are not inputs import reads
          type.skip();
          continue;
        }
        Message tensor = type.message();
        while (tensor.next()) {
          if (tensor.field() == 1) v.elem_type = static_cast<int32_t>(tensor.integer());
          else if (tensor.field() == 2) {
            Message shape = tensor.message();
            while (shape.next()) {
              if (shape.field() != 1) {
                shape.skip();
                continue;
              }
              Message dim = shape.message();
              int64_t value = -1;
              std::string param = "?";
              while (dim.next()) {
                if (dim.field() == 1) value = dim.integer(), param.clear();
                else if (dim.field() == 2) param = dim.text();
                else dim.skip();
              }
              v.dims.push_back(value);
              v.dim_names.push_back(value >= 0 ? "" : param);
            }
          } else tensor.skip();
        }
      }
    } else m.skip();
  }
  return v;
}

OnnxNode read_node(Message m, const std::string& origin) {
  OnnxNode n;
  std::vector<Message> attributes;
  while (m.next()) {
    switch (m.field()) {
      case 1: n.inputs.push_back(m.text()); break;
      case 2: n.outputs.push_back(m.text()); break;
      case 3: n.name = m.text(); break;
      case 4: n.op_type = m.text(); break;
      case 5: attributes.push_back(m.message()); break;
      case 7: n.domain = m.text(); break;
      default: m.skip();
    }
  }
  for (Message& a : attributes) n.attributes.push_back(read_attribute(a, cat(origin, ": node '", n.name, "' (", n.op_type, ")")));
  return n;
}

}  // namespace

OnnxGraph parse_onnx(std::span<const uint8_t> bytes, const std::string& origin) {
  Message model(bytes, &origin);
  OnnxGraph g;
  std::string producer, version;
  bool has_graph = false;
  std::vector<OnnxValue> inputs;
  while (model.next()) {
    switch (model.field()) {
      case 2: producer = model.text(); break;
      case 3: version = model.text(); break;
      case 8: {
        Message opset = model.message();
        std::string domain;
        int64_t v = 0;
        while (opset.next()) {
          if (opset.field() == 1) domain = opset.text();
          else if (opset.field() == 2) v = opset.integer();
          else opset.skip();
        }
        if (domain.empty() || domain == "ai.onnx") g.opset = v;
        break;
      }
      case 7: {
        has_graph = true;
        Message graph = model.message();
        while (graph.next()) {
          switch (graph.field()) {
            case 1: g.nodes.push_back(read_node(graph.message(), origin)); break;
            case 5: g.initializers.push_back(read_tensor(graph.message(), cat(origin, ": initializer"))); break;
            case 11: inputs.push_back(read_value(graph.message())); break;
            case 12: g.outputs.push_back(read_value(graph.message())); break;
            default: graph.skip();
          }
        }
        break;
      }
      default: model.skip();
    }
  }
  if (!has_graph) model.bad("no graph: the file is not an ONNX model");
  g.producer = version.empty() ? producer : cat(producer, " ", version);
  std::set<std::string> weights;  // graph inputs that are weights (older exporters list them) are not data
  for (const OnnxTensor& t : g.initializers) weights.insert(t.name);
  for (OnnxValue& v : inputs)
    if (!weights.count(v.name)) g.inputs.push_back(std::move(v));
  return g;
}

}  // namespace tandem
