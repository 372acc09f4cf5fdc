// JSON text form of the model spec, read with FlatBuffers' own parser against the schema
// compiled into the binary. Native only: wasm gets the binary form (see DESIGN.md).
#include <flatbuffers/idl.h>

#include <fstream>
#include <filesystem>
#include <iterator>
#include <cstdio>

#include "core/error.h"
#include "core/model_spec.h"
#include "schema/model_fbs_text.h"
#include "schema/model_generated.h"

namespace tandem {

ModelSpec parse_model_json(std::string_view json, std::string_view origin) {
  flatbuffers::IDLOptions options;
  options.strict_json = false;
  flatbuffers::Parser parser(options);
  if (!parser.Parse(kModelFbsText)) fail("model spec", cat("internal: schema did not parse: ", parser.error_));
  const std::string text(json);
  if (!parser.Parse(text.c_str())) {
    // FlatBuffers says "LINE: COLUMN: error: WHAT"; say it as a newcomer reads it.
    std::string where, what = parser.error_;
    if (const auto e = what.find(": error: "); e != std::string::npos) {
      where = what.substr(0, e);
      what = what.substr(e + 9);
      if (const auto colon = where.find(": "); colon != std::string::npos)
        where = cat("line ", where.substr(0, colon), ", column ", where.substr(colon + 2));
    }
    fail("model spec", cat(origin, " does not parse", where.empty() ? "" : cat(" at ", where), ": ", what,
                           ". A spec is JSON in the form of schema/model.fbs; samples/*/model.json are examples"));
  }
  return parse_model_binary(parser.builder_.GetBufferPointer(), parser.builder_.GetSize());
}

ModelSpec load_model_spec(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    fail("model spec", cat("cannot open '", path, "': ", std::filesystem::exists(path) ? "not readable" : "no such file",
                           " (a model spec is a JSON file such as samples/fashion-mnist/model.json)"));
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (bytes.size() >= 8 && flatbuffers::BufferHasIdentifier(data, spec::ModelIdentifier()))
    return parse_model_binary(data, bytes.size());
  return parse_model_json(bytes, path);
}

}  // namespace tandem

namespace tandem {
namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += cat('\\', c);
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += c;
  }
  return out + "\"";
}

std::string number(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

template <typename List>
std::string list(const List& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += cat(i ? ", " : "", values[i]);
  return out + "]";
}

std::string pair(const Pair& p) { return p[0] == p[1] ? cat("[", p[0], "]") : cat("[", p[0], ", ", p[1], "]"); }

std::string node_json(const NodeSpec& n) {
  std::vector<std::string> names;
  for (const std::string& in : n.inputs) names.push_back(json_string(in));
  std::string out = cat("{ name: ", json_string(n.name), ", op: ", json_string(n.op), ", inputs: ", list(names));
  const Conv2dAttrs& c = n.conv2d;
  if (c.out_channels != 0)
    out += cat(", conv2d: { out_channels: ", c.out_channels, ", kernel: ", pair(c.kernel), ", stride: ", pair(c.stride),
               ", padding: ", pair(c.padding), ", dilation: ", pair(c.dilation), ", bias: ", c.bias ? "true" : "false",
               ", groups: ", c.groups, " }");
  if (n.linear.out_features != 0)
    out += cat(", linear: { out_features: ", n.linear.out_features, ", bias: ", n.linear.bias ? "true" : "false", " }");
  if (n.pool.kernel != Pair{0, 0})
    out += cat(", pool: { kernel: ", pair(n.pool.kernel), ", stride: ", pair(n.pool.stride), ", padding: ", pair(n.pool.padding), " }");
  if (n.heads.count != 0)
    out += cat(", heads: { count: ", n.heads.count, ", hidden: ", n.heads.hidden, ", out_features: ", n.heads.out_features, " }");
  if (n.batch_norm.eps != BatchNormAttrs{}.eps || n.batch_norm.momentum != BatchNormAttrs{}.momentum)
    out += cat(", batch_norm: { eps: ", number(n.batch_norm.eps), ", momentum: ", number(n.batch_norm.momentum), " }");
  if (n.dropout.p != DropoutAttrs{}.p) out += cat(", dropout: { p: ", number(n.dropout.p), " }");
  if (n.layer_norm.eps != LayerNormAttrs{}.eps) out += cat(", layer_norm: { eps: ", number(n.layer_norm.eps), " }");
  if (n.attention.heads != 0)
    out += cat(", attention: { heads: ", n.attention.heads, n.attention.causal ? ", causal: true" : "", " }");
  if (n.embedding.count != 0)
    out += cat(", embedding: { count: ", n.embedding.count, n.embedding.features ? cat(", features: ", n.embedding.features) : "",
               n.embedding.types ? cat(", types: ", n.embedding.types) : "", " }");
  if (n.token_pool.mean) out += ", token_pool: { mode: \"mean\" }";
  if (n.freeze) out += ", freeze: true";
  if (n.lora.rank != 0)
    out += cat(", lora: { rank: ", n.lora.rank, ", alpha: ", number(n.lora.alpha), ", dropout: ", number(n.lora.dropout), " }");
  if (n.op == "slice") out += cat(", slice: { axis: ", n.slice.axis, ", start: ", n.slice.start, ", end: ", n.slice.end, " }");
  auto list = [](const auto& v) {
    std::string s;
    for (std::size_t k = 0; k < v.size(); ++k) s += cat(k ? ", " : "", v[k]);
    return s;
  };
  if (n.op == "reshape") out += cat(", reshape: { shape: [", list(n.reshape), "] }");
  if (n.op == "transpose") out += cat(", transpose: { perm: [", list(n.perm), "] }");
  if (n.op == "reduce")
    out += cat(", reduce: { mode: \"", reduce_mode_name(n.reduce.mode), "\", axes: [", list(n.reduce.axes), "] }");
  if (n.op == "binary") {
    out += cat(", binary: { mode: \"", binary_mode_name(n.binary.mode), "\"");
    if (n.binary.has_scalar) out += cat(", scalar: ", number(n.binary.scalar));
    if (!n.binary.operand.empty()) out += cat(", operand: [", list(n.binary.operand), "]");
    if (n.binary.image_operand) out += ", image_operand: true";
    if (n.binary.scalar_first) out += ", scalar_first: true";
    out += " }";
  }
  if (n.op == "expand") out += cat(", expand: { shape: [", list(n.expand), "] }");
  if (n.op == "where" && (n.where.a || n.where.b)) {
    std::string given;
    if (n.where.a) given += cat("a: ", number(*n.where.a));
    if (n.where.b) given += cat(given.empty() ? "" : ", ", "b: ", number(*n.where.b));
    out += cat(", where: { ", given, " }");
  }
  if (!n.torch_names.empty()) {
    out += ", torch_names: [";
    for (std::size_t k = 0; k < n.torch_names.size(); ++k)
      out += cat(k ? ", " : "", "{ field: ", json_string(n.torch_names[k].first), ", name: ", json_string(n.torch_names[k].second), " }");
    out += "]";
  }
  return out + " }";
}

}  // namespace

std::string model_spec_json(const ModelSpec& spec) {
  std::string out = cat("{\n  name: ", json_string(spec.name), ",\n  inputs: [\n");
  for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
    const InputSpec& in = spec.inputs[i];
    std::vector<int64_t> shape;
    for (int d = 0; d < in.shape.rank(); ++d) shape.push_back(in.shape[d]);
    out += cat("    { name: ", json_string(in.name), ", shape: ", list(shape), in.integer ? ", dtype: \"int32\"" : "",
               in.mask ? ", mask: true" : "",
               in.marks_padding ? ", marks_padding: true" : "", in.length_buckets.empty() ? "" : cat(", length_buckets: ", list(in.length_buckets)),
               " }", i + 1 < spec.inputs.size() ? "," : "", "\n");
  }
  out += "  ],\n  nodes: [\n";
  for (std::size_t i = 0; i < spec.nodes.size(); ++i)
    out += cat("    ", node_json(spec.nodes[i]), i + 1 < spec.nodes.size() ? "," : "", "\n");
  out += "  ]";
  if (!spec.output.empty()) out += cat(",\n  output: ", json_string(spec.output));
  if (spec.loss != ModelSpec{}.loss) out += cat(",\n  loss: ", json_string(spec.loss));
  if (!spec.cut.empty()) out += cat(",\n  cut: ", json_string(spec.cut));
  return out + "\n}\n";
}

}  // namespace tandem
