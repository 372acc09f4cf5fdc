#!/usr/bin/env bash
# Activation and gradient compression on the wire: the Fashion-MNIST sample trained through a
# local cloud over TLS (K=4, batch 64) once per wire dtype (f32, f16, bf16, i8), same seed.
# Prints bytes on the wire (training, both directions) and final test accuracy beside f32's,
# with the model-zoo issue's bars (f16: <= 52% of the bytes, within 0.3 points; int8: <= 27%,
# within 1 point). Usage: bash bench/compression.sh [EPOCHS] [SAMPLES]   (default 3, all)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-3}
samples=${2:-0}
bin=build/release
[[ -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
"$bin/cloud/tandem-cloud" serve --listen 127.0.0.1:0 --state-dir "$work/state" \
  --model samples/fashion-mnist/model.json > "$work/cloud.log" 2>&1 &
for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/cloud.log" | cut -d: -f3)
"$bin/cloud/tandem-cloud" pki issue --state-dir "$work/state" --client bench --out "$work/id" > /dev/null

for d in f32 f16 bf16 i8; do
  "$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$work/id" \
    --model samples/fashion-mnist/model.json --epochs "$epochs" --limit "$samples" --wire-dtype "$d" \
    --metrics-json "$work/$d.jsonl" > /dev/null 2>&1
  grep -q "\"wire_dtype\":\"$d\"" "$work/$d.jsonl" || { echo "the $d run did not use $d on the wire"; exit 1; }
done

# Training bytes of all epochs (both directions) and the last epoch's test accuracy.
bytes() { grep -o '"train_bytes_\(up\|down\)":[0-9]*' "$work/$1.jsonl" | cut -d: -f2 | awk '{ s += $1 } END { printf "%.0f", s }'; }
acc() { tail -1 "$work/$1.jsonl" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2; }
speed() { awk -F'"samples_per_s":' 'NF > 1 { split($2, a, ","); s += a[1]; n++ } END { printf "%.0f", s / n }' "$work/$1.jsonl"; }
f32_bytes=$(bytes f32) f32_acc=$(acc f32)
printf "%-5s %14s %9s %10s %11s %10s\n" dtype "bytes" "of f32" "accuracy" "vs f32" "samples/s"
for d in f32 f16 bf16 i8; do
  awk -v d="$d" -v b="$(bytes "$d")" -v fb="$f32_bytes" -v a="$(acc "$d")" -v fa="$f32_acc" -v s="$(speed "$d")" \
    'BEGIN { printf "%-5s %14.0f %8.1f%% %9.2f%% %+10.2f %10d\n", d, b, 100 * b / fb, 100 * a, 100 * (a - fa), s }'
done
echo "bars: f16 <= 52% of f32's bytes and within 0.3 points; i8 <= 27% and within 1 point ($epochs epochs)"
for d in f32 f16 bf16 i8; do echo "{\"bench\":\"compression\",\"dtype\":\"$d\",\"epochs\":$epochs,\"train_bytes\":$(bytes "$d"),\"test_accuracy\":$(acc "$d")}"; done
