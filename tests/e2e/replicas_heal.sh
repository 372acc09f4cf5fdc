#!/usr/bin/env bash
# A replica set that heals (tandem-cloud serve --replica-set), real processes over TLS and
# Gloo on loopback: three replicas serve six edges, two each (each edge given every replica's
# address, its own first; checkpoints every round). Once replica r2 has closed round 2 it is
# killed with -9:
#  - the two others go on within 10 s: a new epoch of 2 members, and their next round closes;
#  - r2's two edges find room on them (the set's 6 edges over 2 live replicas: 3 each),
#    resume from their last checkpoint, a round's boundary, and join at the set's next round;
#  - r2, started again on its port and folder, joins the set (an epoch of 3 again), copies
#    the shard, optimizer and round, and takes part idle: it holds no edge;
#  - every edge ends its run (exit 0, all its steps), and r0, r1 and the restarted r2 hold the
#    same round checkpoint, bit for bit.
# Usage: replicas_heal.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge diff=$build/tests/tandem_weights_diff
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
pids=() clouds=()
cleanup() { kill -9 "${clouds[@]}" "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log "$work"/*.out; do [[ -f $f ]] && { echo "--- $f"; tail -12 "$f"; }; done
  [[ -z ${KEEP:-} ]] || cp -r "$work" "$KEEP"
  exit 1
}
source "$src/tests/e2e/lib.sh"

"$cloud_bin" pki init --state-dir "$work/ca" > /dev/null
for i in 0 1 2 3 4 5; do "$cloud_bin" pki issue --state-dir "$work/ca" --client "h$i" --out "$work/h$i" > /dev/null; done
read -r -a ports <<< "$(free_ports 3)"
# Each edge 9600 samples (300 steps of 32), fronts averaged every 4 steps (75 rounds).
run=(--aggregate-every 4 --round-deadline-s 120 --batch-edges --batch-gather-ms 5000 --lr 0.01 --momentum 0
     --min-edges 2 --back-accumulate 2 --replica-set "$work/set" --replicas 3 --replica-timeout-s 20)
replica() {  # replica R: replica R on its port and folder, in the background (appends to its log)
  local r=$1
  replica_state "$work/ca" "$work/r$r"
  "$cloud_bin" serve --listen "127.0.0.1:${ports[$r]}" --state-dir "$work/r$r" --model "$model" "${run[@]}" \
    --replica-id "r$r" --metrics-listen 127.0.0.1:0 >> "$work/r$r.log" 2>&1 &
  clouds[$r]=$!
}
ready() {  # ready R N: replica R has said "listening" N times
  for _ in $(seq 1 300); do (($(grep -c 'listening on' "$work/r$1.log" || true) >= $2)) && return 0; sleep 0.1; done
  fail "replica r$1 did not start"
}
metrics_of() { metrics_port=$(grep -o 'http://127.0.0.1:[0-9]*/metrics' "$work/r$1.log" | tail -1 | cut -d: -f3 | cut -d/ -f1); }
edge() {  # edge I: edge I of 6, its replica's address first, then the others'
  local i=$1 first=$(($1 / 2)) list="" k
  for k in 0 1 2; do list+="${list:+,}wss://localhost:${ports[$(((first + k) % 3))]}"; done
  "$edge_bin" train --cloud "$list" --identity "$work/h$i" --model "$model" --shard "$i/6" --split iid \
    --limit 57600 --test-limit 200 --batch 32 --lr 0.01 --momentum 0 --checkpoint-dir "$work/c$i" \
    --checkpoint-every 4 > "$work/h$i.out" 2>&1 &
  pids[$i]=$!
}
for r in 0 1 2; do replica "$r"; done
for r in 0 1 2; do ready "$r" 1; done
for i in 0 1 2 3 4 5; do edge "$i"; done

# Round 2 closed on r2: kill it.
for _ in $(seq 1 600); do grep -q '^round 2:' "$work/r2.log" && break; sleep 0.05; done
grep -q '^round 2:' "$work/r2.log" || fail "r2 never closed round 2"
joins() { grep -c 'joined at round' "$work/h$1.out" || true; }
joins4=$(joins 4) joins5=$(joins 5)  # (an edge says so on each connection after round 1: count the later ones)
kill -9 "${clouds[2]}"
wait "${clouds[2]}" 2>/dev/null || true
killed_at=$(date +%s.%N)
rounds_before=$(grep -c '^round ' "$work/r0.log")
echo "killed r2 after round 2 (r0 had closed $rounds_before rounds)"

# The others go on: a new epoch of two, and a round closes after the kill.
metrics_of 0
epoch_s="" round_s=""
for _ in $(seq 1 300); do
  now=$(date +%s.%N)
  if [[ -z $epoch_s ]] && scrape /metrics | grep -qx "tandem_replica_members 2"; then
    epoch_s=$(awk -v a="$killed_at" -v b="$now" 'BEGIN { printf "%.2f", b - a }')
  fi
  if [[ -z $round_s ]] && (($(grep -c '^round ' "$work/r0.log") > rounds_before)); then
    round_s=$(awk -v a="$killed_at" -v b="$now" 'BEGIN { printf "%.2f", b - a }')
  fi
  [[ -n $epoch_s && -n $round_s ]] && break
  sleep 0.05
done
[[ -n $epoch_s ]] || fail "r0 never formed an epoch of 2 after the kill: $(scrape /metrics | grep tandem_replica_)"
[[ -n $round_s ]] || fail "r0 closed no round in 15 s after the kill"
echo "after the kill: r0 in an epoch of 2 members after ${epoch_s} s, its next round closed after ${round_s} s"
awk -v s="$round_s" 'BEGIN { exit !(s <= 10) }' || fail "the survivors took ${round_s} s to go on (want at most 10)"

# r2's edges find room on r0 and r1 (3 each, over 2 live replicas) while their edges train.
for _ in $(seq 1 1200); do
  (($(joins 4) > joins4 && $(joins 5) > joins5)) && break
  sleep 0.05
done
for i in 4 5; do
  joined=$(grep -o 'joined at round [0-9]*' "$work/h$i.out" | tail -1 | grep -o '[0-9]*$' || true)
  (($(joins "$i") > $([[ $i == 4 ]] && echo "$joins4" || echo "$joins5"))) && [[ -n $joined ]] ||
    fail "edge $i was not taken by r0 or r1 within 60 s of the kill"
  ((joined < 74)) || fail "edge $i joined at round $joined, after the other edges' runs (75 rounds)"
  echo "edge $i: joined the set at round $joined on $(grep -l "edge 'h$i' connected" "$work"/r[01].log | xargs -n1 basename | tr '\n' ' ')"
done

# r2 again, on its port and folder: it joins the set.
replica 2
ready 2 2
for _ in $(seq 1 600); do (($(grep -c ' in epoch ' "$work/r2.log") >= 2)) && break; sleep 0.05; done
grep "tandem-cloud: replica . of 3 in epoch" "$work/r2.log" | tail -1 | grep -q "epoch [3-9]" ||
  fail "the restarted r2 did not join an epoch of 3: $(grep 'in epoch' "$work/r2.log")"
echo "r2 again: $(grep 'in epoch' "$work/r2.log" | tail -1)"

for i in 0 1 2 3 4 5; do wait "${pids[$i]}" || fail "edge $i: $(tail -3 "$work/h$i.out")"; done
for i in 0 1 2 3 4 5; do
  grep -q "final test accuracy" "$work/h$i.out" || fail "edge $i reported no final accuracy"
done
# r2's edges moved: each reconnected to another replica and resumed from a round's boundary.
for i in 4 5; do
  grep -q "trying the cloud's next address" "$work/h$i.out" || fail "edge $i did not move to another replica"
  resumed=$(grep -o 'resuming from the checkpoint of step [0-9]*' "$work/h$i.out" | tail -1 | grep -o '[0-9]*$' || true)
  [[ -n $resumed ]] || fail "edge $i did not resume from a checkpoint"
  ((resumed % 4 == 0 && resumed >= 8)) || fail "edge $i resumed from step $resumed (want a round's boundary, 8 or later)"
  echo "edge $i: resumed from step $resumed, ended at round $(grep -o '"round":[0-9]*' "$work/h$i.out" | tail -1 | cut -d: -f2)"
done
echo "the other edges ended at round $(grep -o '"round":[0-9]*' "$work/h0.out" | tail -1 | cut -d: -f2)"
# Every edge's 300 steps were trained, on one replica or, for r2's, on two.
for i in 0 1 2 3; do
  grep -q "(h$i), cut 'pool2': 300 steps, 9600 samples" "$work/r$((i / 2)).log" || fail "edge $i's 300 steps are not in r$((i / 2))'s log"
done

# The set's state: r0, r1 and the restarted r2 hold the same newest round, bit for bit.
sleep 1
newest_round() { ls "$1"/back-*.tdmc 2>/dev/null | sed 's/.*back-0*\([0-9]*\)\.tdmc/\1/' | sort -n | tail -1; }
round=$(newest_round "$work/r0/federation")
[[ -n $round ]] || fail "r0 kept no round"
f=$(printf 'back-%06d.tdmc' "$round")
[[ -f $work/r0/federation/$f ]] || f=$(basename "$(ls "$work/r0/federation"/back-*"$round".tdmc)")
for r in 1 2; do
  [[ -f $work/r$r/federation/$f ]] || fail "r$r kept no round $round: $(ls "$work/r$r/federation")"
  "$diff" "$work/r0/federation/$f" "$work/r$r/federation/$f" 0 || fail "r0 and r$r hold different back shards at round $round"
  "$diff" "$work/r0/federation/${f/back-/front-}" "$work/r$r/federation/${f/back-/front-}" 0 ||
    fail "r0 and r$r hold different averages at round $round"
done
echo "round $round: r0, r1 and the restarted r2 hold the same shard and average"
metrics_of 2
scraped=$(scrape /metrics)
grep -qx "tandem_replica_members 3" <<< "$scraped" || fail "r2's /metrics: $(grep tandem_replica_ <<< "$scraped")"

for r in 0 1 2; do stop_cloud "${clouds[$r]}"; done
clouds=()
[[ -z ${KEEP:-} ]] || cp -r "$work" "$KEEP"
echo "PASS"
