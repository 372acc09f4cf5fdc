#!/usr/bin/env bash
# The portable GEMM (backends/simd/gemm.h) in WebAssembly (em++ -msimd128, under node) against
# the same code built natively with the default flags (x86-64 baseline: 128-bit SSE2, as wasm
# SIMD is 128-bit), alternating 3 runs each; prints the medians' ratio. Bar: >= 0.40.
# Usage: bash bench/wasm_gemm.sh [NATIVE_BUILD_DIR] [WASM_BUILD_DIR] [BAR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release} wasm=${2:-$root/build/wasm} bar=${3:-0.40}
all() { "$@" | grep '"shape":"all"' | sed 's/.*"gflops":\([0-9.]*\).*/\1/'; }
native=() web=()
for _ in 1 2 3; do
  native+=("$(all "$build/bench/bench_portable_gemm")")
  web+=("$(all node "$wasm/tandem_gemm_bench.js")")
done
median() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
n=$(median "${native[@]}") w=$(median "${web[@]}")
ratio=$(awk -v w="$w" -v n="$n" 'BEGIN { printf "%.3f", w / n }')
echo "portable GEMM, median GFLOP/s over the benchmark's shapes: native ${native[*]} -> $n; wasm (node) ${web[*]} -> $w"
echo "{\"bench\":\"wasm_gemm\",\"native_gflops\":$n,\"wasm_gflops\":$w,\"ratio\":$ratio,\"bar\":$bar}"
awk -v r="$ratio" -v b="$bar" 'BEGIN { exit !(r >= b) }' || { echo "FAIL: wasm reaches $ratio of native, under the bar of $bar"; exit 1; }
