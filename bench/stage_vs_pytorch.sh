#!/usr/bin/env bash
# A pipeline across processes: four `tandem stage` processes on loopback (one stage each, the
# links mutual TLS, one kernel thread each, SCHEDULE default 1f1b) against PyTorch's four
# processes joined by torch.distributed's Gloo send and receive (bench/pytorch_pipeline.py,
# GPipe order, one thread each): the same spec, cuts, batch and micro-batches, random
# images. tandem trains two epochs of BATCH * STEPS samples and the second epoch's samples/s
# counts (the first warms up); PyTorch times STEPS steps after 2 warm-up steps. The two
# alternate for ROUNDS rounds (default 3); prints each round, the medians and the ratio. A
# failed run of either side fails the script.
# Usage: bash bench/stage_vs_pytorch.sh [SPEC CUTS BATCH K STEPS]
#   (default samples/models/resnet18-32.json relu17,relu33,relu49 64 4 8; BACKEND, SCHEDULE,
#   ROUNDS in the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-samples/models/resnet18-32.json}
cuts=${2:-relu17,relu33,relu49}
batch=${3:-64} k=${4:-4} steps=${5:-8}
rounds=${ROUNDS:-3} backend=${BACKEND:-onednn} schedule=${SCHEDULE:-1f1b}
tandem=$PWD/build/release/tools/tandem cloud_bin=$PWD/build/release/cloud/tandem-cloud
[[ -x $tandem && -x $cloud_bin ]] || bash scripts/setup.sh release > /dev/null
/usr/bin/python3 -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null || {
  echo "needs Debian's python3-torch with Gloo: apt-get install python3-torch"; exit 1; }
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p" <<< "$2"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
parties=(first second third fourth)
port=$((29500 + RANDOM % 400))

# Random images and labels in the spec's input shape (train and a one-batch test set).
/usr/bin/python3 bench/random_dataset.py "$spec" "$work/data" $((batch * steps)) "$batch"
source tests/e2e/lib.sh
stage_identities "${parties[@]}"

echo "spec $spec, cuts $cuts, batch $batch, K $k, $steps timed steps a run, $schedule, $backend, $rounds rounds"
tandem_sps=() torch_sps=() torch_bubble=()
for ((r = 1; r <= rounds; r++)); do
  read -r -a ports <<< "$(free_ports 4)"
  {
    echo "model = \"$PWD/$spec\""
    echo "cut = \"$cuts\""
    echo "pipeline-schedule = \"$schedule\""
    echo "batch = $batch"
    echo "microbatches = $k"
    echo "epochs = 2"
    echo "data = \"$work/data\""
    echo "momentum = 0.9"
    for i in 0 1 2 3; do
      echo "[${parties[$i]}]"
      echo "address = \"127.0.0.1:${ports[$i]}\""
      echo "identity = \"id/${parties[$i]}\""
      echo "backend = \"$backend\""
      echo "threads = 1"
    done
  } > "$work/run.toml"
  rm -rf "$work/logs"
  OMP_NUM_THREADS=1 "$tandem" stage --deployment "$work/run.toml" --all --log-dir "$work/logs" --wait-s 60 \
    > "$work/all.out" 2>&1 || { cat "$work/all.out" "$work"/logs/*; fail "tandem's pipeline failed in round $r"; }
  t=$(grep '"epoch":2,' "$work/logs/first.log") || fail "round $r: no second epoch: $(cat "$work/logs/first.log")"
  p=$(OMP_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_pipeline.py "$spec" "$cuts" "$batch" "$k" "$steps" 2 $((port + r))) ||
    fail "PyTorch's pipeline failed in round $r"
  ts=$(sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p' <<< "$t") ps=$(field samples_per_s "$p")
  [[ -n $ts && -n $ps ]] || fail "round $r printed no samples/s: tandem '$t', PyTorch '$p'"
  tandem_sps+=("$ts") torch_sps+=("$ps") torch_bubble+=("$(field bubble "$p")")
  echo "round $r: tandem $t"
  echo "round $r: pytorch $p"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mt=$(median "${tandem_sps[@]}") mp=$(median "${torch_sps[@]}") bp=$(median "${torch_bubble[@]}")
awk -v t="$mt" -v p="$mp" -v bp="$bp" -v s="$schedule" -v b="$backend" 'BEGIN {
  printf "median samples/s: tandem stage x4 (%s, %s, mutual TLS) %.1f, PyTorch x4 (gpipe, Gloo) %.1f (bubble %.3f)\n", s, b, t, p, bp
  printf "ratio: %.2fx\n", t / p }'
