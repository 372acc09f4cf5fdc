#!/usr/bin/env bash
# tandem's main job on embedded defaults: sets up and builds, then starts a cloud service
# (tandem-cloud serve, back shard on oneDNN, certificates generated on first start) and an
# edge agent (tandem-edge train, front shard on XNNPACK, its own identity issued by the
# cloud's CA) on loopback over TLS WebSockets with mutual TLS, and split-trains the
# Fashion-MNIST sample for one epoch: batch 64, 4 micro-batches in flight a step, SGD lr 0.05
# momentum 0.9 on a cosine schedule over the run. Prints progress, per-epoch metrics (also in
# out/metrics.jsonl) and the final test accuracy. Extra arguments go to tandem-edge train and
# win over these (e.g. --epochs 3, --limit 10000, --schedule constant, --wire-dtype f16).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh release
bin=build/release
mkdir -p out
"$bin/cloud/tandem-cloud" pki init --state-dir out/cloud-state > /dev/null
"$bin/cloud/tandem-cloud" pki issue --state-dir out/cloud-state --client hospital-edge --out out/edge-identity > /dev/null
"$bin/cloud/tandem-cloud" serve --listen 127.0.0.1:0 --state-dir out/cloud-state \
  --model samples/fashion-mnist/model.json > out/cloud.log 2>&1 &
cloud=$!
trap 'kill $cloud 2>/dev/null; wait $cloud 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do grep -q 'listening on' out/cloud.log && break; sleep 0.1; done
port=$(grep -o 'wss://127.0.0.1:[0-9]*' out/cloud.log | cut -d: -f3)
if [[ -z $port ]]; then echo "tandem-cloud did not start:"; cat out/cloud.log; exit 1; fi
head -n 1 out/cloud.log
"$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity out/edge-identity \
  --model samples/fashion-mnist/model.json --epochs 1 --batch 64 --microbatches 4 --schedule cosine \
  --metrics-json out/metrics.jsonl "$@"
tail -n 2 out/cloud.log
