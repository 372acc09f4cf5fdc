// JSON text form of the model spec, read with FlatBuffers' own parser against the schema
// compiled into the binary. Native only: wasm gets the binary form (see DESIGN.md).
#include <flatbuffers/idl.h>

#include <fstream>
#include <iterator>

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
  if (!parser.Parse(text.c_str()))
    fail("model spec", cat(origin, ": ", parser.error_));
  return parse_model_binary(parser.builder_.GetBufferPointer(), parser.builder_.GetSize());
}

ModelSpec load_model_spec(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("model spec", cat("cannot open '", path, "'"));
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (bytes.size() >= 8 && flatbuffers::BufferHasIdentifier(data, spec::ModelIdentifier()))
    return parse_model_binary(data, bytes.size());
  return parse_model_json(bytes, path);
}

}  // namespace tandem
