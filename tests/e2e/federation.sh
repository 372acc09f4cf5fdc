#!/usr/bin/env bash
# Split-federated training with real processes over TLS on loopback.
#  1. Four edges, non-IID by class, one cloud averaging their front shards every 5 steps:
#     all finish on the same final average (identical test accuracy), above chance.
#  2. Failures: of four IID edges one is killed and comes back (it rejoins from the newest
#     average), one is killed for good and one hangs (SIGSTOP): the others finish, and no
#     round waits longer than the deadline.
#  3. The cloud crashes: four non-IID edges with checkpoint folders and per-round fronts; the
#     cloud is killed mid-run and its newest round's back shard bit-flipped; restarted, it
#     refuses that round, continues from the one before, and the edges, run again with the
#     same command, resume from their checkpoints and all finish on one average.
#  4. Many edges, one batch (--back-accumulate 4 --batch-edges): four IID edges' steps run
#     together, their micro-batches joined on the back shard; one edge is killed and one
#     hangs mid-run: the others finish above chance, and the joined batches held more than
#     one edge's micro-batch on average (Prometheus' counters).
# Usage: federation.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
pids=()
cleanup() { kill -9 ${cloud_pid:-} "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; tail -40 "$work/cloud.log"; exit 1; }
deadline=2

source "$src/tests/e2e/lib.sh"
start_cloud() { start_cloud_as cloud --aggregate-every 5 --metrics-json "$work/cloud.jsonl" "$@"; }  # EXTRA...
edge() {  # edge I SPLIT LIMIT EXTRA...: edge I of 4 in the background; its pid in pids[I]
  local i=$1 split=$2 limit=$3; shift 3
  "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/h$i" --model "$model" --shard "$i/4" \
    --split "$split" --limit "$limit" --test-limit 1000 --batch 32 --metrics-json "$work/h$i.jsonl" "$@" \
    >> "$work/h$i.out" 2>&1 &
  pids[$i]=$!
}

# Rounds need all four (--min-edges 4) and no deadline closes one: whichever edge starts
# first waits for the others, and all four end on one average.
start_cloud --min-edges 4 --round-deadline-s 60
for i in 0 1 2 3; do "$cloud_bin" pki issue --state-dir "$work/state" --client "h$i" --out "$work/h$i" > /dev/null; done

# 1. Non-IID by class: 1000 samples each, 32 steps, 6 rounds and a final one.
for i in 0 1 2 3; do edge $i class 4000 --lr 0.005 --momentum 0; done  # a small front step: non-IID drift
for i in 0 1 2 3; do wait "${pids[$i]}" || fail "edge $i: $(tail -3 "$work/h$i.out")"; done
accs=$(for i in 0 1 2 3; do grep -o '"test_accuracy":[0-9.]*' "$work/h$i.jsonl" | tail -1 | cut -d: -f2; done | sort -u)
echo "non-IID edges' final test accuracy: $accs"
[[ $(echo "$accs" | wc -l) -eq 1 ]] || fail "the edges ended on different weights: $accs"
awk -v a="$accs" 'BEGIN { exit !(a >= 0.25) }' || fail "accuracy $accs is not above chance"
rounds=$(grep -c '"round"' "$work/cloud.jsonl")
((rounds == 7)) || fail "expected 7 rounds, the cloud closed $rounds"
grep -q '"rounds_joined":7' "$work/h0.jsonl" || fail "edge 0 did not join 7 rounds: $(tail -1 "$work/h0.jsonl")"
grep -q '"client":"h3".*"rounds_joined":7' "$work/cloud.jsonl" || fail "the cloud's per-edge metrics lack h3's rounds"

# 2. Failures, IID, 2000 samples each (63 steps).
stop_cloud
rm -rf "$work"/*.jsonl "$work"/*.out "$work/state/federation"  # a new federation, not part 1's
start_cloud --min-edges 2 --round-deadline-s $deadline
for i in 0 1 2 3; do edge $i iid 8000; done
for _ in $(seq 1 300); do grep -q '^round 2:' "$work/cloud.log" && break; sleep 0.1; done
kill -9 "${pids[3]}"; wait "${pids[3]}" 2>/dev/null || true   # h3 drops out ...
edge 3 iid 8000                                                # ... and comes back
kill -9 "${pids[1]}"; wait "${pids[1]}" 2>/dev/null || true   # h1 is gone for good
sleep 0.5
kill -STOP "${pids[2]}"                                        # h2 hangs
for i in 0 3; do wait "${pids[$i]}" || fail "edge $i did not finish: $(tail -3 "$work/h$i.out")"; done
kill -9 "${pids[2]}" 2>/dev/null || true
grep -q "joined at round [1-9]" "$work/h3.out" || fail "h3 did not rejoin from the newest average: $(grep -i round "$work/h3.out")"
waited=$(grep -o '"waited_s":[0-9.]*' "$work/cloud.jsonl" | cut -d: -f2 | sort -g | tail -1)
echo "longest wait for a round: $waited s (deadline $deadline s)"
awk -v w="$waited" -v d=$deadline 'BEGIN { exit !(w <= d + 1.0) }' || fail "a round waited $waited s"
grep -q '"closed_by":"deadline"' "$work/cloud.jsonl" || fail "no round closed at its deadline"

# 3. A cloud crash mid-run, non-IID, 1000 samples each (32 steps, rounds every 5).
stop_cloud
rm -rf "$work"/*.jsonl "$work"/*.out "$work/state/federation"
start_cloud --min-edges 4 --round-deadline-s 60
crash_edges() {  # --reconnects 0: they end with their cloud and are started again by hand
  for i in 0 1 2 3; do
    edge $i class 4000 --front-updates round --lr 0.005 --momentum 0 --checkpoint-dir "$work/ck$i" --checkpoint-every 2 \
      --reconnects 0
  done
}
crash_edges
for _ in $(seq 1 600); do grep -q '^round 4:' "$work/cloud.log" && break; sleep 0.05; done
grep -q '^round 4:' "$work/cloud.log" || fail "round 4 never closed"
kill -9 "$cloud_pid"; wait "$cloud_pid" 2>/dev/null || true
for i in 0 1 2 3; do
  if wait "${pids[$i]}"; then fail "edge $i finished although its cloud died"; fi
done
newest=$(ls "$work/state/federation"/back-*.tdmc | sort | tail -1)
[[ -n $newest ]] || fail "the cloud kept no round checkpoints: $(ls "$work/state/federation" 2>&1)"
/usr/bin/python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(200); b = f.read(1); f.seek(200); f.write(bytes([b[0] ^ 0x10]))' "$newest"  # one bit flipped
cp "$work/cloud.log" "$work/cloud-before.log"
start_cloud --min-edges 4 --round-deadline-s 60
grep -q "refused the federation's round .*checksum mismatch.*trying the previous one" "$work/cloud.log" ||
  fail "the flipped round was not refused: $(head -5 "$work/cloud.log")"
restored=$(grep -o 'continuing the federation from round [0-9]*' "$work/cloud.log" | grep -o '[0-9]*$' || true)
[[ -n $restored ]] || fail "the restarted cloud did not continue the federation: $(head -5 "$work/cloud.log")"
echo "restarted cloud continues from round $restored"
crash_edges
for i in 0 1 2 3; do wait "${pids[$i]}" || fail "resumed edge $i: $(tail -3 "$work/h$i.out")"; done
for i in 0 1 2 3; do
  grep -q "resuming from the checkpoint of step" "$work/h$i.out" || fail "edge $i did not resume: $(tail -5 "$work/h$i.out")"
done
accs=$(for i in 0 1 2 3; do grep -o '"test_accuracy":[0-9.]*' "$work/h$i.jsonl" | tail -1 | cut -d: -f2; done | sort -u)
echo "after the cloud's crash, the edges' final test accuracy: $accs"
[[ $(echo "$accs" | wc -l) -eq 1 ]] || fail "the resumed edges ended on different weights: $accs"
awk -v a="$accs" 'BEGIN { exit !(a >= 0.25) }' || fail "accuracy $accs is not above chance"
first=$(grep -o '^round [0-9]*' "$work/cloud.log" | head -1 | cut -d' ' -f2)
((first == restored + 1)) || fail "the restarted cloud's first round was $first, not $((restored + 1))"

# 4. Batched, IID, 2000 samples each (63 steps): h1 killed for good, h2 hangs (SIGSTOP) with
# its step's slot held until the deadline takes it.
stop_cloud
rm -rf "$work"/*.jsonl "$work"/*.out "$work/state/federation" "$work"/ck*
start_cloud --min-edges 2 --round-deadline-s $deadline --back-accumulate 4 --batch-edges --metrics-listen 127.0.0.1:0
grep -q "4 edge steps summed into one update of the back shard, run together" "$work/cloud.log" ||
  fail "the cloud does not say it batches the edges' steps"
for i in 0 1 2 3; do edge $i iid 8000; done
for _ in $(seq 1 300); do grep -q '^round 2:' "$work/cloud.log" && break; sleep 0.1; done
scraped=$(scrape /metrics)  # once: both counters of one moment
batches=$(awk '$1 == "tandem_back_shard_batches_total" { print $2 }' <<< "$scraped")
joined=$(awk '$1 == "tandem_back_shard_batched_microbatches_total" { print $2 }' <<< "$scraped")
kill -9 "${pids[1]}"; wait "${pids[1]}" 2>/dev/null || true
sleep 0.3
kill -STOP "${pids[2]}"
for i in 0 3; do wait "${pids[$i]}" || fail "batched edge $i did not finish: $(tail -3 "$work/h$i.out")"; done
kill -9 "${pids[2]}" 2>/dev/null || true
echo "batched: $joined micro-batches in $batches batches while all four edges ran"
awk -v b="${batches:-0}" -v j="${joined:-0}" 'BEGIN { exit !(b > 0 && j / b >= 1.5 && j / b <= 4) }' ||
  fail "the edges' micro-batches were not joined ($joined in $batches batches)"
for i in 0 3; do
  acc=$(grep -o '"test_accuracy":[0-9.]*' "$work/h$i.jsonl" | tail -1 | cut -d: -f2)
  awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.25) }' || fail "batched edge $i's accuracy ${acc:-none} is not above chance"
done
echo "PASS"
