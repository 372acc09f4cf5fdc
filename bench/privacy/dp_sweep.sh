#!/usr/bin/env bash
# Noise on the cut, what it costs: the Fashion-MNIST sample trained through a local cloud over
# TLS (K=4, batch 64, same seed), cut at CUT, once without noise and once per SIGMA with
# --dp-clip C --dp-noise SIGMA. Prints each run's epsilon at delta 1e-5 over the whole run
# (tandem's own RDP accountant) and its final test accuracy beside the noiseless run's, with
# issue 18's bar: epsilon <= 8 and at most 3 points below no noise. DP_EVAL=clean evaluates
# on the test set's activations without noise (tandem-edge --dp-eval clean).
# Usage: [DP_EVAL=noised|clean] bash bench/privacy/dp_sweep.sh [EPOCHS] [CUT] [C] [SIGMA...]
#        (default 3 epochs, cut relu3 (128 values a sample), C 4, sigmas 0.5 0.7)
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-3} cut=${2:-relu3} clip=${3:-4}
shift $(( $# < 3 ? $# : 3 ))
sigmas=("$@")
((${#sigmas[@]})) || sigmas=(0.5 0.7)
bin=build/release
model=samples/fashion-mnist/model.json
[[ -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -5 "$work/cloud.log"; exit 1; }
cloud_bin=$bin/cloud/tandem-cloud
source tests/e2e/lib.sh
start_cloud_as cloud --cut any
"$cloud_bin" pki issue --state-dir "$work/state" --client bench --out "$work/id" > /dev/null

run() {  # run NAME EXTRA...: one training run, its metrics in $work/NAME.jsonl
  local name=$1; shift
  "$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$work/id" --model "$model" \
    --cut "$cut" --epochs "$epochs" --metrics-json "$work/$name.jsonl" "$@" > "$work/$name.out" 2>&1 ||
    fail "run $name: $(tail -3 "$work/$name.out")"
}
field() { tail -1 "$work/$1.jsonl" | grep -o "\"$2\":[0-9.a-z]*" | cut -d: -f2; }

run plain
for s in "${sigmas[@]}"; do run "sigma-$s" --dp-clip "$clip" --dp-noise "$s" --dp-eval "${DP_EVAL:-noised}"; done

base=$(field plain test_accuracy)
printf "%-14s %8s %10s %10s\n" run epsilon accuracy "vs plain"
awk -v a="$base" 'BEGIN { printf "%-14s %8s %9.2f%% %10s\n", "no noise", "-", 100 * a, "" }'
for s in "${sigmas[@]}"; do
  awk -v n="C $clip sigma $s" -v e="$(field "sigma-$s" dp_epsilon)" -v a="$(field "sigma-$s" test_accuracy)" -v b="$base" \
    'BEGIN { printf "%-14s %8.2f %9.2f%% %+10.2f\n", n, e, 100 * a, 100 * (a - b) }'
done
echo "cut $cut, $epochs epochs, evaluation ${DP_EVAL:-noised}; bar: epsilon <= 8 (delta 1e-5) within 3 points of no noise"
for s in "${sigmas[@]}"; do
  echo "{\"bench\":\"dp_sweep\",\"cut\":\"$cut\",\"epochs\":$epochs,\"clip\":$clip,\"eval\":\"${DP_EVAL:-noised}\",\"sigma\":$s,\"epsilon\":$(field "sigma-$s" dp_epsilon),\"test_accuracy\":$(field "sigma-$s" test_accuracy),\"plain_accuracy\":$base}"
done
