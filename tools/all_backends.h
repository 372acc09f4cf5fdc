// Registers every backend compiled into this build (reference always; xnnpack and onednn
// when their libraries were found), so tests, benchmarks and CLIs can pick them by name.
#pragma once

namespace tandem {

void register_built_backends();

}  // namespace tandem
