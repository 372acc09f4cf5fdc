#!/usr/bin/env bash
# Load: N edges (default 64, real tandem-edge processes over mutual TLS on loopback) against
# one cloud. A fifth of them misbehave: half are killed mid-step (SIGKILL: the socket just
# drops), half go silent mid-step (SIGSTOP: the connection stays open and says nothing). The
# rest must finish their runs; the cloud must stay up with bounded memory (its peak RSS is
# printed and checked against a bound); a well-behaved probe edge's step time alone and under
# the load is reported, with the cloud's own counters from /metrics.
# Usage: load.sh BUILD_DIR SOURCE_DIR [EDGES]
set -euo pipefail
build=$1 src=$2 edges=${3:-64}
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null; rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; tail -30 "$work/cloud.log"; exit 1; }

"$cloud_bin" pki init --state-dir "$work/state" > /dev/null
source "$src/tests/e2e/lib.sh"
# All the edges and the probe connect at once, more than the cloud's default bound on
# connections that have not said Hello yet (64): those refused Busy say Hello again after a
# backoff (tandem-edge --connect-retries) and must finish like the rest.
start_cloud_as cloud --metrics-listen 127.0.0.1:0 --max-connections $((edges + 16))
pids+=("$cloud_pid")
for i in $(seq 0 "$edges"); do
  "$cloud_bin" pki issue --state-dir "$work/state" --client "edge-$i" --out "$work/id/$i" > /dev/null
done
start_edge() {  # start_edge I LIMIT EPOCHS: edge I in the background (its pid in $!), output in $work/I.*
  "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/id/$1" --model "$model" --limit "$2" \
    --epochs "$3" --test-limit 64 --seed "$1" --metrics-json "$work/$1.jsonl" > "$work/$1.out" 2>&1 &
}
step_ms() {  # the step time of a run's last epoch, from its metrics: batch / samples per second
  local sps; sps=$(tail -1 "$work/$1.jsonl" | grep -o '"samples_per_s":[0-9.]*' | cut -d: -f2)
  awk -v s="$sps" 'BEGIN { printf "%.1f", 64 * 1000 / s }'
}

# The probe edge alone first.
start_edge 0 1280 1
wait $! || fail "probe edge alone: $(tail -3 "$work/0.out")"
alone_ms=$(step_ms 0)
rss_idle=$(awk '/VmRSS/ { print $2 }' "/proc/$cloud_pid/status")

# The load: every well-behaved edge trains 960 samples twice (30 steps); a fifth misbehave
# mid-run (their runs would be longer, so they are still training when it happens).
bad=$((edges / 5))
declare -A role
bad_pids=() good_pids=()
for i in $(seq 1 "$edges"); do
  if ((i <= bad)); then start_edge "$i" 960 50; else start_edge "$i" 960 2; fi
  pids+=("$!")
  role[$!]=$i
  if ((i <= bad)); then bad_pids+=("$!"); else good_pids+=("$!"); fi
done
# The probe again, under the load.
start_edge 0 1280 2
probe_pid=$!
pids+=("$probe_pid")
# Misbehave once each has trained a step or two: half dropped, half silent.
for _ in $(seq 1 300); do
  [[ $(metric tandem_steps_total) -ge $((2 * edges)) ]] && break
  sleep 0.2
done
n=0
for p in "${bad_pids[@]}"; do
  if ((n % 2 == 0)); then kill -9 "$p"; else kill -STOP "$p"; fi
  n=$((n + 1))
done
echo "load: $edges edges; $((bad - bad / 2)) killed mid-run, $((bad / 2)) silent (stopped) mid-run"

# The rest finish.
finished=0
for p in "${good_pids[@]}"; do
  wait "$p" || fail "well-behaved edge ${role[$p]} did not finish: $(tail -3 "$work/${role[$p]}.out")"
  finished=$((finished + 1))
done
wait "$probe_pid" || fail "the probe edge under load: $(tail -3 "$work/0.out")"
loaded_ms=$(step_ms 0)
kill -0 "$cloud_pid" || fail "the cloud died"
rss_peak=$(awk '/VmHWM/ { print $2 }' "/proc/$cloud_pid/status")
open=$(metric tandem_sessions_open)
steps=$(metric tandem_steps_total)
# Bounded: the peak stays under a budget that is far from what unbounded queues would reach.
budget_kb=$((4 * 1024 * 1024))
((rss_peak < budget_kb)) || fail "the cloud's peak RSS is $((rss_peak / 1024)) MiB (budget $((budget_kb / 1024)) MiB)"
((open >= bad / 2)) || fail "the silent edges' sessions are gone already ($open open)"
retried=$(cat "$work"/*.out | grep -c "trying again in" || true)
echo "finished: $finished of $((edges - bad)) well-behaved edges and the probe; the cloud trained $steps steps;" \
  "$retried Hellos were answered Busy and said again"
echo "cloud RSS: $((rss_idle / 1024)) MiB idle, $((rss_peak / 1024)) MiB peak (budget $((budget_kb / 1024)) MiB); sessions still open (the silent ones): $open"
echo "probe edge step time: ${alone_ms} ms alone, ${loaded_ms} ms among $edges edges (2 cores shared by all processes)"
echo "PASS: load with $edges edges, $bad misbehaving"
