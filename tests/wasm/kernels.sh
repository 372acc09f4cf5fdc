#!/usr/bin/env bash
# The portable kernels built with em++ -msimd128 and run under node, against the same code
# built natively, and against the native reference backend: every op of six models' forward,
# loss and backward (tests/wasm/kernel_check.cpp).
# Usage: kernels.sh NATIVE_BUILD_DIR SOURCE_DIR WASM_BUILD_DIR
set -euo pipefail
build=$1 src=$2 wasm=$3
source "$src/tests/wasm/require_wasm_build.sh"
require_wasm_build
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
specs=()
for m in samples/fashion-mnist/model.json tests/interop/residual_bn.json samples/models/mobilenetv2-28.json \
         samples/models/vgg5-28.json samples/forms-layoutlm/model.json samples/fashion-vit/model.json; do
  "$build/tools/tandem" pack-spec --model "$src/$m" --out "$work/$(basename "$m" .json).tdms" >/dev/null
  specs+=("$work/$(basename "$m" .json).tdms")
done
node "$wasm/tandem_kernel_check.js" --write "$work/wasm.bin" "${specs[@]}"
"$build/tests/tandem_kernel_check" --compare "$work/wasm.bin" "${specs[@]}"
"$build/tests/tandem_kernel_check" --compare "$work/wasm.bin" --against reference "${specs[@]}"
