#!/usr/bin/env bash
# The planner's recommendation against trying every cut and micro-batch count for real: on a
# link shaped to UP Mbit/s up and DOWN down (scripts/lib/shaped_link.sh), `tandem plan` picks
# a cut and K; then every legal cut x K in {1,2,4,8,16} trains SAMPLES samples through a real
# cloud and edge over TLS. Prints the measured table, the best, the recommended, and the
# recommended's samples/s as a share of the best's (model-zoo issue's bar: within 10%).
# Needs root and iproute2. Usage: bash bench/planner.sh [UP] [DOWN] [SAMPLES]   (50 200 640)
set -euo pipefail
cd "$(dirname "$0")/.."
up=${1:-50} down=${2:-200} samples=${3:-640}
bin=build/release model=samples/fashion-mnist/model.json
[[ -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
source scripts/lib/shaped_link.sh
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2> /dev/null || true; wait 2> /dev/null || true; shaped_link_down; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
source tests/e2e/lib.sh  # stop_cloud, need_figures
shaped_link_up || exit 1
shaped_link_rates "$up" "$down"

"$bin/tools/tandem" plan --model "$model" --uplink-mbps "$up" --downlink-mbps "$down" > "$work/plan.txt" 2> /dev/null
recommended=$(grep '^recommended:' "$work/plan.txt")
echo "$recommended"
rec_cut=$(echo "$recommended" | sed 's/.*cut=\([^ ]*\).*/\1/') rec_k=$(echo "$recommended" | sed 's/.*microbatches=\([0-9]*\).*/\1/')
cuts=$(grep -o '"cut":"[^"]*"' "$work/plan.txt" | cut -d'"' -f4 | uniq)

"$bin/cloud/tandem-cloud" pki init --state-dir "$work/state" --hosts "$shaped_cloud_ip" > /dev/null
"$bin/cloud/tandem-cloud" pki issue --state-dir "$work/state" --client bench --out "$work/id" > /dev/null
printf "%-10s %3s %12s %12s\n" cut K measured predicted
: > "$work/measured"
for cut in $cuts; do
  in_cloud_ns "$bin/cloud/tandem-cloud" serve --listen "$shaped_cloud_ip:0" --state-dir "$work/state" --model "$model" \
    --cut "$cut" --microbatches 16 > "$work/cloud.log" 2>&1 &
  cloud=$!
  for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
  port=$(grep -o "wss://$shaped_cloud_ip:[0-9]*" "$work/cloud.log" | cut -d: -f3)
  for k in 1 2 4 8 16; do
    rm -f "$work/m.jsonl"
    "$bin/edge/tandem-edge" train --cloud "wss://$shaped_cloud_ip:$port" --identity "$work/id" --model "$model" \
      --cut "$cut" --limit "$samples" --test-limit 100 --batch 64 --microbatches "$k" --metrics-json "$work/m.jsonl" \
      > "$work/edge.log" 2>&1 || fail "the edge at cut $cut, K=$k: $(tail -3 "$work/edge.log")"
    m=$(grep -o '"samples_per_s":[0-9.]*' "$work/m.jsonl" | cut -d: -f2)
    need_figures "cut $cut, K=$k" "$m"
    p=$(grep "\"cut\":\"$cut\",\"microbatches\":$k," "$work/plan.txt" | grep -o '"predicted_samples_per_s":[0-9.]*' | cut -d: -f2)
    printf "%-10s %3d %12.1f %12.1f\n" "$cut" "$k" "$m" "$p"
    echo "$cut $k $m" >> "$work/measured"
  done
  # `cloud` is the subshell running in_cloud_ns; the cloud is its child (ip netns exec execs
  # it): SIGTERM to the cloud, and the subshell's status is the cloud's.
  kill "$(pgrep -P "$cloud" | head -1)" 2> /dev/null || true
  rc=0
  wait "$cloud" || rc=$?
  ((rc == 0)) || fail "the cloud at cut $cut exited with status $rc when stopped"
done
best=$(sort -k3 -g -r "$work/measured" | head -1)
rec=$(awk -v c="$rec_cut" -v k="$rec_k" '$1 == c && $2 == k' "$work/measured")
echo "best measured: $best"
echo "recommended, measured: $rec"
awk -v b="$(echo "$best" | cut -d' ' -f3)" -v r="$(echo "$rec" | cut -d' ' -f3)" \
  'BEGIN { printf "recommended / best: %.3f (bar: >= 0.90)\n", r / b }'
