#!/usr/bin/env bash
# The pipeline issue's exactness bar across processes for the models the CI test does not
# train (e2e.stage_pipeline trains the Fashion-MNIST CNN): ResNet18-32 and spam-bert as four
# `tandem stage` processes on loopback, every link mutual TLS, K = 4, 20 steps, compared with
# training in one process after the same steps:
# - gpipe, 1f1b and zero-bubble against `tandem train` with one cut (two stages in one process,
#   which the in-process tests hold equal to whole-model training);
# - async against `tandem train` with the same three cuts under async (its own semantics:
#   each step's backward on the weights its forward used, applied one step late);
# - gpipe with the labels at the first party (its second process holds the last stage) against
#   the same one-process run.
# Prints the largest difference of every run (tandem_weights_diff) and fails above 1e-5.
# Usage: bash bench/stage_exactness.sh [MODEL...]   MODEL: resnet18-32 | spam-bert (default both)
# (env STEPS, default 20; BATCH, default 16)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build/release
tandem=$build/tools/tandem cloud_bin=$build/cloud/tandem-cloud diff=$build/tests/tandem_weights_diff
for b in "$tandem" "$cloud_bin" "$diff"; do [[ -x $b ]] || { echo "missing $b: bash scripts/setup.sh release"; exit 1; }; done
steps=${STEPS:-20} batch=${BATCH:-16}
models=("$@")
((${#models[@]})) || models=(resnet18-32 spam-bert)
work=$(mktemp -d)
source "$root/tests/e2e/lib.sh"
trap 'stop_started; [[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
parties=(first second third fourth)
stage_identities "${parties[@]}" first-tail

# setup MODEL: sets model, data, cuts and one_cut for MODEL.
setup() {
  case $1 in
    resnet18-32)
      model=$root/samples/models/resnet18-32.json cuts=relu17,relu33,relu49 one_cut=relu33 data=$work/resnet-data
      [[ -d $data ]] || /usr/bin/python3 "$root/bench/random_dataset.py" "$model" "$data" $((batch * steps)) "$batch"
      ;;
    spam-bert)
      model=$root/samples/spam-bert/model.json data=$root/samples/spam-bert/data one_cut=bert.encoder.layer.1.output.LayerNorm
      cuts=bert.encoder.layer.0.output.LayerNorm,bert.encoder.layer.1.output.LayerNorm,bert.encoder.layer.2.output.LayerNorm
      [[ -f $data/train.safetensors ]] || fail "no $data/train.safetensors: bash samples/spam-bert/prepare.sh"
      ;;
    *) fail "unknown model '$1' (resnet18-32 or spam-bert)" ;;
  esac
}

# one NAME CUTS SCHEDULE: `tandem train` in one process, exported to $work/NAME.safetensors.
one() {
  local t0=$SECONDS
  "$tandem" train --model "$model" --data "$data" --limit $((batch * steps)) --test-limit 0 --epochs 1 \
    --cut "$2" --pipeline-schedule "$3" --batch "$batch" --microbatches 4 --edge-backend onednn \
    --cloud-backend onednn --export "$work/$1.safetensors" > "$work/$1.out" 2>&1 ||
    { tail -n 20 "$work/$1.out"; fail "$1: tandem train"; }
  echo "  one process, $3, cut $2: $((SECONDS - t0)) s"
}

# pipeline NAME SCHEDULE [EXTRA] [LAST PARTY]: four tandem stage processes (tandem stage --all)
# from a deployment file; their stages' exports merged into $work/NAME.safetensors.
pipeline() {
  local name=$1 ports i t0=$SECONDS names=("${parties[@]}")
  [[ -n ${4:-} ]] && names[3]=$4
  read -r -a ports <<< "$(free_ports 4)"
  {
    echo "model = \"$model\""
    echo "cut = \"$cuts\""
    echo "pipeline-schedule = \"$2\""
    echo "data = \"$data\""
    echo "batch = $batch"
    echo "microbatches = 4"
    echo "limit = $((batch * steps))"
    echo "test-limit = 0"
    echo "${3:-}"
    for i in 0 1 2 3; do
      echo "[${names[$i]}]"
      echo "address = \"127.0.0.1:${ports[$i]}\""
      echo "identity = \"id/${names[$i]}\""
      echo "backend = \"onednn\""
      echo "export = \"$name-$i.safetensors\""
    done
  } > "$work/$name.toml"
  "$tandem" stage --deployment "$work/$name.toml" --all --log-dir "$work/$name-logs" --wait-s 120 \
    > "$work/$name.out" 2>&1 || { tail -n 20 "$work/$name.out" "$work/$name-logs"/*; fail "$name: tandem stage --all"; }
  "$tandem" export --model "$model" --stages "$work/$name-0.safetensors,$work/$name-1.safetensors,$work/$name-2.safetensors,$work/$name-3.safetensors" \
    --out "$work/$name.safetensors" > "$work/$name-export.out" || { cat "$work/$name-export.out"; fail "$name: export --stages"; }
  echo "  four processes, $2${3:+ ($3)}: $((SECONDS - t0)) s"
}

# compare A B WHAT: the largest difference, which must be within 1e-5.
compare() {
  local out
  out=$("$diff" "$work/$1.safetensors" "$work/$2.safetensors" 1e-5) || { echo "$out"; fail "$3: the weights differ"; }
  echo "  $3: $out"
}

echo "stage exactness: $steps steps of $batch samples in 4 micro-batches, every stage on onednn, cuts at three layers"
for m in "${models[@]}"; do
  setup "$m"
  echo "== $m (cuts $cuts)"
  one "$m-one" "$one_cut" gpipe
  for schedule in gpipe 1f1b zero-bubble; do
    pipeline "$m-$schedule" "$schedule"
    compare "$m-one" "$m-$schedule" "$m, four parties under $schedule against one process"
  done
  one "$m-one-async" "$cuts" async
  pipeline "$m-async" async
  compare "$m-one-async" "$m-async" "$m, four parties under async against one process's four stages under async"
  pipeline "$m-first-party" gpipe 'labels = "first-party"' first-tail
  compare "$m-one" "$m-first-party" "$m, labels at the first party (first and last stage) against one process"
  # The four parties moved the weights: a run that trained nothing would pass the comparisons.
  if "$diff" "$work/$m-one.safetensors" "$work/$m-one-async.safetensors" 1e-5 > /dev/null; then
    fail "$m: async's weights equal gpipe's: nothing trained?"
  fi
done
echo "PASS: every run within 1e-5 of one process"
