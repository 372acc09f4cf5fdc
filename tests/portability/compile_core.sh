#!/usr/bin/env bash
# Compiles core and the portable backends (core/, backends/{reference,portable,simd}; not the native-only JSON
# spec reader and ONNX import, core/CMakeLists.txt's tandem_spec_json) with another compiler, to keep core
# portable to arm64 and WebAssembly.
# Usage: compile_core.sh COMPILER SOURCE_DIR GENERATED_INCLUDE_DIR OUT_DIR
# Exits 77 (ctest: skipped) when the compiler is not installed, saying so; with CI=true it fails.
set -euo pipefail
cxx=$1 src=$2 gen=$3 out=$4
source "$src/tests/lib/skip.sh"
command -v "$cxx" >/dev/null 2>&1 || skip_or_fail "$cxx is not installed (bash scripts/setup.sh installs it)"
export NODE_PATH=/usr/share/nodejs  # Debian's emscripten needs it for acorn
mkdir -p "$out/include"
# FlatBuffers' headers through a folder of their own: -I/usr/include would break em++.
ln -sfn /usr/include/flatbuffers "$out/include/flatbuffers"
count=0
while IFS= read -r file; do
  "$cxx" -std=c++20 -O2 -Wall -Wextra -Werror -DFLATBUFFERS_MAX_ALIGNMENT=64 -I"$src" -isystem "$gen" -isystem "$out/include" \
    -c "$file" -o "$out/$(basename "$file" .cpp).o"
  count=$((count + 1))
done < <(find "$src/core" "$src/backends/reference" "$src/backends/portable" "$src/backends/simd" -name '*.cpp' ! -name 'model_spec_json.cpp' ! -name 'onnx_*.cpp' | sort)
echo "compiled $count core sources with $("$cxx" --version | head -n 1)"
