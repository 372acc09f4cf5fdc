#!/usr/bin/env bash
# Runs a cross-built GoogleTest binary under qemu-aarch64-static, its libraries from the sysroot.
# Usage: gtest.sh ARM64_BUILD SYSROOT BINARY GTEST_ARGS...   (BINARY: a name in ARM64_BUILD/tests)
set -euo pipefail
build=$1 sysroot=$2 bin=tests/$3
shift 3
source "$(dirname "$0")/lib.sh"
arm64_require --qemu "$build" "$sysroot" "$bin"
export QEMU_LD_PREFIX=$sysroot
exec qemu-aarch64-static "$build/$bin" "$@"
