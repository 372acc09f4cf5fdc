#!/usr/bin/env bash
# One op's forward + backward on every backend against PyTorch CPU on the same shapes (issue
# 16's bar: no slower), one thread, in the same run: bench_OP and bench/pytorch_OP.py, then
# each backend's time as a ratio of PyTorch's. OP: layer_norm or attention.
# Usage: bash bench/op_vs_pytorch.sh OP [REPS]  (default 21)
set -euo pipefail
cd "$(dirname "$0")/.."
op=${1:?usage: bash bench/op_vs_pytorch.sh layer_norm|attention [REPS]}
reps=${2:-21}
[[ -f bench/pytorch_$op.py ]] || { echo "no benchmark for op '$op' (bench/pytorch_$op.py)" >&2; exit 2; }
bin=build/release
[[ -x $bin/bench/bench_$op ]] || { bash scripts/setup.sh release > /dev/null; cmake --build $bin --target "bench_$op" > /dev/null; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
OMP_NUM_THREADS=1 "$bin/bench/bench_$op" "$reps" > "$out"
OMP_NUM_THREADS=1 /usr/bin/python3 "bench/pytorch_$op.py" "$reps" >> "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
torch = {r["shape"]: r for r in rows if r["backend"] == "pytorch"}
print(f"{'shape':>16} {'backend':>10} {'fwd ms':>9} {'bwd ms':>9} {'total ms':>9} {'x PyTorch':>10}")
for r in rows:
    t = torch[r["shape"]]
    print(f"{r['shape']:>16} {r['backend']:>10} {r['forward_ms']:9.3f} {r['backward_ms']:9.3f} "
          f"{r['total_ms']:9.3f} {r['total_ms'] / t['total_ms']:10.2f}")
PY
