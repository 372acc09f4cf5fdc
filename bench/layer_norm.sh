#!/usr/bin/env bash
# LayerNorm forward + backward against PyTorch CPU on the same shapes (issue 16's bar: no
# slower), one thread, in the same run: bench_layer_norm's backends and
# pytorch_layer_norm.py, then each backend's time as a ratio of PyTorch's.
# Usage: bash bench/layer_norm.sh [REPS]  (default 21)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-21}
bin=build/release
[[ -x $bin/bench/bench_layer_norm ]] || { bash scripts/setup.sh release > /dev/null; cmake --build $bin --target bench_layer_norm > /dev/null; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
OMP_NUM_THREADS=1 "$bin/bench/bench_layer_norm" "$reps" > "$out"
OMP_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_layer_norm.py "$reps" >> "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
torch = {(r["rows"], r["features"]): r for r in rows if r["backend"] == "pytorch"}
print(f"{'shape':>12} {'backend':>10} {'fwd ms':>9} {'bwd ms':>9} {'total ms':>9} {'x PyTorch':>10}")
for r in rows:
    t = torch[(r["rows"], r["features"])]
    print(f"{r['rows']:>6}x{r['features']:<5} {r['backend']:>10} {r['forward_ms']:9.3f} {r['backward_ms']:9.3f} "
          f"{r['total_ms']:9.3f} {r['total_ms'] / t['total_ms']:10.2f}")
PY
