#!/usr/bin/env bash
# Sets up, builds and runs tandem's whole test suite (ctest), in the release build (with the
# arm64 edge cross-built, run under qemu) and, for the engine's own code paths, under
# AddressSanitizer and UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh release
bash scripts/build-arm64.sh  # the arm64 edge, cross-built; the release suite runs it under qemu
ctest --preset release
bash scripts/setup.sh debug-asan
ctest --preset debug-asan
