#!/usr/bin/env bash
# Sets up, builds and runs tandem's whole test suite (ctest), in the release build and, for
# the engine's own code paths, under AddressSanitizer and UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh release
ctest --preset release
bash scripts/setup.sh debug-asan
ctest --preset debug-asan
