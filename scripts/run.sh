#!/usr/bin/env bash
# tandem's main job on embedded defaults: sets up and builds, then trains the Fashion-MNIST
# sample split at its cut (front on XNNPACK, back on oneDNN, 4 micro-batches a step) and
# prints progress, per-epoch metrics and the final test accuracy. Extra arguments go to
# `tandem train` (e.g. --epochs 3, --limit 10000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh release
mkdir -p out
exec build/release/tools/tandem train --model samples/fashion-mnist/model.json \
  --epochs 1 --batch 64 --microbatches 4 --lr 0.05 --momentum 0.9 \
  --metrics-json out/metrics.jsonl "$@"
