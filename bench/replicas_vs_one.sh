#!/usr/bin/env bash
# Replicas of a heavy shared back over Gloo (pipeline/replicas.h) against one: R = 2 processes,
# each a replica on one core serving its own edges' activations (random rows of the cut's
# shape, as edges replaying recorded activations would send), their gradients all-summed
# before every update, against R = 1 on one core serving one replica's share: the aggregate
# samples/s of each, alternating for ROUNDS rounds (default 3), medians and their ratio (the bar:
# at least 1.6x). Then the all-reduce model: Gloo's ring all-reduce of S bytes among R members
# takes t(R) = 2 (R - 1) a + 2 (R - 1) / R * S / b (a: a message's latency, b: the link's
# bandwidth). a and b are measured on loopback (a tiny all-sum at R = 2 gives a; the
# gradients' all-sum at R = 2 gives b), the model then predicts R = 3's time, checked against
# its measurement; and it prints the time a step at 1, 10 and 100 Gbit/s for R up to 64 (a =
# 50 us, a data centre's TCP round trip), with the speed-up over one replica that leaves given
# this machine's compute time a step. A failed run fails the script.
# Usage: bash bench/replicas_vs_one.sh (SPEC, CUT, BATCH, K, STEPS, ROUNDS in the environment;
#   default ResNet18-32 cut at relu17, 16 rows a replica a step, K = 2, 6 steps)
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${SPEC:-samples/models/resnet18-32.json} cut=${CUT:-relu17} batch=${BATCH:-16} k=${K:-2}
steps=${STEPS:-6} rounds=${ROUNDS:-3}
bin=$PWD/build/release/bench/bench_back_shard
[[ -x $bin ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1
cores=$(getconf _NPROCESSORS_ONLN)  # (nproc would say 1: it honours OMP_NUM_THREADS)
cpu() { echo $(($1 % cores)); }
common=("$PWD/$spec" --cut "$cut" --backend onednn --batch "$batch" --microbatches "$k" --threads 1)
field() { grep -o "\"$2\":[0-9.]*" "$1" | head -1 | cut -d: -f2; }

# run R NAME EXTRA...: R replicas (one core each), their JSON lines in $work/NAME.R.I.json.
run() {
  local r=$1 name=$2 i pids=()
  shift 2
  rm -rf "$work/store.$name"
  for ((i = 0; i < r; i++)); do
    local extra=()
    ((r > 1)) && extra=(--replicas "$r" --rank "$i" --store "$work/store.$name")
    taskset -c "$(cpu "$i")" "$bin" "${common[@]}" "${extra[@]}" "$@" > "$work/$name.$r.$i.json" 2> "$work/$name.$r.$i.err" &
    pids+=($!)
  done
  for ((i = 0; i < r; i++)); do
    wait "${pids[$i]}" || fail "replica $i of $r ($name): $(tail -3 "$work/$name.$r.$i.err")"
  done
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

one=() two=() ar=()
for ((round = 1; round <= rounds; round++)); do
  run 1 train --steps "$steps" --warmup 2
  run 2 train --steps "$steps" --warmup 2
  a=$(field "$work/train.1.0.json" samples_per_s)
  b=$(field "$work/train.2.0.json" samples_per_s)
  c=$(field "$work/train.2.0.json" allreduce_ms_median)
  [[ -n $a && -n $b ]] || fail "a run printed no rate"
  one+=("$a") two+=("$b") ar+=("$c")
  echo "round $round: R = 1 $a samples/s, R = 2 $b samples/s (all-sum $c ms a step)"
done
m1=$(printf '%s\n' "${one[@]}" | median) m2=$(printf '%s\n' "${two[@]}" | median)
step_ms=$(field "$work/train.1.0.json" step_ms_median)
bytes=$(field "$work/train.2.0.json" allreduce_bytes)

# The all-reduce alone: a tiny one (latency) and the gradients' size at R = 2 and 3.
run 2 tiny --allreduce-only 30 --allreduce-floats 1
run 2 grads --allreduce-only 10
run 3 grads --allreduce-only 10
t_tiny=$(field "$work/tiny.2.0.json" allreduce_ms_median)
t2=$(field "$work/grads.2.0.json" allreduce_ms_median)
t3=$(field "$work/grads.3.0.json" allreduce_ms_median)

python3 - "$m1" "$m2" "$step_ms" "$bytes" "$t_tiny" "$t2" "$t3" "$cores" <<'PY'
import sys
m1, m2, step_ms, S, t_tiny, t2, t3, cores = (float(x) for x in sys.argv[1:9])
ratio = m2 / m1
print(f"medians: R = 1 {m1:.1f} samples/s, R = 2 {m2:.1f} samples/s: {ratio:.2f}x (bar: 1.6x)")
a = t_tiny / 2 / 1e3                      # s: t(2) of a tiny message = 2 a
b = S / (t2 / 1e3 - 2 * a)                # bytes/s: t(2) = 2 a + S / b
pred3 = (4 * a + 4 / 3 * S / b) * 1e3
# On loopback the bandwidth is the members' CPUs (copies and sums): three members on fewer
# cores than three each get cores / 3 of one.
share = max(1.0, 3 / cores)
print(f"all-reduce of {S / 1e6:.1f} MB on loopback: a = {a * 1e6:.0f} us, b = {b / 1e9:.2f} GB/s (from R = 2: "
      f"{t2:.1f} ms); R = 3 predicted {pred3:.1f} ms" +
      (f", x{share:.1f} for 3 members on {cores:.0f} cores: {pred3 * share:.1f} ms" if share > 1 else "") +
      f"; measured {t3:.1f} ms ({(t3 - pred3 * share) / (pred3 * share) * 100:+.0f}%)")
compute = step_ms / 1e3
print(f"one replica's step here: {step_ms:.0f} ms of compute; at other links (a = 50 us), the all-reduce a step "
      f"and the aggregate speed-up over one replica (R x compute / (compute + all-reduce)):")
print("   R | " + " | ".join(f"{g:>3} Gbit/s: ms, speed-up" for g in (1, 10, 100)))
for R in (2, 3, 4, 8, 16, 32, 64):
    cells = []
    for g in (1, 10, 100):
        t = 2 * (R - 1) * 50e-6 + 2 * (R - 1) / R * S / (g * 1e9 / 8)
        cells.append(f"{t * 1e3:9.1f}, {R * compute / (compute + t):5.1f}x")
    print(f"  {R:2d} | " + " | ".join(f"{c:>24}" for c in cells))
sys.exit(0 if ratio >= 1.6 else 3)
PY
