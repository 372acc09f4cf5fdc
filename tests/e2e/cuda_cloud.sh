#!/usr/bin/env bash
# Issue 17's end-to-end bar on a GPU machine: the cloud on cuda and the edge on xnnpack over
# TLS reach the same test accuracy after one epoch of Fashion-MNIST as the same run with the
# cloud on onednn (within 0.3 points), and a federation of four edges with --batch-edges on
# cuda trains as well as the same edges' steps in turns. Without a usable GPU it skips (exit
# 77) with the reason.
# Usage: cuda_cloud.sh BUILD_DIR SOURCE_DIR [LIMIT (60000: one epoch)]
set -euo pipefail
build=$1 src=$2 limit=${3:-60000}
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
model=$src/samples/fashion-mnist/model.json
if ! gpu=$("$tandem_bin" gpu 2>&1); then
  echo "SKIP: the cuda backend's tests need a GPU: $gpu"
  exit 77
fi
echo "GPU: $gpu"
work=$(mktemp -d)
pids=()
# (the edges are reaped by then: kill fails for them, which must not fail the test)
cleanup() { kill ${cloud_pid:-} "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; tail -n 30 "$work"/cloud-*.log; exit 1; }
source "$src/tests/e2e/lib.sh"

# run BACKEND: one cloud on BACKEND and one edge (xnnpack), one epoch; prints the accuracy.
run() {
  local backend=$1
  start_cloud_as "cloud-$backend" --backend "$backend" --seed 3
  grep -q "back shard on $backend" "$work/cloud-$backend.log" || fail "the cloud is not on $backend"
  [[ -d $work/edge ]] || "$cloud_bin" pki issue --state-dir "$work/state" --client edge --out "$work/edge" > /dev/null
  "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/edge" --model "$model" --backend xnnpack \
    --epochs 1 --limit "$limit" --seed 3 --metrics-json "$work/$backend.jsonl" > "$work/$backend.out" 2>&1 ||
    fail "the edge against the $backend cloud: $(tail -n 3 "$work/$backend.out")"
  stop_cloud
  cloud_pid=
}
run onednn
run cuda
acc() { grep -o '"test_accuracy":[0-9.]*' "$work/$1.jsonl" | tail -1 | cut -d: -f2; }
sps() { grep -o '"samples_per_s":[0-9.]*' "$work/$1.jsonl" | tail -1 | cut -d: -f2; }
a_cpu=$(acc onednn) a_gpu=$(acc cuda)
echo "one epoch ($limit samples): test accuracy $a_cpu with the cloud on onednn, $a_gpu on cuda;" \
  "samples/s $(sps onednn) and $(sps cuda)"
awk -v a="$a_cpu" -v b="$a_gpu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.003) }' ||
  fail "the cuda cloud's accuracy $a_gpu is more than 0.3 points from onednn's $a_cpu"

# Four edges, one shared back shard on cuda, 8,000 samples each: their steps in turns, then
# with their micro-batches joined (--batch-edges), which must train as well (the same
# summed update; the order of micro-batches within a step differs run to run).
# federation NAME [FLAGS]: edge 0's test accuracy in fed_acc; the cloud's metrics in $work/NAME.prom.
federation() {
  local name=$1
  shift
  rm -rf "$work/state/federation"
  start_cloud_as "cloud-$name" --backend cuda --aggregate-every 10 --min-edges 4 --back-accumulate 4 "$@" \
    --metrics-listen 127.0.0.1:0
  for i in 0 1 2 3; do
    [[ -d $work/h$i ]] || "$cloud_bin" pki issue --state-dir "$work/state" --client "h$i" --out "$work/h$i" > /dev/null
    "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/h$i" --model "$model" --shard "$i/4" \
      --split iid --limit 32000 --test-limit 2000 --metrics-json "$work/$name-h$i.jsonl" > "$work/$name-h$i.out" 2>&1 &
    pids[$i]=$!
  done
  for i in 0 1 2 3; do wait "${pids[$i]}" || fail "$name edge $i: $(tail -n 3 "$work/$name-h$i.out")"; done
  pids=()  # reaped: their ids may be another process's by the time cleanup runs
  scrape /metrics > "$work/$name.prom" || fail "the $name cloud's metrics could not be read"
  kill -0 "$cloud_pid" || fail "the $name cloud ended before its edges"
  stop_cloud
  cloud_pid=
  fed_acc=$(grep -o '"test_accuracy":[0-9.]*' "$work/$name-h0.jsonl" | tail -1 | cut -d: -f2 || true)
  [[ -n $fed_acc ]] || fail "$name edge 0 reported no test accuracy"
}
federation turns
acc_t=$fed_acc
federation batched --batch-edges
acc_b=$fed_acc
batches=$(awk '$1 == "tandem_back_shard_batches_total" { print $2 }' "$work/batched.prom")
joined=$(awk '$1 == "tandem_back_shard_batched_microbatches_total" { print $2 }' "$work/batched.prom")
echo "four edges on cuda: test accuracy $acc_t in turns, $acc_b batched ($joined micro-batches in $batches batches)"
awk -v b="${batches:-0}" -v j="${joined:-0}" 'BEGIN { exit !(b > 0 && j / b >= 1.5) }' ||
  fail "the edges' micro-batches were not joined ($joined in $batches batches)"
# On onednn here the two gave 0.801-0.823 (2 runs each, this machine): 0.7 is well above
# chance (0.1) and well below what either reaches; 0.04 is twice the spread seen.
awk -v a="${acc_b:-0}" -v t="${acc_t:-0}" 'BEGIN { d = a - t; if (d < 0) d = -d; exit !(a >= 0.7 && d <= 0.04) }' ||
  fail "the batched federation's accuracy ${acc_b:-none} (in turns: ${acc_t:-none})"
echo "PASS"
