#!/usr/bin/env bash
# Sets up, builds and runs tandem's whole test suite (ctest), in the release build (with the
# WebAssembly build beside it) and, for the engine's own code paths, under AddressSanitizer
# and UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh release
bash wasm/build.sh  # the browser edge and the wasm kernels, for the wasm and browser tests
ctest --preset release
bash scripts/setup.sh debug-asan
ctest --preset debug-asan
