#!/usr/bin/env bash
# Sets up, builds and runs tandem's whole test suite (ctest), in the release build (with the
# WebAssembly build and the arm64 cross build beside it, the latter run under qemu), for the
# engine's own code paths under AddressSanitizer and UndefinedBehaviorSanitizer, and last the
# libFuzzer harnesses (clang 14), each fuzzed for a minute from its seeds (tests/fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh release
bash wasm/build.sh  # the browser edge and the wasm kernels, for the wasm and browser tests
bash scripts/build-arm64.sh  # the arm64 edge, cross-built; the release suite runs it under qemu
ctest --preset release
bash scripts/setup.sh debug-asan
ctest --preset debug-asan
bash scripts/setup.sh fuzz
ctest --preset fuzz
