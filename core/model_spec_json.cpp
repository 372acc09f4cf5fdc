// JSON text form of the model spec, read with FlatBuffers' own parser against the schema
// compiled into the binary. Native only: wasm gets the binary form (see DESIGN.md).
#include <flatbuffers/idl.h>

#include <fstream>
#include <filesystem>
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
