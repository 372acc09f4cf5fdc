#!/usr/bin/env bash
# PyTorch interop end to end: split-train a few steps over TLS with checkpoints on both
# sides, `tandem export` them into one safetensors file, and load it into the equivalent
# torch model (/usr/bin/python3): the same test-set logits and predictions as tandem's own.
# Then both sides start again from that file (--init-from) and evaluate to the same accuracy.
# Usage: torch_interop.sh BUILD_DIR SOURCE_DIR [SPEC]
set -euo pipefail
build=$1 src=$2
model=${3:-$src/samples/fashion-mnist/model.json}
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; cat "$work/cloud.log"; exit 1; }
source "$src/tests/lib/skip.sh"
source "$src/tests/e2e/lib.sh"  # stop_cloud
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null ||
  skip_or_fail "/usr/bin/python3 has no torch (install python3-torch python3-numpy; scripts/setup.sh does)"

start_cloud() {  # start_cloud EXTRA...
  "$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$model" "$@" > "$work/cloud.log" 2>&1 &
  cloud_pid=$!
  for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
  port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/cloud.log" | cut -d: -f3)
  [[ -n $port ]] || fail "the cloud did not start"
}
start_cloud
"$cloud_bin" pki issue --state-dir "$work/state" --client site-a --out "$work/site-a" > /dev/null

# 20 steps of 32 (an epoch of 640 samples), checkpoints every 8 steps and at the epoch's end.
"$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/site-a" --model "$model" --limit 640 \
  --test-limit 500 --batch 32 --microbatches 4 --checkpoint-dir "$work/ckpt" --checkpoint-every 8 \
  > "$work/edge.out" 2>&1 || fail "edge: $(tail -3 "$work/edge.out")"
ls "$work/ckpt"/edge-000000000020.tdmc "$work/state/checkpoints/site-a"/cloud-000000000020.tdmc > /dev/null ||
  fail "missing checkpoints: $(ls "$work/ckpt" "$work/state/checkpoints/site-a")"

"$tandem_bin" export --model "$model" --edge-ckpt "$work/ckpt/edge-000000000020.tdmc" \
  --cloud-ckpt "$work/state/checkpoints/site-a/cloud-000000000020.tdmc" --identity "$work/site-a" \
  --out "$work/model.safetensors" || fail "export"
"$tandem_bin" evaluate --model "$model" --weights "$work/model.safetensors" --test-limit 1000 \
  --logits "$work/logits.f32" --predictions "$work/preds.txt" > "$work/eval.json" 2> /dev/null || fail "evaluate"
cat "$work/eval.json"
/usr/bin/python3 "$src/tests/interop/torch_check.py" "$model" "$work/model.safetensors" "$work/logits.f32" \
  "$work/preds.txt" 1000 || fail "torch disagrees with tandem"

# An exported file is refused with the reason when the steps differ or the key is missing.
if "$tandem_bin" export --model "$model" --edge-ckpt "$work/ckpt/edge-000000000020.tdmc" \
     --cloud-ckpt "$work/state/checkpoints/site-a/cloud-000000000020.tdmc" --out "$work/x" 2> "$work/nokey.err"; then
  fail "export of a sealed checkpoint without its key"
fi
grep -q "is encrypted: pass the edge's identity folder" "$work/nokey.err" || fail "no-key error: $(cat "$work/nokey.err")"
if "$tandem_bin" export --model "$model" --edge-ckpt "$work/ckpt/edge-000000000016.tdmc" --identity "$work/site-a" \
     --cloud-ckpt "$work/state/checkpoints/site-a/cloud-000000000020.tdmc" --out "$work/x" 2> "$work/steps.err"; then
  fail "export of checkpoints of different steps"
fi
grep -q "the edge's checkpoint is of step 16, the cloud's of step 20" "$work/steps.err" || fail "steps error: $(cat "$work/steps.err")"

# Both sides start from the exported weights: evaluated through the cloud before any
# training (--epochs 0), the accuracy equals tandem evaluate's on the same images.
stop_cloud
start_cloud --init-from "$work/model.safetensors"
"$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/site-a" --model "$model" --epochs 0 \
  --test-limit 1000 --init-from "$work/model.safetensors" --metrics-json "$work/init.jsonl" \
  > "$work/init.out" 2>&1 || fail "edge --init-from: $(tail -3 "$work/init.out")"
want=$(grep -o '"test_accuracy":[0-9.]*' "$work/eval.json" | cut -d: -f2)
got=$(grep -o '"test_accuracy":[0-9.]*' "$work/init.jsonl" | cut -d: -f2)
echo "accuracy from the exported weights: tandem evaluate $want, split run from --init-from $got"
awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; exit !(d < 0.0015 && d > -0.0015) }' ||
  fail "--init-from run measured $got, evaluate $want"
echo "PASS"
