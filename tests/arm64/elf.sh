#!/usr/bin/env bash
# The cross-built tandem-edge and test binaries are aarch64 ELF executables, by file(1).
# Usage: elf.sh ARM64_BUILD SYSROOT
set -euo pipefail
build=$1 sysroot=$2
source "$(dirname "$0")/lib.sh"
bins=(edge/tandem-edge tests/tandem_op_tests tests/tandem_grad_tests)
arm64_require "$build" "$sysroot" "${bins[@]}"
command -v file > /dev/null || { echo "FAIL: file(1) is not installed: bash scripts/setup.sh installs it"; exit 1; }
for bin in "${bins[@]}"; do
  what=$(file -b "$build/$bin")
  [[ $what == "ELF 64-bit LSB "*", ARM aarch64,"* ]] || { echo "FAIL: $build/$bin is not an aarch64 ELF: $what"; exit 1; }
  echo "$bin: $what"
done
echo "PASS: ${#bins[@]} aarch64 ELF executables"
