#!/usr/bin/env bash
# Load over a replica set: N edges (default 64, real tandem-edge processes over mutual TLS on
# loopback) federated over 3 cloud replicas (tandem-cloud serve --replica-set, --batch-edges),
# each edge given every replica's address. Once the set has closed round 2, one replica is
# killed with -9; once its edges have found room on the two others, it is started again and
# rejoins. No edge may stall: every one ends its run (exit 0), the killed replica's resuming
# from their last checkpoint; the replicas' memory stays bounded (each one's peak RSS is
# printed and checked against a budget), and the three end on the same round checkpoint.
# Usage: replicas_load.sh BUILD_DIR SOURCE_DIR [EDGES]
set -euo pipefail
build=$1 src=$2 edges=${3:-64}
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge diff=$build/tests/tandem_weights_diff
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
pids=() clouds=()
cleanup() { kill -9 "${clouds[@]}" "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/r*.log; do [[ -f $f ]] && { echo "--- $f"; tail -12 "$f"; }; done
  exit 1
}
source "$src/tests/e2e/lib.sh"

"$cloud_bin" pki init --state-dir "$work/ca" > /dev/null
for i in $(seq 0 $((edges - 1))); do
  "$cloud_bin" pki issue --state-dir "$work/ca" --client "e$i" --out "$work/id/$i" > /dev/null
done
read -r -a ports <<< "$(free_ports 3)"
share=$(((edges + 2) / 3))
# Each edge: 960 samples (30 steps of 32), fronts averaged every 4 steps; a replica serves its
# share of the edges (a third; half, with one replica down).
run=(--aggregate-every 4 --round-deadline-s 300 --batch-edges --batch-gather-ms 2000 --lr 0.01 --momentum 0
     --min-edges $((edges / 3)) --back-accumulate "$share" --replica-set "$work/set" --replicas 3 --replica-timeout-s 120
     --max-connections $((edges + 16)))
replica() {
  local r=$1
  replica_state "$work/ca" "$work/r$r"
  "$cloud_bin" serve --listen "127.0.0.1:${ports[$r]}" --state-dir "$work/r$r" --model "$model" "${run[@]}" \
    --replica-id "r$r" >> "$work/r$r.log" 2>&1 &
  clouds[$r]=$!
}
ready() {
  for _ in $(seq 1 600); do (($(grep -c 'listening on' "$work/r$1.log" || true) >= $2)) && return 0; sleep 0.1; done
  fail "replica r$1 did not start"
}
for r in 0 1 2; do replica "$r"; done
for r in 0 1 2; do ready "$r" 1; done
start=$(date +%s)
for i in $(seq 0 $((edges - 1))); do
  first=$((i % 3)) list=""
  for k in 0 1 2; do list+="${list:+,}wss://localhost:${ports[$(((first + k) % 3))]}"; done
  "$edge_bin" train --cloud "$list" --identity "$work/id/$i" --model "$model" --limit 960 --epochs 1 \
    --test-limit 64 --seed "$i" --batch 32 --lr 0.01 --momentum 0 --checkpoint-dir "$work/c$i" \
    --checkpoint-every 4 --connect-retries 30 > "$work/e$i.out" 2>&1 &
  pids[$i]=$!
done

for _ in $(seq 1 3000); do grep -q '^round 2:' "$work/r2.log" && break; sleep 0.1; done
grep -q '^round 2:' "$work/r2.log" || fail "r2 never closed round 2"
rss_r2=$(awk '/VmHWM/ { print $2 }' "/proc/${clouds[2]}/status")
victims=$(grep -o "edge 'e[0-9]*' connected" "$work/r2.log" | cut -d"'" -f2 | sort -u)
# (an edge says "joined at round" on each connection after round 1: count the later ones)
declare -A joins_before
for v in $victims; do joins_before[$v]=$(grep -c 'joined at round' "$work/$v.out" || true); done
kill -9 "${clouds[2]}"
wait "${clouds[2]}" 2>/dev/null || true
killed=$(date +%s)
echo "killed r2 after round 2, $((killed - start)) s into the run"
# Its edges find room on r0 and r1 (they say "joined at round" when taken); then r2 again.
for _ in $(seq 1 1200); do
  left=0
  for v in $victims; do (($(grep -c 'joined at round' "$work/$v.out" || true) > joins_before[$v])) || left=$((left + 1)); done
  ((left == 0)) && break
  sleep 0.1
done
((left == 0)) || fail "$left of r2's edges found no room on r0 and r1 within 120 s"
echo "r2's $(wc -w <<< "$victims") edges resumed on r0 and r1 within $(($(date +%s) - killed)) s of the kill"
replica 2
ready 2 2

for i in $(seq 0 $((edges - 1))); do
  wait "${pids[$i]}" || fail "edge $i stalled or failed: $(tail -3 "$work/e$i.out")"
done
took=$(($(date +%s) - start))
rounds=$(grep -c '^round ' "$work/r0.log")
echo "all $edges edges ended their runs in $took s (r0 closed $rounds rounds)"
budget_kb=$((2 * 1024 * 1024))
for r in 0 1 2; do
  rss=$(awk '/VmHWM/ { print $2 }' "/proc/${clouds[$r]}/status")
  echo "r$r: peak RSS $((rss / 1024)) MiB (budget $((budget_kb / 1024)) MiB)"
  ((rss < budget_kb)) || fail "r$r's peak RSS is $((rss / 1024)) MiB"
done
echo "r2 before the kill: peak RSS $((rss_r2 / 1024)) MiB"
sleep 1
newest() { ls "$1"/back-*.tdmc 2>/dev/null | sed 's/.*back-0*\([0-9]*\)\.tdmc/\1/' | sort -n | tail -1; }
round=$(newest "$work/r0/federation")
f=$(basename "$(ls "$work/r0/federation"/back-*"$round".tdmc)")
for r in 1 2; do
  "$diff" "$work/r0/federation/$f" "$work/r$r/federation/$f" 0 > /dev/null || fail "r0 and r$r differ at round $round"
done
echo "round $round: the three replicas hold the same shard"
for r in 0 1 2; do stop_cloud "${clouds[$r]}"; done
clouds=()
echo "PASS: $edges edges over 3 replicas, one killed and restarted"
