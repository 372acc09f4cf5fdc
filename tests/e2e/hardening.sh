#!/usr/bin/env bash
# End to end, the cloud under an operator's controls and a hostile peer's input, with real
# processes on loopback: a revoked identity's live session is closed within 5 s with an Error
# that says so while another edge trains on; a revoked certificate and a token issued before
# the revocation are refused, also by a restarted cloud; a new identity for the same name
# works. /metrics is scraped during a run and its counters checked against the run. Raw
# WebSocket probes: unmasked frames, bad opcodes and fragmented or long control frames get a close, connections
# that never speak (TLS or Hello) are closed at their deadlines, and the bounds on connections
# without Hello and on all connections answer with a Busy Error; the sessions' memory, estimated
# at Hello, refuses a session that cannot fit (NoRoom) and answers one that cannot fit now Busy.
# Every cloud here runs its TLS on two service threads (the bounds count across them).
# Usage: hardening.sh BUILD_DIR SOURCE_DIR [SAMPLES] (the longer runs' samples, default 6400;
# the sanitizer build gives fewer: the checks need the runs under way, not long)
set -euo pipefail
build=$1 src=$2 samples=${3:-6400}
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
pids=()
cleanup() { stop_started; rm -rf "$work"; }  # every cloud and edge, on every exit path (lib.sh)
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$work"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }

source "$src/tests/e2e/lib.sh"
start_cloud() {  # start_cloud NAME EXTRA...: sets port, metrics_port, cloud_pid
  local name=$1; shift
  start_cloud_as "$name" --accept-tokens --metrics-listen 127.0.0.1:0 --io-threads 2 "$@"
  pids+=("$cloud_pid")
}
train() {  # train NAME IDDIR EXTRA... : runs an edge, output in $work/NAME.out
  local name=$1 id=$2; shift 2
  "$edge_bin" train --cloud "wss://localhost:$port" --identity "$id" --model "$model" \
    --metrics-json "$work/$name.jsonl" "$@" > "$work/$name.out" 2>&1
}

"$cloud_bin" pki init --state-dir "$work/state" > /dev/null
for c in hospital-a hospital-b hospital-c; do
  "$cloud_bin" pki issue --state-dir "$work/state" --client $c --out "$work/$c" > /dev/null
done
start_cloud cloud

# Metrics: scraped during one edge's run and after it, against what the edge did.
[[ $(scrape /healthz) == ok ]] || fail "/healthz did not answer ok"
# The edge is stopped (SIGSTOP) once it has stepped, so "during the run" is not a race with a
# fast machine finishing the run first; its SAMPLES / 64 steps leave time to stop it.
train counted "$work/hospital-c" --epochs 1 --limit "$samples" --test-limit 200 & pc=$!
for _ in $(seq 1 100); do [[ $(metric tandem_steps_total) -ge 1 ]] && break; sleep 0.1; done
kill -STOP $pc
open_during=$(metric tandem_sessions_open)
kill -CONT $pc
[[ $open_during == 1 ]] || fail "during the run: tandem_sessions_open $open_during, not 1"
wait $pc || fail "edge c: $(tail -3 "$work/counted.out")"
for _ in $(seq 1 50); do [[ $(metric tandem_sessions_closed_total) == 1 ]] && break; sleep 0.1; done
steps=$(tail -1 "$work/counted.jsonl" | grep -o '"steps":[0-9]*' | cut -d: -f2)
up=$(tail -1 "$work/counted.jsonl" | grep -o '"bytes_up":[0-9]*' | cut -d: -f2)
[[ $(metric tandem_steps_total) == "$steps" ]] || fail "tandem_steps_total $(metric tandem_steps_total), the edge made $steps steps"
[[ $(metric tandem_samples_total) == "$samples" ]] || fail "tandem_samples_total $(metric tandem_samples_total), not $samples"
[[ $(metric tandem_sessions_opened_total) == 1 && $(metric tandem_sessions_closed_total) == 1 ]] ||
  fail "sessions opened $(metric tandem_sessions_opened_total), closed $(metric tandem_sessions_closed_total), not 1 and 1"
received=$(metric tandem_received_bytes_total)
awk -v r="$received" -v u="$up" 'BEGIN { exit !(r >= u && u > 0) }' || fail "received $received bytes, the edge sent $up"
awk -v b="$(metric tandem_compute_busy_seconds_total)" 'BEGIN { exit !(b > 0) }' || fail "no compute busy time"
scrape /metrics | grep -q '^# TYPE tandem_steps_total counter$' || fail "no TYPE line for tandem_steps_total"
echo "metrics: $steps steps, $samples samples, $received bytes received (the edge sent $up), sessions 1 opened and closed"

# Revocation of a live session: hospital-a trains long, hospital-b beside it; a is revoked.
train long "$work/hospital-a" --epochs 20 --limit 3200 --test-limit 100 & pa=$!
train beside "$work/hospital-b" --epochs 1 --limit $((samples / 2)) --test-limit 200 & pb=$!
for _ in $(seq 1 200); do grep -q "session .*(hospital-a)\|edge 'hospital-a' connected" "$work/cloud.log" && \
  [[ $(metric tandem_steps_total) -ge $((steps + 5)) ]] && break; sleep 0.1; done
revoked_at=$(date +%s.%N)
"$cloud_bin" pki revoke --state-dir "$work/state" --client hospital-a > "$work/revoke.out" || fail "pki revoke: $(cat "$work/revoke.out")"
if wait $pa; then fail "the revoked edge finished its run"; fi
took=$(awk -v a="$revoked_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
awk -v t="$took" 'BEGIN { exit !(t < 5) }' || fail "the revoked session ended $took s after the revocation (> 5 s)"
grep -q "the cloud refused: the certificate of 'hospital-a' (serial [0-9a-f]*) was revoked on" "$work/long.out" ||
  fail "revoked edge: $(tail -3 "$work/long.out")"
wait $pb || fail "the other edge did not finish beside the revocation: $(tail -3 "$work/beside.out")"
echo "revocation: hospital-a's live session closed $took s after pki revoke, with the reason; hospital-b finished"

# pki list shows it; a new connection with the revoked certificate is refused, with the reason.
"$cloud_bin" pki list --state-dir "$work/state" > "$work/list.out"
grep -q "^hospital-a .* revoked " "$work/list.out" || fail "pki list: $(cat "$work/list.out")"
grep -q "^hospital-b .* valid$" "$work/list.out" || fail "pki list: $(cat "$work/list.out")"
if train again "$work/hospital-a" --limit 64 --test-limit 10; then fail "a revoked certificate trained"; fi
grep -q "the cloud refused: the certificate of 'hospital-a' .* was revoked" "$work/again.out" ||
  fail "revoked at connection: $(cat "$work/again.out")"

# Tokens: one issued before its client's revocation is refused.
mkdir -p "$work/t" && cp "$work/hospital-a/ca.crt" "$work/t/"
token=$("$cloud_bin" pki token --state-dir "$work/state" --client ward-1 --ttl 5m)
sleep 1.1  # the revocation is later than the token by the clock's second
"$cloud_bin" pki revoke --state-dir "$work/state" --client ward-1 > /dev/null
if train oldtoken "$work/t" --token "$token" --client-id ward-1 --limit 64 --test-limit 10; then fail "a revoked token trained"; fi
grep -q "the cloud refused: the enrolment token was issued to 'ward-1' at .*, before 'ward-1' was revoked" "$work/oldtoken.out" ||
  fail "revoked token: $(cat "$work/oldtoken.out")"

# A restarted cloud still refuses; a new identity for hospital-a trains.
stop_cloud
start_cloud restarted
if train after_restart "$work/hospital-a" --limit 64 --test-limit 10; then fail "the restarted cloud took a revoked certificate"; fi
grep -q "was revoked" "$work/after_restart.out" || fail "after restart: $(cat "$work/after_restart.out")"
sleep 1.1
"$cloud_bin" pki issue --state-dir "$work/state" --client hospital-a --out "$work/hospital-a2" > /dev/null
train reissued "$work/hospital-a2" --limit 320 --test-limit 100 || fail "a new identity for hospital-a: $(tail -3 "$work/reissued.out")"
[[ $(metric 'tandem_connections_refused_total{reason="revoked"}') -ge 1 ]] || fail "no refusal counted as revoked"
echo "revocation: refused at connection and after a restart; a token from before refused; a new identity trains"

# Raw WebSocket probes against a cloud with short deadlines and small bounds.
stop_cloud
start_cloud probes --hello-timeout-s 2 --handshake-timeout-s 2 --max-pending-hello 2 --max-connections 3
probe() { python3 "$src/tests/e2e/ws_raw.py" "$port" "$work/hospital-b" "$@"; }
out=$(probe unmasked opcode fragmented-ping long-ping silent tls-silent)
echo "$out"
grep -q "^unmasked: closed after .*, close code 1002.*unmasked frame" <<< "$out" || fail "unmasked frame: $out"
grep -q "^opcode: closed after .*, close code 1002" <<< "$out" || fail "reserved opcode: $out"
grep -q "^fragmented-ping: closed after .*, close code 1002" <<< "$out" || fail "fragmented ping: $out"
grep -q "^long-ping: closed after" <<< "$out" || fail "long ping: $out"
grep -Eq "^silent: closed after [2-4]\.[0-9] s.*no Hello within 2 s of connecting" <<< "$out" || fail "no Hello: $out"
grep -Eq "^tls-silent: closed after [2-4]\.[0-9] s" <<< "$out" || fail "no TLS handshake: $out"
out=$(probe hold:2 busy)
echo "$out"
grep -q "^busy: closed after .*connections have not said Hello yet, the most this cloud waits for" <<< "$out" ||
  fail "pending-Hello bound: $out"
kill -0 "$cloud_pid" || fail "the cloud died under the probes"
train wellbehaved "$work/hospital-b" --limit 320 --test-limit 100 || fail "after the probes: $(tail -3 "$work/wellbehaved.out")"
[[ $(metric 'tandem_connections_refused_total{reason="hello_timeout"}') -ge 1 ]] || fail "hello timeouts not counted"
[[ $(metric 'tandem_connections_refused_total{reason="pending_hello"}') -ge 1 ]] || fail "pending-Hello refusals not counted"
stop_cloud
start_cloud bounded --max-connections 1
out=$(probe hold:1 busy)
echo "$out"
grep -q "^busy: closed after .*the cloud serves at most 1 connections at once" <<< "$out" || fail "connection bound: $out"
[[ $(metric 'tandem_connections_refused_total{reason="max_connections"}') == 1 ]] || fail "max_connections refusal not counted"
# A real edge refused Busy says Hello again after a backoff, and trains once there is room:
# the one connection is held until the edge has been refused and said it will try again.
for _ in $(seq 1 50); do [[ $(metric tandem_sessions_open) == 0 ]] && break; sleep 0.1; done
probe hold:1 "until:$work/released" > "$work/held.out" &
held_pid=$!
pids+=("$held_pid")
for _ in $(seq 1 100); do grep -q holding "$work/held.out" && break; sleep 0.1; done
grep -q holding "$work/held.out" || fail "the probe holds no connection: $(cat "$work/held.out")"
train patient "$work/hospital-b" --limit 320 --test-limit 100 --connect-retries 6 &
patient_pid=$!
pids+=("$patient_pid")
for _ in $(seq 1 600); do grep -q "trying again" "$work/patient.out" 2> /dev/null && break; sleep 0.1; done
touch "$work/released"
wait "$patient_pid" || fail "an edge refused Busy did not train once there was room: $(tail -3 "$work/patient.out")"
wait "$held_pid" || fail "the probe: $(cat "$work/held.out")"
grep -q "the cloud serves at most 1 connections at once.*; trying again in [0-9.]* s (retry 1 of 6)" "$work/patient.out" ||
  fail "the edge did not retry after Busy: $(head -5 "$work/patient.out")"
"$build/tools/tandem" audit verify "$work/hospital-b/egress.jsonl" > "$work/audit.out" ||
  fail "the retried run's egress log: $(cat "$work/audit.out")"
echo "busy: the edge retried $(grep -c 'trying again' "$work/patient.out") times and trained"
stop_cloud

# The sessions' memory, estimated at each Hello (--session-memory-mb): below one session's
# estimate the edge is refused with NoRoom and told why; with room for one session, a second
# is answered Busy while the first trains, says Hello again, and trains once it is done.
start_cloud unbounded
each=$(grep -o "about [0-9]* MiB a session's back shard" "$work/unbounded.log" | awk '{ print $2 }')
[[ -n $each && $each -ge 2 ]] || fail "no session estimate at start: $(cat "$work/unbounded.log")"
stop_cloud
start_cloud tight --session-memory-mb $((each - 1))
train toobig "$work/hospital-b" --limit 320 --test-limit 100 && fail "an edge that cannot fit trained"
grep -q "needs about $each MiB, more than the $((each - 1)) MiB this cloud gives all sessions together" "$work/toobig.out" ||
  fail "no NoRoom refusal: $(tail -3 "$work/toobig.out")"
grep -q "trying again" "$work/toobig.out" && fail "the edge retried a session that can never fit"
[[ $(metric 'tandem_errors_sent_total{code="NoRoom"}') == 1 ]] || fail "the NoRoom refusal was not counted"
stop_cloud
start_cloud roomy --session-memory-mb $((each * 3 / 2))
for c in hospital-d hospital-e; do
  "$cloud_bin" pki issue --state-dir "$work/state" --client $c --out "$work/$c" > /dev/null
done
# The first edge is stopped (SIGSTOP) once its session holds its memory, so the second's
# Hello meets it whatever the machine's speed; it goes on once the second was answered Busy.
train first "$work/hospital-d" --limit "$samples" --test-limit 100 &
first_pid=$!
pids+=("$first_pid")
for _ in $(seq 1 100); do [[ $(metric tandem_session_memory_bytes) -gt 0 ]] && break; sleep 0.05; done
kill -STOP "$first_pid"
[[ $(metric tandem_session_memory_bytes) -gt 0 ]] || { kill -CONT "$first_pid"; fail "the first session holds no memory"; }
train second "$work/hospital-e" --limit 320 --test-limit 100 --connect-retries 8 &
second_pid=$!
pids+=("$second_pid")
for _ in $(seq 1 100); do grep -q "trying again" "$work/second.out" 2> /dev/null && break; sleep 0.1; done
kill -CONT "$first_pid"
wait "$second_pid" || fail "the second edge: $(tail -3 "$work/second.out")"
wait "$first_pid" || fail "the first edge: $(tail -3 "$work/first.out")"
grep -q "the sessions' memory ($((each * 3 / 2)) MiB, --session-memory-mb) has [0-9]* MiB left: try again later; trying again" \
  "$work/second.out" || fail "the second edge was not answered Busy: $(head -5 "$work/second.out")"
[[ $(metric 'tandem_connections_refused_total{reason="session_memory"}') -ge 1 ]] || fail "session_memory refusals not counted"
for _ in $(seq 1 50); do [[ $(metric tandem_session_memory_bytes) == 0 ]] && break; sleep 0.1; done
[[ $(metric tandem_session_memory_bytes) == 0 ]] || fail "closed sessions still hold $(metric tandem_session_memory_bytes) bytes"
echo "session memory: $each MiB a session; NoRoom below it, Busy for a second one, which trained after"
echo "PASS: revocation (live session closed in $took s), metrics checked against a run, RFC 6455 probes, deadlines and bounds, the sessions' memory"
