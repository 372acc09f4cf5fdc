#!/usr/bin/env bash
# tandem's split training (cloud + edge over TLS WebSockets on loopback, K=4) against a
# PyTorch split-learning baseline (edge and cloud processes over a loopback TCP socket,
# /usr/bin/python3 with Debian's python3-torch), same model, batch 64 and cut, one thread a
# process, run side by side; prints samples/s of each and the ratio.
# Usage: bash bench/split_vs_pytorch.sh [SAMPLES]   (default 12800)
set -euo pipefail
cd "$(dirname "$0")/.."
samples=${1:-12800}
bin=build/release
[[ -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "needs Debian's python3-torch: apt-get install python3-torch libopenblas0-pthread"; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

# tandem
"$bin/cloud/tandem-cloud" serve --listen 127.0.0.1:0 --state-dir "$work/state" \
  --model samples/fashion-mnist/model.json > "$work/cloud.log" 2>&1 &
for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/cloud.log" | cut -d: -f3)
"$bin/cloud/tandem-cloud" pki issue --state-dir "$work/state" --client bench --out "$work/id" > /dev/null
"$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$work/id" \
  --model samples/fashion-mnist/model.json --limit "$samples" --test-limit 100 --batch 64 --microbatches 4 \
  --metrics-json "$work/tandem.jsonl" > /dev/null 2>&1
cat "$work/tandem.jsonl"
tandem=$(grep -o '"samples_per_s":[0-9.]*' "$work/tandem.jsonl" | cut -d: -f2)

# PyTorch baseline
bport=$((20000 + RANDOM % 20000))
OMP_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_split/baseline.py cloud "$bport" &
sleep 3
base_json=$(OMP_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_split/baseline.py edge "$bport" "$samples" 64)
base=$(echo "$base_json" | grep -o '"samples_per_s": [0-9.]*' | cut -d' ' -f2)

echo "tandem (TLS, K=4): $tandem samples/s; PyTorch split baseline (TCP, K=1): $base samples/s"
awk -v t="$tandem" -v b="$base" 'BEGIN { printf "ratio tandem / PyTorch: %.2fx (bar: >= 2x)\n", t / b }'
echo "{\"bench\":\"split_vs_pytorch\",\"samples\":$samples,\"tandem_samples_per_s\":$tandem,\"pytorch_samples_per_s\":$base}"
