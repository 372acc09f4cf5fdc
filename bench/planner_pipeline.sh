#!/usr/bin/env bash
# The pipeline partitioner against measurement: `tandem plan --nodes FILE --profile` measures
# the model here node by node and picks the cuts and K for the machines in FILE (default: two
# machines as fast as this one, a fast link between them: this machine's two cores, a thread
# a stage); then bench_pipeline measures the chosen cuts, and every other legal choice at the
# same K, on the same backend, a thread a stage. Prints the prediction's error and how far the
# chosen cuts are from the best measured (bars: within 15% and 10%). A failed run fails it.
# Usage: bash bench/planner_pipeline.sh [SPEC NODES BATCH K]
#   (default samples/models/resnet18-32.json, two machines, 32, 4; BACKEND, STEPS in the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-samples/models/resnet18-32.json}
nodes=${2:-}
batch=${3:-32} k=${4:-4}
backend=${BACKEND:-onednn} steps=${STEPS:-4}
bin=build/release
[[ -x $bin/bench/bench_pipeline && -x $bin/tools/tandem ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
if [[ -z $nodes ]]; then
  nodes=$work/nodes.toml
  printf '[first]\nspeed = 1\nlink_mbps = 100000\n[second]\nspeed = 1\n' > "$nodes"
fi
"$bin/tools/tandem" plan --model "$spec" --nodes "$nodes" --profile --backend "$backend" --batch "$batch" \
  --microbatches "$k" --all > "$work/plan.txt" || fail "tandem plan failed"
chosen=$(sed -n 's/^recommended: cut=\([^ ]*\) .*/\1/p' "$work/plan.txt")
[[ -n $chosen ]] || fail "tandem plan recommended nothing"
measure() {
  local out
  out=$("$bin/bench/bench_pipeline" "$spec" --cuts "$1" --schedule 1f1b --backend "$backend" --batch "$batch" \
          --microbatches "$k" --steps "$steps" --warmup 1) || fail "bench_pipeline failed on cuts $1"
  sed -n 's/.*"median_step_s":\([0-9.]*\).*/\1/p' <<< "$out"
}
echo "cuts predicted_step_s measured_step_s"
best_cuts="" best=""
while read -r cuts predicted; do
  measured=$(measure "$cuts")
  echo "$cuts $predicted $measured"
  if [[ -z $best ]] || awk -v a="$measured" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$measured best_cuts=$cuts; fi
  [[ $cuts == "$chosen" ]] && chosen_predicted=$predicted chosen_measured=$measured
done < <(sed -n "s/^{\"candidate\":\"\([^\"]*\)\",\"microbatches\":$k,\"predicted_step_s\":\([0-9.]*\),\"fits\":true}/\1 \2/p" "$work/plan.txt")
[[ -n ${chosen_measured:-} ]] || fail "the chosen cuts $chosen were not among the candidates measured"
awk -v c="$chosen" -v p="$chosen_predicted" -v m="$chosen_measured" -v bc="$best_cuts" -v b="$best" 'BEGIN {
  printf "chosen %s: predicted %.4f s, measured %.4f s: prediction off by %.1f%% (bar: within 15%%)\n", c, p, m, 100 * (p - m) / m
  printf "best measured %s: %.4f s; the chosen cuts are %.1f%% slower (bar: within 10%%)\n", bc, b, 100 * (m - b) / b }'
