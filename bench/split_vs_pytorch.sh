#!/usr/bin/env bash
# tandem's split training (cloud + edge over TLS WebSockets on loopback, K=4) against a
# PyTorch split-learning baseline (edge and cloud processes over a loopback TCP socket,
# /usr/bin/python3 with Debian's python3-torch), same model, batch 64 and cut, one thread a
# process. tandem runs three times a round: as it trains by default (synchronous; the cloud
# sends each gradient of the cut before its own weight gradients), with --weight-grads inline
# (all of backward before the reply, as before issue 19) and with the edge's --pipeline async.
# The four alternate for ROUNDS rounds (default 3) on the same machine; prints each round (with
# the edge's idle fraction and median time to a step's first gradient), the medians and the
# ratios of the medians.
# Usage: bash bench/split_vs_pytorch.sh [SAMPLES]   (default 12800; ROUNDS=N in the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
samples=${1:-12800}
rounds=${ROUNDS:-3}
bin=build/release
[[ -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "needs Debian's python3-torch: apt-get install python3-torch libopenblas0-pthread"; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
cloud_bin=$bin/cloud/tandem-cloud model=samples/fashion-mnist/model.json
fail() { echo "FAIL: $*" >&2; exit 1; }
source tests/e2e/lib.sh  # start_cloud_as

"$bin/cloud/tandem-cloud" pki init --state-dir "$work/state" > /dev/null
"$bin/cloud/tandem-cloud" pki issue --state-dir "$work/state" --client bench --out "$work/id" > /dev/null

# One tandem run: a fresh cloud service (with the arguments given after the first) and an edge
# (with the first argument's words); prints samples/s, the edge's idle fraction and the median
# time to a step's first gradient (ms).
tandem_round() {
  local edge_args=$1
  shift
  start_cloud_as cloud "$@"
  local cloud=$cloud_pid
  rm -f "$work/tandem.jsonl"
  "$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$work/id" \
    --model samples/fashion-mnist/model.json --limit "$samples" --test-limit 100 --batch 64 --microbatches 4 \
    --metrics-json "$work/tandem.jsonl" $edge_args > "$work/edge.log" 2>&1 ||
    { echo "tandem edge ($edge_args $*) failed: $(tail -3 "$work/edge.log")" >&2; stop_cloud "$cloud"; return 1; }
  stop_cloud "$cloud"
  local field
  for field in samples_per_s edge_idle_fraction first_grad_ms; do
    grep -o "\"$field\":[0-9.]*" "$work/tandem.jsonl" | tail -1 | cut -d: -f2
  done | paste -sd' '
}

# One PyTorch baseline run; prints samples/s.
pytorch_round() {
  local bport=$((20000 + RANDOM % 20000))
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_split/baseline.py cloud "$bport" &
  local cloud=$!
  sleep 3
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_split/baseline.py edge "$bport" "$samples" 64 > "$work/torch.log" 2>&1 ||
    { echo "the PyTorch edge failed: $(tail -3 "$work/torch.log")" >&2; kill "$cloud"; return 1; }
  wait "$cloud" || { echo "the PyTorch cloud failed" >&2; return 1; }
  grep -o '"samples_per_s": [0-9.]*' "$work/torch.log" | cut -d' ' -f2
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

: > "$work/t" ; : > "$work/i" ; : > "$work/a" ; : > "$work/p" ; : > "$work/ti" ; : > "$work/ai"
for r in $(seq 1 "$rounds"); do
  # The tandem runs' order rotates, so none always follows PyTorch's.
  for j in 0 1 2; do
    case $(((r + j) % 3)) in
      0) read -r t t_idle t_first <<< "$(tandem_round "")" ;;
      1) read -r i i_idle i_first <<< "$(tandem_round "" --weight-grads inline)" ;;
      2) read -r a a_idle a_first <<< "$(tandem_round "--pipeline async")" ;;
    esac
  done
  p=$(pytorch_round)
  need_figures "round $r" "$t" "$t_idle" "$i" "$a" "$a_idle" "$p"
  echo "$t" >> "$work/t"; echo "$i" >> "$work/i"; echo "$a" >> "$work/a"; echo "$p" >> "$work/p"
  echo "$t_idle" >> "$work/ti"; echo "$a_idle" >> "$work/ai"
  echo "round $r: tandem (TLS, K=4) $t samples/s (edge idle $t_idle, first gradient $t_first ms);" \
    "inline weight gradients $i (idle $i_idle, first $i_first ms); asynchronous $a (idle $a_idle);" \
    "PyTorch split baseline (TCP, K=1) $p samples/s"
done
tandem=$(median < "$work/t"); inline=$(median < "$work/i"); async=$(median < "$work/a"); base=$(median < "$work/p")
echo "median of $rounds: tandem $tandem samples/s (edge idle $(median < "$work/ti")), inline weight gradients $inline," \
  "asynchronous $async (edge idle $(median < "$work/ai")), PyTorch $base samples/s"
awk -v t="$tandem" -v i="$inline" -v a="$async" -v b="$base" 'BEGIN {
  printf "ratio tandem / PyTorch (medians): %.2fx (bar: >= 2.5x); asynchronous / PyTorch %.2fx (bar: >= 3x); inline / PyTorch %.2fx; tandem / inline %.3f\n",
    t / b, a / b, i / b, t / i }'
echo "{\"bench\":\"split_vs_pytorch\",\"samples\":$samples,\"rounds\":$rounds,\"tandem_samples_per_s\":$tandem,\"inline_samples_per_s\":$inline,\"async_samples_per_s\":$async,\"pytorch_samples_per_s\":$base}"
