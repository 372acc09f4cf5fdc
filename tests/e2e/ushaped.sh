#!/usr/bin/env bash
# U-shaped split training with real processes over TLS on loopback: the cloud serves the
# middle of the sample model (cut "pool2,relu3"), the edge runs the front and the tail with
# the loss. It learns; its egress log verifies and shows that no label left (Forwards and
# EvalForwards carry none; the middle's output gradients went up instead); an edge with an
# ordinary cut is refused by this cloud in its words.
# Usage: ushaped.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; cat "$work/cloud.log"; exit 1; }

source "$src/tests/e2e/lib.sh"
start_cloud_as cloud --cut pool2,relu3
"$cloud_bin" pki issue --state-dir "$work/state" --client ward-u --out "$work/u" > /dev/null
train() {  # train NAME EXTRA...
  local name=$1; shift
  "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/u" --model "$model" \
    --metrics-json "$work/$name.jsonl" "$@" > "$work/$name.out" 2>&1
}

train u --cut pool2,relu3 --epochs 2 --limit 3200 --test-limit 1000 || fail "the U-shaped edge: $(tail -3 "$work/u.out")"
acc=$(tail -1 "$work/u.jsonl" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2)
awk -v a="$acc" 'BEGIN { exit !(a >= 0.70) }' || fail "the U-shaped run reached test accuracy $acc (< 0.70)"
echo "U-shaped (cut pool2,relu3): test accuracy $acc, scored at the edge"

"$tandem_bin" audit verify "$work/u/egress.jsonl" > "$work/audit.out" || fail "audit verify: $(cat "$work/audit.out")"
cat "$work/audit.out"
grep -Eq "^  Forward +400 messages .* activations f32 \[[0-9,]+\]$" "$work/audit.out" ||
  fail "Forward in the audit (400 messages, activations, no labels): $(cat "$work/audit.out")"
grep -Eq "^  MiddleGradient +400 messages .* gradients f32 \[[0-9]+,128\]$" "$work/audit.out" ||
  fail "MiddleGradient in the audit: $(cat "$work/audit.out")"
grep -q "labels" "$work/audit.out" && fail "labels left the edge: $(cat "$work/audit.out")"
grep -q '"labels"' "$work/u/egress.jsonl" && fail "a line of the egress log records labels"
echo "egress log: verifies; no label left the edge"

if train plain --cut pool2 --limit 64 --test-limit 10; then fail "an edge with the ordinary cut trained"; fi
grep -q "the cloud refused: the edge's model spec or cut differs from the cloud's" "$work/plain.out" ||
  fail "ordinary cut: $(cat "$work/plain.out")"
kill -0 "$cloud_pid" || fail "the cloud died"
grep -q "cut 'pool2,relu3': 100 steps, 6400 samples" "$work/cloud.log" || fail "the cloud's session line"
echo "PASS"
