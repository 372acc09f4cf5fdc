#!/usr/bin/env bash
# Split-federated Fashion-MNIST, the issue's bar: N edges (default 4), each with its own share
# of the training set (non-IID by class by default: sorted by class, equal slices), against
# one cloud that averages their front shards every S steps (default 50), E epochs (default
# 2). Prints every edge's final test accuracy (after the last round's average) and the
# cloud's rounds. All on this machine over loopback TLS. The edges' front shards update once
# a round (--front-updates round) at lr 0.005 with a cosine schedule, unless EDGE_ARGS says
# otherwise (its options come after these and override them).
# Usage: [EDGE_ARGS=...] [CLOUD_ARGS=...] bash bench/federation.sh [EDGES] [AGGREGATE_EVERY] [EPOCHS] [SPLIT] [LIMIT] [BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
edges=${1:-4} every=${2:-50} epochs=${3:-2} split=${4:-class} limit=${5:-0} batch=${6:-32}
build=build/release model=samples/fashion-mnist/model.json
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
"$build/cloud/tandem-cloud" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$model" \
  --aggregate-every "$every" --min-edges "$edges" --metrics-json "$work/cloud.jsonl" ${CLOUD_ARGS:-} > "$work/cloud.log" 2>&1 &
for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/cloud.log" | cut -d: -f3)
pids=()
start=$(date +%s.%N)
for ((i = 0; i < edges; i++)); do
  "$build/cloud/tandem-cloud" pki issue --state-dir "$work/state" --client "hospital-$i" --out "$work/hospital-$i" > /dev/null
  "$build/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$work/hospital-$i" --model "$model" \
    --epochs "$epochs" --limit "$limit" --shard "$i/$edges" --split "$split" --batch "$batch" --microbatches 4 \
    --front-updates round --lr 0.005 --momentum 0 --schedule cosine \
    --metrics-json "$work/edge-$i.jsonl" ${EDGE_ARGS:-} > "$work/edge-$i.out" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
end=$(date +%s.%N)
for ((i = 0; i < edges; i++)); do
  echo "hospital-$i: $(grep -o 'this edge.s share: [^)]*)' "$work/edge-$i.out" | head -1); final: $(tail -1 "$work/edge-$i.jsonl" | grep -o '"test_accuracy":[0-9.]*\|"rounds_joined":[0-9]*' | tr '\n' ' ')"
done
echo "rounds: $(grep -c '"round"' "$work/cloud.jsonl"), wall time $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
tail -2 "$work/cloud.log"
grep -h -o "\"epoch\":[0-9]*\|\"train_loss\":[0-9.a-z]*\|\"test_accuracy\":[0-9.]*" "$work"/edge-0.jsonl | paste -sd" "
