#!/usr/bin/env bash
# An arm64 tandem-edge under qemu against the native x86 tandem-cloud over TLS on loopback:
# 20 steps, then the same 20 steps with the native tandem-edge. Both runs' final checkpoints,
# exported with tandem export, must hold the same weights within 1e-5 (max abs difference).
# The edges run the reference backend: 3e-7 apart here; xnnpack's arm64 and x86 kernels
# round differently (3.4e-5 apart after the same 20 steps).
# Usage: split_training.sh NATIVE_BUILD SOURCE_DIR ARM64_BUILD SYSROOT
set -euo pipefail
build=$1 src=$2 arm64_build=$3 sysroot=$4
source "$(dirname "$0")/lib.sh"
arm64_require --qemu "$arm64_build" "$sysroot" edge/tandem-edge
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
diff_bin=$build/tests/tandem_weights_diff
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; tail -20 "$work/cloud.log"; exit 1; }

"$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$model" > "$work/cloud.log" 2>&1 &
cloud_pid=$!
for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/cloud.log" | cut -d: -f3)
[[ -n $port ]] || fail "the cloud did not start"
# One identity per client: the cloud binds a client id to its certificate's name.
for client in arm64 x86; do
  "$cloud_bin" pki issue --state-dir "$work/state" --client "$client" --out "$work/id-$client" > /dev/null
done

# 20 steps of 32 samples, 4 micro-batches a step, a checkpoint at the end.
steps=20 batch=32
args=(train --cloud "wss://localhost:$port" --model "$model" --epochs 1
      --limit $((steps * batch)) --test-limit 64 --batch $batch --microbatches 4 --seed 3 --backend reference
      --checkpoint-every 0)
final=$(printf %012d $steps)
run() {  # run NAME COMMAND...: one edge, then its checkpoints exported to $work/NAME.safetensors
  local name=$1
  shift
  local start=$SECONDS
  "$@" "${args[@]}" --identity "$work/id-$name" --checkpoint-dir "$work/ckpt-$name" > "$work/$name.out" 2>&1 ||
    fail "the $name edge: $(tail -5 "$work/$name.out")"
  grep -q "front on reference" "$work/$name.out" || fail "the $name edge did not train on the reference backend"
  "$tandem_bin" export --model "$model" --edge-ckpt "$work/ckpt-$name/edge-$final.tdmc" --identity "$work/id-$name" \
    --cloud-ckpt "$work/state/checkpoints/$name/cloud-$final.tdmc" --out "$work/$name.safetensors" > /dev/null ||
    fail "export of the $name run's step $steps"
  echo "$name edge: $steps steps in $((SECONDS - start)) s, $(grep -o '"train_loss":[0-9.]*' "$work/$name.out")"
}
run arm64 env QEMU_LD_PREFIX="$sysroot" qemu-aarch64-static "$arm64_build/edge/tandem-edge"
run x86 "$edge_bin"

"$diff_bin" "$work/x86.safetensors" "$work/arm64.safetensors" 1e-5 ||
  fail "the arm64 edge's weights differ from the x86 edge's by more than 1e-5"
kill -0 "$cloud_pid" || fail "the cloud died"
echo "PASS: an arm64 edge under qemu and an x86 edge reach the same weights after $steps steps"
