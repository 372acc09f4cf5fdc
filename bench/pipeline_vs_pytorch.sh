#!/usr/bin/env bash
# A pipeline of N stages in tandem (bench_pipeline: a thread a stage, one kernel thread each,
# schedule SCHEDULE, default 1f1b) against PyTorch's (bench/pytorch_pipeline.py: a process a
# stage, one thread each, torch.distributed Gloo send and receive, GPipe order), the same
# spec, cuts, batch and micro-batches, random data. The two alternate for ROUNDS rounds
# (default 3) on the same machine; prints each round, the medians of samples/s with each
# side's bubble, and the ratio of the medians. A failed run of either side fails the script.
# Usage: bash bench/pipeline_vs_pytorch.sh [SPEC CUTS BATCH K STEPS]
#   (default samples/models/resnet18-32.json relu10,relu26,relu42 64 4 8; BACKEND, SCHEDULE,
#   ROUNDS in the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-samples/models/resnet18-32.json}
cuts=${2:-relu10,relu26,relu42}
batch=${3:-64} k=${4:-4} steps=${5:-8}
rounds=${ROUNDS:-3} backend=${BACKEND:-onednn} schedule=${SCHEDULE:-1f1b}
bin=build/release/bench/bench_pipeline
[[ -x $bin ]] || bash scripts/setup.sh release > /dev/null
/usr/bin/python3 -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null || {
  echo "needs Debian's python3-torch with Gloo: apt-get install python3-torch"; exit 1; }
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p" <<< "$2"; }
port=$((29500 + RANDOM % 400))

echo "spec $spec, cuts $cuts, batch $batch, K $k, $steps timed steps a run, $rounds rounds"
tandem=() torch=() tandem_bubble=() torch_bubble=()
for ((r = 1; r <= rounds; r++)); do
  t=$("$bin" "$spec" --cuts "$cuts" --schedule "$schedule" --backend "$backend" --batch "$batch" \
        --microbatches "$k" --steps "$steps" --warmup 2) || fail "tandem's pipeline failed in round $r"
  p=$(/usr/bin/python3 bench/pytorch_pipeline.py "$spec" "$cuts" "$batch" "$k" "$steps" 2 $((port + r))) ||
    fail "PyTorch's pipeline failed in round $r"
  ts=$(field samples_per_s "$t") ps=$(field samples_per_s "$p")
  [[ -n $ts && -n $ps ]] || fail "round $r printed no samples/s: tandem '$t', PyTorch '$p'"
  tandem+=("$ts") torch+=("$ps") tandem_bubble+=("$(field bubble "$t")") torch_bubble+=("$(field bubble "$p")")
  echo "round $r: tandem $t"
  echo "round $r: pytorch $p"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mt=$(median "${tandem[@]}") mp=$(median "${torch[@]}")
bt=$(median "${tandem_bubble[@]}") bp=$(median "${torch_bubble[@]}")
awk -v t="$mt" -v p="$mp" -v bt="$bt" -v bp="$bp" -v s="$schedule" -v b="$backend" 'BEGIN {
  printf "median samples/s: tandem (%s, %s) %.1f (bubble %.3f), PyTorch (gpipe, Gloo) %.1f (bubble %.3f)\n", s, b, t, bt, p, bp
  printf "ratio: %.2fx (bar: >= 1.5x)\n", t / p }'
