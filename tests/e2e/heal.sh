#!/usr/bin/env bash
# Runs that heal themselves, with real processes over TLS: one edge command trains while its
# cloud is killed (SIGKILL) RESTARTS times and started again on the same port 2 s later; the
# edge reconnects by itself (jittered backoff) and resumes from the newest checkpoint both
# sides hold, exits 0, counts its reconnects in its metrics, and its final weights equal an
# uninterrupted run's byte for byte. Then, where network namespaces can be made, the link
# between the edge and a cloud in its own namespace goes down for LINK_DOWN_S seconds (the
# veth pair down, then up) mid-run: the run finishes. --reconnects 0 ends at the first drop.
# Usage: heal.sh BUILD_DIR SOURCE_DIR [RESTARTS] [SAMPLES] [LINK_DOWN_S]
set -euo pipefail
build=$1 src=$2 restarts=${3:-5} samples=${4:-3200} link_down_s=${5:-20}
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
source "$src/scripts/lib/shaped_link.sh"
source "$src/tests/e2e/lib.sh"
source "$src/tests/lib/skip.sh"
cleanup() { stop_started; shaped_link_down; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; tail -20 "$work/cloud.log"; echo "--- edge log"; tail -20 "$work/edge.out"; exit 1; }
RANDOM=${TANDEM_TEST_SEED:-$$}

starts=0
start_cloud() {  # start_cloud [PORT [ARGS...]]: on 127.0.0.1 (port 0 the first time), output appended to cloud.log
  starts=$((starts + 1))
  local at=${1:-0}
  shift || true
  "$cloud_bin" serve --listen "127.0.0.1:$at" --state-dir "$work/state" --model "$model" "$@" >> "$work/cloud.log" 2>&1 &
  cloud_pid=$!
  for _ in $(seq 1 100); do
    [[ $(grep -c 'listening on' "$work/cloud.log") -ge $starts ]] && break
    kill -0 "$cloud_pid" 2> /dev/null || fail "the cloud did not start"
    sleep 0.1
  done
  port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/cloud.log" | tail -1 | cut -d: -f3)
}
start_cloud
for client in straight healed once; do
  "$cloud_bin" pki issue --state-dir "$work/state" --client "$client" --out "$work/id-$client" > /dev/null
done
edge_args=(train --model "$model" --epochs 1 --limit "$samples" --test-limit 200 --batch 32 --microbatches 4
           --checkpoint-every 1 --seed 3)
final=$(printf %012d $(((samples + 31) / 32)))

"$edge_bin" "${edge_args[@]}" --cloud "wss://localhost:$port" --identity "$work/id-straight" \
  --checkpoint-dir "$work/ckpt-straight" > "$work/straight.out" 2>&1 || fail "the uninterrupted run: $(tail -3 "$work/straight.out")"

# The healed run: one edge command, its cloud killed and restarted RESTARTS times, each kill
# after a checkpoint newer than the last restart's and 0 to 0.49 s more.
"$edge_bin" "${edge_args[@]}" --cloud "wss://localhost:$port" --identity "$work/id-healed" \
  --checkpoint-dir "$work/ckpt-healed" --metrics-json "$work/healed.jsonl" > "$work/edge.out" 2>&1 &
edge_pid=$!
for r in $(seq 1 "$restarts"); do
  before=$(ls "$work/ckpt-healed" 2> /dev/null | tail -1 || true)
  while kill -0 "$edge_pid" 2> /dev/null && [[ $(ls "$work/ckpt-healed" 2> /dev/null | tail -1) == "$before" ]]; do
    sleep 0.02
  done
  sleep "0.$((RANDOM % 5))$((RANDOM % 10))"
  kill -0 "$edge_pid" 2> /dev/null || fail "the run ended after $((r - 1)) restarts, before $restarts (use more SAMPLES)"
  kill -9 "$cloud_pid"
  wait "$cloud_pid" 2> /dev/null || true  # killed on purpose
  echo "killed the cloud ($r), at $(ls "$work/state/checkpoints/healed" | tail -1)"
  sleep 2
  start_cloud "$port"
done
wait "$edge_pid" || fail "the edge did not finish on its own after $restarts cloud restarts"
stop_cloud
reconnects=$(tail -1 "$work/healed.jsonl" | grep -o '"reconnects":[0-9]*' | cut -d: -f2)
redone=$(tail -1 "$work/healed.jsonl" | grep -o '"steps_redone":[0-9]*' | cut -d: -f2)
[[ $reconnects == "$restarts" ]] || fail "the metrics count $reconnects reconnects, not $restarts"
[[ $(grep -c "reconnecting in [0-9.]* s (attempt 1 of 10)" "$work/edge.out") -ge $restarts ]] ||
  fail "the edge did not say it was reconnecting: $(grep -c reconnecting "$work/edge.out") times"
grep -E "^reconnection [0-9]+:|^resuming from" "$work/edge.out" || true
echo "the edge finished by itself: $reconnects reconnects, $redone steps trained again"
same_final_weights straight healed "$final"
echo "final weights equal the uninterrupted run's, byte for byte"

# --reconnects 0: the first drop ends the run, in the link's words and the option's.
start_cloud "$port"
"$edge_bin" "${edge_args[@]}" --cloud "wss://localhost:$port" --identity "$work/id-once" --reconnects 0 \
  --checkpoint-dir "$work/ckpt-once" > "$work/once.out" 2>&1 &
edge_pid=$!
while kill -0 "$edge_pid" 2> /dev/null && [[ -z $(ls "$work/ckpt-once" 2> /dev/null) ]]; do sleep 0.02; done
kill -9 "$cloud_pid"
wait "$cloud_pid" 2> /dev/null || true  # killed on purpose
if wait "$edge_pid"; then fail "--reconnects 0: the run went on without its cloud"; fi
grep -q "the cloud closed the connection while this edge waited for .* (--reconnects 0: no reconnection)" "$work/once.out" ||
  fail "--reconnects 0: $(tail -3 "$work/once.out")"
echo "--reconnects 0: the first drop ends the run, saying so"

# An edge with an enrolment token (spent at its Hello) reconnects with the fresh one the
# cloud's Welcome gave it: the cloud restarted once mid-run, the run finishes.
start_cloud "$port" --accept-tokens
mkdir -p "$work/id-token" && cp "$work/id-once/ca.crt" "$work/id-token/"
token=$("$cloud_bin" pki token --state-dir "$work/state" --client ward-1 --ttl 10m)
"$edge_bin" "${edge_args[@]}" --cloud "wss://localhost:$port" --identity "$work/id-token" --token "$token" \
  --client-id ward-1 --checkpoint-dir "$work/ckpt-token" > "$work/token.out" 2>&1 &
edge_pid=$!
while kill -0 "$edge_pid" 2> /dev/null && [[ -z $(ls "$work/ckpt-token" 2> /dev/null) ]]; do sleep 0.02; done
kill -9 "$cloud_pid"
wait "$cloud_pid" 2> /dev/null || true  # killed on purpose
sleep 1
start_cloud "$port" --accept-tokens
wait "$edge_pid" || fail "the token edge did not finish after a restart: $(tail -5 "$work/token.out")"
grep -q "reconnection 1:" "$work/token.out" || fail "the token edge did not reconnect: $(tail -5 "$work/token.out")"
stop_cloud
echo "a token edge reconnected with the token its Welcome gave"

# The link down for LINK_DOWN_S seconds: a cloud in its own namespace behind a veth pair.
if ((link_down_s > 0)); then
  shaped_link_up 2> "$work/why" || skip_or_fail "$(cat "$work/why")"
  "$cloud_bin" pki init --state-dir "$work/ns-state" --hosts "$shaped_cloud_ip" > /dev/null
  "$cloud_bin" pki issue --state-dir "$work/ns-state" --client linked --out "$work/id-linked" > /dev/null
  in_cloud_ns "$cloud_bin" serve --listen "$shaped_cloud_ip:0" --state-dir "$work/ns-state" --model "$model" \
    > "$work/ns-cloud.log" 2>&1 &
  ns_cloud=$!
  for _ in $(seq 1 100); do grep -q 'listening on' "$work/ns-cloud.log" && break; sleep 0.1; done
  ns_port=$(grep -o "wss://$shaped_cloud_ip:[0-9]*" "$work/ns-cloud.log" | cut -d: -f3)
  [[ -n $ns_port ]] || fail "the cloud in the namespace did not start: $(cat "$work/ns-cloud.log")"
  "$edge_bin" "${edge_args[@]}" --cloud "wss://$shaped_cloud_ip:$ns_port" --identity "$work/id-linked" \
    --checkpoint-dir "$work/ckpt-linked" > "$work/edge.out" 2>&1 &
  edge_pid=$!
  while kill -0 "$edge_pid" 2> /dev/null && [[ -z $(ls "$work/ckpt-linked" 2> /dev/null) ]]; do sleep 0.02; done
  ip link set "$shaped_edge_if" down
  echo "the link is down for $link_down_s s"
  sleep "$link_down_s"
  ip link set "$shaped_edge_if" up
  ip addr replace "$shaped_edge_ip/24" dev "$shaped_edge_if"
  wait "$edge_pid" || fail "the run did not finish after the link was down for $link_down_s s"
  echo "the run finished after the link was down for $link_down_s s" \
    "($(grep -c 'reconnecting in' "$work/edge.out" || true) reconnections)"
fi
echo "PASS: the edge healed $restarts cloud restarts to the uninterrupted run's weights, and a link down for $link_down_s s"
