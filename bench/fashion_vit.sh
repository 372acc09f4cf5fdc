#!/usr/bin/env bash
# samples/fashion-vit trained by tandem (split at its default cut, both shards in one process:
# tandem train, xnnpack front and onednn back) and by PyTorch (bench/pytorch_fashion_vit.py,
# the same model, optimizer, batch, epochs and learning rate), one thread each, in one run:
# test accuracy and samples/s of each (issue 16's bar: tandem within 1 point of PyTorch).
# Usage: bash bench/fashion_vit.sh [EPOCHS] [LIMIT]   (defaults 3, 60000)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-3} limit=${2:-60000} batch=64 lr=0.001
bin=build/release
[[ -x $bin/tools/tandem ]] || { bash scripts/setup.sh release > /dev/null; cmake --build $bin --target tandem > /dev/null; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
OMP_NUM_THREADS=1 "$bin/tools/tandem" train --model samples/fashion-vit/model.json --epochs "$epochs" --batch $batch \
  --microbatches 4 --optimizer adam --lr $lr --limit "$limit" --threads 1 --metrics-json "$out" > /dev/null 2>&1
tandem=$(tail -1 "$out")
torch=$(OMP_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_fashion_vit.py "$epochs" $batch $lr "$limit")
/usr/bin/python3 - "$tandem" "$torch" <<'PY'
import json, sys
t, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{'':>8} {'test accuracy':>14} {'samples/s':>10}")
print(f"{'tandem':>8} {t['test_accuracy'] * 100:13.2f}% {t['samples_per_s']:10.1f}")
print(f"{'pytorch':>8} {p['test_accuracy'] * 100:13.2f}% {p['samples_per_s']:10.1f}")
gap = (t['test_accuracy'] - p['test_accuracy']) * 100
print(json.dumps({"bench": "fashion_vit", "tandem_accuracy": t["test_accuracy"], "pytorch_accuracy": p["test_accuracy"],
                  "gap_points": round(gap, 2), "speed_ratio": round(t["samples_per_s"] / p["samples_per_s"], 2),
                  "bar_met": gap >= -1.0}))
PY
