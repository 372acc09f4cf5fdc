#!/usr/bin/env bash
# End to end with real processes on loopback: a tandem-cloud service and tandem-edge agents
# over TLS WebSockets with mutual TLS. Two edges train at once and get well above chance; an
# edge with an enrolment token instead of a certificate trains once; an edge with another cut
# is refused with the cloud's words, one with another CA's identity cannot connect, and the
# service keeps serving throughout. The cloud's TLS runs on three service threads.
# Usage: split_training.sh BUILD_DIR SOURCE_DIR [EPOCHS SAMPLES MIN_ACCURACY]
# (default 2 epochs of 3200 samples for each edge, 0.70; the sanitizer build trains less, no bar)
set -euo pipefail
build=$1 src=$2 epochs=${3:-2} samples=${4:-3200} min_acc=${5:-0.70}
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
cleanup() { stop_started; rm -rf "$work"; }  # every cloud and edge, on every exit path (lib.sh)
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; cat "$work/cloud.log"; exit 1; }

source "$src/tests/e2e/lib.sh"
# The edges' TLS on three threads (an acceptor hands each connection to the least loaded).
start_cloud_as cloud --accept-tokens --io-threads 3
grep -q "TLS on 3 I/O threads" "$work/cloud.log" || fail "the cloud does not say its TLS runs on 3 threads"
"$cloud_bin" pki issue --state-dir "$work/state" --client hospital-a --out "$work/a" > /dev/null
"$cloud_bin" pki issue --state-dir "$work/state" --client hospital-b --out "$work/b" > /dev/null

train() {  # train NAME IDDIR EXTRA... : runs an edge, output in $work/NAME.out
  local name=$1 id=$2; shift 2
  "$edge_bin" train --cloud "wss://localhost:$port" --identity "$id" --model "$model" \
    --metrics-json "$work/$name.jsonl" "$@" > "$work/$name.out" 2>&1
}

# Two edges at the same time, EPOCHS epochs on SAMPLES samples each.
train a "$work/a" --epochs "$epochs" --limit "$samples" --test-limit 2000 & pa=$!
train b "$work/b" --epochs "$epochs" --limit "$samples" --test-limit 2000 --seed 2 & pb=$!
wait $pa || fail "edge a: $(tail -3 "$work/a.out")"
wait $pb || fail "edge b: $(tail -3 "$work/b.out")"
for e in a b; do
  acc=$(tail -1 "$work/$e.jsonl" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2)
  awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' || fail "edge $e reached test accuracy $acc (< $min_acc)"
  for key in epoch samples_per_s train_loss test_accuracy steps bytes_up bytes_down train_bytes_up train_bytes_down edge_busy_s edge_idle_s cloud_busy_s cloud_idle_s; do
    grep -q "\"$key\":" "$work/$e.jsonl" || fail "metrics of edge $e lack $key"
  done
  echo "edge $e: test accuracy $acc"
done

# Each edge's egress log (IDDIR/egress.jsonl) verifies, says what left, and fails once edited.
tandem_bin=$build/tools/tandem
"$tandem_bin" audit verify "$work/a/egress.jsonl" > "$work/audit.out" || fail "audit verify: $(cat "$work/audit.out")"
grep -q "verifies: .* 1 run (client hospital-a), the chain intact" "$work/audit.out" || fail "audit: $(cat "$work/audit.out")"
grep -Eq "^  Forward +[0-9]+ messages .* activations f32 \[[0-9,]+\]; [0-9]+ labels" "$work/audit.out" ||
  fail "audit, Forward: $(cat "$work/audit.out")"
anchor=$(grep -o 'last hash [0-9a-f]*' "$work/a.out" | cut -d' ' -f3)
"$tandem_bin" audit verify "$work/a/egress.jsonl" --expect-last "$anchor" > /dev/null || fail "the edge's printed last hash"
sed '5s/"step":\([0-9]*\)/"step":9\1/' "$work/a/egress.jsonl" > "$work/edited.jsonl"
if "$tandem_bin" audit verify "$work/edited.jsonl" > "$work/edited.out"; then fail "an edited egress log verified"; fi
grep -q "does NOT verify: line 5: its text does not give its hash: the line was edited" "$work/edited.out" ||
  fail "edited log: $(cat "$work/edited.out")"
echo "egress log: verifies, $(grep -c . "$work/a/egress.jsonl") lines; an edited line is caught"

# --record-sent: the last epoch's activations as they left (bf16 on the wire here), each row
# with its sample's index: 100 rows of the cut's 3136 values, distinct samples of the 320
# trained, every value one a bf16 holds (the codec applied, as the cloud received it).
train recorded "$work/a" --limit 320 --test-limit 10 --wire-dtype bf16 --record-sent "$work/sent.safetensors" \
  --record-sent-limit 100 || fail "--record-sent: $(tail -3 "$work/recorded.out")"
/usr/bin/python3 - "$work/sent.safetensors" <<'PY' || fail "--record-sent's file"
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
def tensor(name, dtype):
    b, e = header[name]["data_offsets"]
    return np.frombuffer(raw[8 + n + b:8 + n + e], dtype=dtype).reshape(header[name]["shape"])
rows, samples = tensor("activations", np.float32), tensor("samples", np.int64)
assert rows.shape == (100, 3136), rows.shape
assert len(set(samples.tolist())) == 100 and samples.min() >= 0 and samples.max() < 320, samples
assert not (rows.view(np.uint32) & 0xFFFF).any(), "values a bf16 cannot hold"
assert np.abs(rows).sum() > 0 and np.isfinite(rows).all()
assert header["__metadata__"]["epoch"] == "1"
assert header["__metadata__"]["sample_shape"] == "[7,7,64]", header["__metadata__"]
print("--record-sent: 100 rows of 3136 bf16 values, distinct samples")
PY

# Another cut: another model hash; refused in the cloud's words.
if train wrongcut "$work/a" --cut pool1 --limit 64 --test-limit 10; then fail "an edge with another cut trained"; fi
grep -q "the cloud refused: the edge's model spec or cut differs from the cloud's" "$work/wrongcut.out" ||
  fail "wrong cut: $(cat "$work/wrongcut.out")"

# An identity issued to hospital-a cannot train as hospital-b: refused with both names, and
# nothing is written under hospital-b's name (its folder holds what edge b left, unchanged).
listing() { ls -lR "$work/state/checkpoints/hospital-b" 2> /dev/null || true; }
before=$(listing)
if train impostor "$work/a" --client-id hospital-b --limit 64 --test-limit 10; then fail "hospital-a trained as hospital-b"; fi
grep -q "the cloud refused: the Hello says client id 'hospital-b' but the client certificate was issued to 'hospital-a'" \
  "$work/impostor.out" || fail "identity binding: $(cat "$work/impostor.out")"
[[ $(listing) == "$before" ]] ||
  fail "the refused impostor changed hospital-b's checkpoints"
# A token for one client, used with another id, is refused too.
mkdir -p "$work/t2" && cp "$work/a/ca.crt" "$work/t2/"
token=$("$cloud_bin" pki token --state-dir "$work/state" --client ward-9 --ttl 5m)
if train tokenswap "$work/t2" --token "$token" --client-id ward-10 --limit 64 --test-limit 10; then
  fail "a token for ward-9 trained as ward-10"; fi
grep -q "the cloud refused: the enrolment token is for client 'ward-9', but the edge says it is 'ward-10'" \
  "$work/tokenswap.out" || fail "token binding: $(cat "$work/tokenswap.out")"
echo "identities are bound: hospital-a cannot be hospital-b, a token for ward-9 cannot be ward-10"

# An identity from another CA cannot connect.
"$cloud_bin" pki init --state-dir "$work/other" > /dev/null
"$cloud_bin" pki issue --state-dir "$work/other" --client intruder --out "$work/x" > /dev/null
if train intruder "$work/x" --limit 64 --test-limit 10; then fail "an identity from another CA trained"; fi
grep -q "cannot connect" "$work/intruder.out" || fail "foreign CA: $(cat "$work/intruder.out")"

# An edge without a client certificate: an enrolment token gets it in once, for its client id.
mkdir -p "$work/t" && cp "$work/a/ca.crt" "$work/t/"
token=$("$cloud_bin" pki token --state-dir "$work/state" --client ward-3 --ttl 5m)
train token "$work/t" --token "$token" --client-id ward-3 --limit 320 --test-limit 100 ||
  fail "edge with a token: $(tail -3 "$work/token.out")"
if train replay "$work/t" --token "$token" --client-id ward-3 --limit 64 --test-limit 10; then fail "a token worked twice"; fi
grep -q "the cloud refused: the enrolment token was already used" "$work/replay.out" || fail "replay: $(cat "$work/replay.out")"
if train notoken "$work/t" --token "" --client-id ward-3 --limit 64 --test-limit 10; then fail "an edge without certificate or token trained"; fi
grep -q "t/client.crt, .*t/client.key are missing: issue an identity with .tandem-cloud pki issue --state-dir STATE --client NAME --out .*t. on the cloud and copy the folder here, or connect with --token" "$work/notoken.out" ||
  fail "no certificate, no token: $(cat "$work/notoken.out")"
echo "edge with an enrolment token: trained; the replayed token refused"

# The service still serves.
kill -0 "$cloud_pid" || fail "the cloud died"
train after "$work/b" --limit 640 --test-limit 100 || fail "after the refusals: $(tail -3 "$work/after.out")"

# A thread count below 1 is refused before anything starts.
if "$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$model" --threads 0 \
  > "$work/threads0.log" 2>&1; then fail "--threads 0 was taken"; fi
grep -q "option --threads must be >= 1, got 0" "$work/threads0.log" || fail "--threads 0: $(cat "$work/threads0.log")"

# A cloud that serves any cut on two kernel threads a session, and an edge that plans its
# own cut (tandem plan at start-up).
"$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$model" --cut any --microbatches 8 \
  --threads 2 > "$work/any.log" 2>&1 &
any_pid=$!
for _ in $(seq 1 100); do grep -q 'listening on' "$work/any.log" && break; sleep 0.1; done
grep -q ', 2 kernel threads a session,' "$work/any.log" || fail "--threads 2 not in effect: $(cat "$work/any.log")"
any_port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/any.log" | cut -d: -f3)
"$edge_bin" train --cloud "wss://localhost:$any_port" --identity "$work/a" --model "$model" --cut auto \
  --uplink-mbps 20 --microbatches 8 --limit 640 --test-limit 100 > "$work/auto.out" 2>&1 ||
  fail "--cut auto: $(tail -3 "$work/auto.out")"
planned=$(grep -o 'planned: cut=[a-z0-9]* microbatches=[0-9]*' "$work/auto.out") || fail "no plan: $(cat "$work/auto.out")"
stop_cloud "$any_pid"
grep -q "cut '$(echo "$planned" | sed 's/.*cut=\([^ ]*\).*/\1/')': 10 steps" "$work/any.log" ||
  fail "the cloud did not train the planned cut: $(cat "$work/any.log")"
echo "edge with --cut auto: $planned, trained by a --cut any cloud"
echo "PASS: two concurrent edges at or above accuracy $min_acc, a token edge, refusals clear, the service kept serving, --cut auto on a cloud with --threads 2"
