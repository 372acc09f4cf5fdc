#!/usr/bin/env bash
# Length buckets on spam-bert: the same split training over TLS (tandem-cloud and tandem-edge
# on loopback, K=4, batch 32, AdamW, one thread a process) with the spec's length_buckets
# and --group-by-length, and with neither (every micro-batch at the full length), side by side on the same
# mails encoded at TOKENS tokens: samples/s over SPEED_SAMPLES mails, the tokens a mail ran at,
# and the test accuracy after EPOCHS epochs of each. Longer TOKENS means more padding to save
# (at 128, 84% of the mails fill every token; at 256 about half do).
# Usage: bash bench/length_buckets.sh [TOKENS (256)] [SPEED_SAMPLES (1024)] [EPOCHS (1)]
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-256} speed_samples=${2:-1024} epochs=${3:-1} batch=32 lr=0.0005
bin=build/release src=samples/spam-bert
[[ -f $src/data/spm.model && -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "length_buckets: $*" >&2; exit 1; }
cloud_bin=$bin/cloud/tandem-cloud
source tests/e2e/lib.sh

# The data at TOKENS tokens, and the spec at that length with buckets at 1/4, 1/2 and 3/4 of it
# (bucketed.json) and without (plain.json).
mkdir -p "$work/data"
for split in train test; do
  "$bin/tools/tandem" text encode --spm "$src/data/spm.model" --texts "$src/data/$split.jsonl" --tokens "$tokens" \
    --out "$work/data/$split.safetensors" > /dev/null
done
sed -e "s/shape: \[128\]/shape: [$tokens]/g" -e "s/embedding: { count: 128 }/embedding: { count: $tokens }/" \
  -e "s/length_buckets: \[32, 64, 96\]/length_buckets: [$((tokens / 4)), $((tokens / 2)), $((tokens * 3 / 4))]/" \
  "$src/model.json" > "$work/bucketed.json"
sed -e 's/, length_buckets: \[[0-9, ]*\]//' "$work/bucketed.json" > "$work/plain.json"
grep -q "length_buckets: \[$((tokens / 4))," "$work/bucketed.json" || fail "the spec's buckets were not rewritten"
! grep -q length_buckets "$work/plain.json" || fail "the plain spec still has buckets"

"$cloud_bin" pki init --state-dir "$work/state" > /dev/null
"$cloud_bin" pki issue --state-dir "$work/state" --client bench --out "$work/id" > /dev/null

# run SPEC LIMIT EPOCHS: one split run over TLS; prints its last metrics line.
run() {
  model=$work/$1.json
  start_cloud_as "cloud-$1" --optimizer adamw --lr $lr --threads 1
  OMP_NUM_THREADS=1 "$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$work/id" --model "$model" \
    --data "$work/data" --limit "$2" --epochs "$3" --batch $batch --microbatches 4 --optimizer adamw --lr $lr --threads 1 $4 \
    --metrics-json "$work/$1.jsonl" > "$work/edge.log" 2>&1 || fail "the edge ($1): $(tail -3 "$work/edge.log")"
  stop_cloud
  tail -1 "$work/$1.jsonl"
}
field() { grep -o "\"$1\": *[0-9.]*" <<< "$2" | tail -1 | sed 's/.*: *//'; }

# Speed: the two on the same mails, one after the other, twice (ABAB), medians of two.
declare -A speed
for round in 1 2; do
  for spec in bucketed plain; do
    line=$(run $spec "$speed_samples" 1 "$([[ $spec == bucketed ]] && echo --group-by-length)")
    speed[$spec]+="$(field samples_per_s "$line") "
    [[ $spec == bucketed ]] && tps=$(field tokens_per_sample "$line")
  done
done
median2() { awk '{ printf "%.1f", ($1 + $2) / 2 }' <<< "$1"; }
bs=$(median2 "${speed[bucketed]}") ps=$(median2 "${speed[plain]}")
echo "speed, $speed_samples mails at $tokens tokens: buckets $bs samples/s (${speed[bucketed]}; $tps tokens a mail), full length $ps samples/s (${speed[plain]})"

# Accuracy: every training mail for EPOCHS epochs, each way.
ba=$(field test_accuracy "$(run bucketed 0 "$epochs" --group-by-length)") pa=$(field test_accuracy "$(run plain 0 "$epochs" "")")
echo "accuracy after $epochs epochs: buckets $ba, full length $pa"
awk -v bs="$bs" -v ps="$ps" -v ba="$ba" -v pa="$pa" -v t="$tokens" -v tps="$tps" -v n="$speed_samples" -v e="$epochs" 'BEGIN {
  printf "speed %.2fx, accuracy %+.2f points\n", bs / ps, (ba - pa) * 100
  printf "{\"bench\":\"length_buckets\",\"tokens\":%d,\"speed_samples\":%d,\"tokens_per_sample\":%s,", t, n, tps
  printf "\"bucketed_samples_per_s\":%s,\"full_samples_per_s\":%s,\"speed_ratio\":%.2f,", bs, ps, bs / ps
  printf "\"epochs\":%d,\"bucketed_accuracy\":%s,\"full_accuracy\":%s,\"gap_points\":%.2f}\n", e, ba, pa, (ba - pa) * 100 }'
