#!/usr/bin/env bash
# Cross-builds the arm64 edge: a sysroot of Debian's arm64 packages (toolchains/arm64-sysroot.sh,
# quick when up to date), then tandem-edge and the op and gradient test binaries with
# aarch64-linux-gnu-g++ (CMake preset arm64: XNNPACK, no oneDNN) into build/arm64.
# Run them with qemu-aarch64-static -L build/arm64-sysroot; the release suite does (ctest -L arm64).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v aarch64-linux-gnu-g++ > /dev/null; then
  echo "build-arm64: aarch64-linux-gnu-g++ is not installed: bash scripts/setup.sh installs it (as root)" >&2
  exit 1
fi
bash toolchains/arm64-sysroot.sh build/arm64-sysroot
cmake --preset arm64 > /dev/null
cmake --build --preset arm64
echo "arm64 edge: build/arm64/edge/tandem-edge (run: qemu-aarch64-static -L build/arm64-sysroot build/arm64/edge/tandem-edge)"
