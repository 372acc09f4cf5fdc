#!/usr/bin/env bash
# The asynchronous pipeline's cost in accuracy: Fashion-MNIST's main job (the sample model,
# batch 64, K=4, SGD lr 0.05 momentum 0.9 on a cosine schedule, all 60,000 training samples) for EPOCHS epochs,
# synchronous and with --pipeline async, for each seed; prints both test accuracies (all
# 10,000 test samples) and samples/s per seed, and the mean difference (issue 19's bar:
# within 0.5 points after 3 epochs).
# Usage: bash bench/async_accuracy.sh [EPOCHS] [SEEDS...]   (default 3 epochs, seeds 1 2 3)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-3}
shift || true
seeds=("$@")
((${#seeds[@]})) || seeds=(1 2 3)
bin=build/release
[[ -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
cloud_bin=$bin/cloud/tandem-cloud model=samples/fashion-mnist/model.json
fail() { echo "FAIL: $*" >&2; exit 1; }
source tests/e2e/lib.sh  # start_cloud_as
"$bin/cloud/tandem-cloud" pki init --state-dir "$work/state" > /dev/null
"$bin/cloud/tandem-cloud" pki issue --state-dir "$work/state" --client bench --out "$work/id" > /dev/null

# One run: a fresh cloud and an edge; prints the final test accuracy and the last epoch's samples/s.
run() {
  start_cloud_as cloud
  local cloud=$cloud_pid
  rm -f "$work/m.jsonl"
  "$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$work/id" \
    --model samples/fashion-mnist/model.json --epochs "$epochs" --batch 64 --microbatches 4 --schedule cosine \
    --metrics-json "$work/m.jsonl" "$@" > "$work/edge.log" 2>&1 ||
    { echo "the edge ($*) failed: $(tail -3 "$work/edge.log")" >&2; stop_cloud "$cloud"; return 1; }
  stop_cloud "$cloud"
  echo "$(grep -o '"test_accuracy":[0-9.]*' "$work/m.jsonl" | tail -1 | cut -d: -f2)" \
    "$(grep -o '"samples_per_s":[0-9.]*' "$work/m.jsonl" | tail -1 | cut -d: -f2)"
}

: > "$work/diffs"
for seed in "${seeds[@]}"; do
  read -r s s_rate <<< "$(run --seed "$seed")"
  read -r a a_rate <<< "$(run --seed "$seed" --pipeline async)"
  need_figures "seed $seed" "$s" "$s_rate" "$a" "$a_rate"
  echo "seed $seed: synchronous $s ($s_rate samples/s), asynchronous $a ($a_rate samples/s)"
  awk -v s="$s" -v a="$a" 'BEGIN { printf "%.6f\n", (a - s) * 100 }' >> "$work/diffs"
done
mean=$(awk '{ t += $1 } END { printf "%.2f", t / NR }' "$work/diffs")
echo "after $epochs epochs, asynchronous minus synchronous test accuracy, mean over ${#seeds[@]} seeds: $mean points (bar: within 0.5)"
echo "{\"bench\":\"async_accuracy\",\"epochs\":$epochs,\"seeds\":${#seeds[@]},\"mean_difference_points\":$mean}"
