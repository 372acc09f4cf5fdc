// Reads chosen tensors of a safetensors file from disk without loading the rest: an edge
// starting from a full model's weights (--init-from) holds only its own shard's tensors.
#pragma once

#include <string>
#include <vector>

#include "core/interop/safetensors.h"

namespace tandem {

// The tensors whose names are in `names` (all of them when `names` is empty); a name the file
// lacks is simply absent from the result. Throws Error for an unreadable or malformed file.
std::vector<SafeTensor> read_safetensors_file(const std::string& path, const std::vector<std::string>& names);

}  // namespace tandem
