#!/usr/bin/env bash
# A stage split into layer shards (pipeline/layer_shards.h, Megatron's MLP split) against the
# whole stage: MLP blocks (D -> H -> D, GELU) trained whole in one process on one core, and
# split over 2 processes on a core each (Gloo on loopback), both on the same rows; the stage's
# samples/s of each, alternating for ROUNDS rounds (default 3), medians and their ratio. The
# arithmetic: a member computes half of every pair's linears and all of the head; the split
# adds the all-sums (2 a block a micro-batch going forward and back, B x D floats each), whose
# measured share of a step is printed, and the ideal ratio t_whole / (t_whole / 2 + t_allsum)
# beside the measured one. A failed run fails the script.
# Usage: bash bench/layer_shards_vs_one.sh (DIM, HIDDEN, BLOCKS, BATCH, K, STEPS, ROUNDS in the
#   environment; default D 512, H 2048, 2 blocks, 64 rows a step in K = 2, 10 steps)
set -euo pipefail
cd "$(dirname "$0")/.."
dim=${DIM:-512} hidden=${HIDDEN:-2048} blocks=${BLOCKS:-2} batch=${BATCH:-64} k=${K:-2}
steps=${STEPS:-10} rounds=${ROUNDS:-3}
bin=$PWD/build/release/bench/bench_layer_shards
[[ -x $bin ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1
cores=$(getconf _NPROCESSORS_ONLN)
((cores >= 2)) || fail "two members need two cores; this machine has $cores"
common=(--dim "$dim" --hidden "$hidden" --blocks "$blocks" --batch "$batch" --microbatches "$k" --steps "$steps"
        --warmup 2 --backend onednn)
field() { grep -o "\"$2\":[0-9.]*" "$1" | head -1 | cut -d: -f2; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

whole=() split=() whole_ms=() split_ms=() allsum=()
for ((round = 1; round <= rounds; round++)); do
  taskset -c 0 "$bin" "${common[@]}" > "$work/whole.json" 2> "$work/whole.err" || fail "whole: $(cat "$work/whole.err")"
  rm -rf "$work/store"
  pids=()
  for i in 0 1; do
    taskset -c "$i" "$bin" "${common[@]}" --shards 2 --rank "$i" --store "$work/store" > "$work/split.$i.json" \
      2> "$work/split.$i.err" &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || fail "member $i: $(cat "$work/split.$i.err")"; done
  a=$(field "$work/whole.json" samples_per_s) b=$(field "$work/split.0.json" samples_per_s)
  whole+=("$a") split+=("$b")
  whole_ms+=("$(field "$work/whole.json" step_ms_median)") split_ms+=("$(field "$work/split.0.json" step_ms_median)")
  allsum+=("$(field "$work/split.0.json" allsum_ms_a_step)")
  [[ -n $a && -n $b ]] || fail "a run printed no rate"
  echo "round $round: whole $a samples/s, 2 shards $b samples/s (all-sums ${allsum[-1]} ms a step)"
done
m1=$(printf '%s\n' "${whole[@]}" | median) m2=$(printf '%s\n' "${split[@]}" | median)
t1=$(printf '%s\n' "${whole_ms[@]}" | median) t2=$(printf '%s\n' "${split_ms[@]}" | median)
ta=$(printf '%s\n' "${allsum[@]}" | median)
bytes=$(field "$work/split.0.json" allsum_bytes_a_step)
python3 - "$m1" "$m2" "$t1" "$t2" "$ta" "$bytes" <<'PY'
import sys
m1, m2, t1, t2, ta, by = (float(x) for x in sys.argv[1:7])
print(f"medians: whole {m1:.1f} samples/s ({t1:.2f} ms a step), 2 shards {m2:.1f} samples/s ({t2:.2f} ms a step): "
      f"{m2 / m1:.2f}x")
print(f"all-sums: {ta:.2f} ms a step ({by / 1e3:.0f} kB a member), {100 * ta / t2:.0f}% of a split step")
print(f"ideal with these all-sums: t_whole / (t_whole / 2 + t_allsum) = {t1 / (t1 / 2 + ta):.2f}x; "
      f"measured {t1 / t2:.2f}x by step time")
PY
