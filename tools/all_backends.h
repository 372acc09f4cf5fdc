// Registers every backend compiled into this build (reference always; xnnpack and onednn
// when their libraries were found), so tests, benchmarks and CLIs can pick them by name.
#pragma once

#include <string>

namespace tandem {

void register_built_backends();

// `preferred` when this build has it, else "reference".
std::string preferred_backend(const std::string& preferred);

}  // namespace tandem
