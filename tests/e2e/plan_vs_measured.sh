#!/usr/bin/env bash
# The planner's predictions against measured runs, both pipelines (sync, async): `tandem plan` for the sample's default cut
# and K=4 on a 50 Mbit/s uplink (200 Mbit/s downlink), then real tandem-cloud and tandem-edge
# processes over TLS through a link shaped that way (scripts/lib/shaped_link.sh). The measured
# samples/s must be within 25% of the predicted. Skips (exit 77, with the reason) where this
# machine cannot make network namespaces or shape with tc (with CI=true it fails instead).
# Usage: plan_vs_measured.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge
model=$src/samples/fashion-mnist/model.json
source "$src/scripts/lib/shaped_link.sh"
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2> /dev/null; wait 2> /dev/null; shaped_link_down; rm -rf "$work"; }
trap cleanup EXIT
source "$src/tests/lib/skip.sh"
shaped_link_up 2> "$work/why" || skip_or_fail "$(cat "$work/why")"
shaped_link_rates 50 200

"$cloud_bin" pki init --state-dir "$work/state" --hosts "$shaped_cloud_ip" > /dev/null
"$cloud_bin" pki issue --state-dir "$work/state" --client planner-test --out "$work/id" > /dev/null
in_cloud_ns "$cloud_bin" serve --listen "$shaped_cloud_ip:0" --state-dir "$work/state" --model "$model" \
  > "$work/cloud.log" 2>&1 &
cloud_pid=$!
for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
port=$(grep -o "wss://$shaped_cloud_ip:[0-9]*" "$work/cloud.log" | cut -d: -f3)
[[ -n $port ]] || { echo "FAIL: the cloud did not start"; cat "$work/cloud.log"; exit 1; }
# The cloud must answer inside its namespace; if it does but not across the veth pair, this
# machine's own network (a firewall) stands between them, not tandem.
reachable() { timeout 3 bash -c "exec 3<> /dev/tcp/$shaped_cloud_ip/$port" 2> /dev/null; }
in_cloud_ns bash -c "$(declare -f reachable); shaped_cloud_ip=$shaped_cloud_ip port=$port; reachable" ||
  { echo "FAIL: the cloud does not answer on $shaped_cloud_ip:$port inside its namespace"; cat "$work/cloud.log"; exit 1; }
if ! reachable; then
  skip_or_fail "this machine does not pass TCP from $shaped_edge_ip to $shaped_cloud_ip over a veth pair \
(route: $(ip -4 route get "$shaped_cloud_ip" 2> /dev/null | head -1))"
fi

status=0
for pipeline in sync async; do
  "$build/tools/tandem" plan --model "$model" --cut pool2 --microbatches 4 --uplink-mbps 50 \
    --downlink-mbps 200 --pipeline "$pipeline" > "$work/plan.out" 2> /dev/null || true
  predicted=$(grep -o 'predicted_samples_per_s=[0-9.]*' "$work/plan.out" | cut -d= -f2)
  [[ -n $predicted ]] || { echo "FAIL: tandem plan printed no recommendation"; exit 1; }
  rm -f "$work/m.jsonl"
  "$edge_bin" train --cloud "wss://$shaped_cloud_ip:$port" --identity "$work/id" --model "$model" --limit 1280 \
    --test-limit 100 --batch 64 --microbatches 4 --pipeline "$pipeline" --metrics-json "$work/m.jsonl" \
    > "$work/edge.out" 2>&1 || { echo "FAIL: the edge did not train"; cat "$work/edge.out"; exit 1; }
  measured=$(grep -o '"samples_per_s":[0-9.]*' "$work/m.jsonl" | cut -d: -f2)
  # The step's shape beside the prediction (reported, not judged: one short run is noisy).
  plan_field() { grep '"microbatches":4' "$work/plan.out" | grep -o "\"$1\":[0-9.]*" | cut -d: -f2; }
  run_field() { grep -o "\"$1\":[0-9.]*" "$work/m.jsonl" | tail -1 | cut -d: -f2; }
  echo "$pipeline: time to the first gradient: predicted $(plan_field predicted_first_grad_ms) ms, measured" \
    "$(run_field first_grad_ms) ms; edge idle: predicted $(plan_field predicted_edge_idle_fraction), measured" \
    "$(run_field edge_idle_fraction)"
  awk -v p="$predicted" -v m="$measured" -v what="$pipeline" 'BEGIN {
    r = m / p; printf "%s: predicted %.1f samples/s, measured %.1f: %.3f of the prediction (must be 0.75..1.25)\n", what, p, m, r
    exit (r >= 0.75 && r <= 1.25) ? 0 : 1 }' || status=1
done
exit $status
