// Fuzzes the model spec readers: the binary form (parse_model_binary, when the input carries
// the "TDMS" identifier) or the JSON text form (parse_model_json), then Graph::build and split.
#include <flatbuffers/flatbuffers.h>

#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/wire/messages.h"
#include "schema/model_generated.h"

using namespace tandem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  try {
    // As load_model_spec tells the two forms apart.
    const bool binary = size >= 8 && flatbuffers::BufferHasIdentifier(data, spec::ModelIdentifier());
    const ModelSpec spec = binary ? parse_model_binary(data, size)
                                  : parse_model_json(std::string_view(reinterpret_cast<const char*>(data), size));
    const Graph graph = Graph::build(spec);
    (void)model_hash(spec, spec.cut);
    if (!graph.default_cut().empty()) {
      const auto shards = graph.split(graph.default_cut());
      (void)shards;
    }
  } catch (const Error&) {
    // What bad specs get: an Error naming node and field.
  }
  return 0;
}
