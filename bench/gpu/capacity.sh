#!/usr/bin/env bash
# Capacity: N simulated edges against one tandem-cloud (bench_capacity: a thread an edge, each
# with its own client certificate and TLS WebSocket, replaying a recorded micro-batch of the
# cut's activations, K=4 a step), for N = 1, 16, 64 and 256: aggregate samples/s, its ratio to
# one edge's, and the p50 and p99 of a Forward's round trip. Issue 17's bar on a GPU: 256 edges
# at least 50x one CPU session. DEVICE=cuda (the default) serves on --backend cuda and needs a
# GPU; DEVICE=cpu serves on onednn, one kernel thread a session.
# SHARD=own (default): each edge trains a back shard of its own. SHARD=turns: one shared back
# shard (a federation, --back-accumulate N for N edges), the edges' steps in turns; SHARD=batched:
# the same with --batch-edges, their micro-batches joined into one batch (issue 17, item 4).
# IO_THREADS: the cloud's --io-threads (default 0: one for every 8 cores).
# usage: [DEVICE=cuda|cpu] [SHARD=own|turns|batched] [IO_THREADS=N] [MODEL=samples/fashion-mnist/model.json] [STEPS=20]
#        [EDGES="1 16 64 256"] bash bench/gpu/capacity.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD device=${DEVICE:-cuda} model=${MODEL:-samples/fashion-mnist/model.json} steps=${STEPS:-20} shard=${SHARD:-own}
[[ $shard == own || $shard == turns || $shard == batched ]] || { echo "SHARD must be own, turns or batched"; exit 2; }
counts=${EDGES:-1 16 64 256}
build=build/release cloud_bin=build/release/cloud/tandem-cloud
[[ -x $build/bench/bench_capacity ]] || bash scripts/setup.sh release > /dev/null
backend=$([[ $device == cuda ]] && echo cuda || echo onednn)
if [[ $device == cuda ]]; then  # only a missing GPU skips; a failing cuda backend fails
  gpu=$("$build/tools/tandem" gpu) || { echo "SKIP: $gpu (DEVICE=cpu serves on onednn)"; exit 77; }
fi
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2> /dev/null; wait 2> /dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -5 "$work"/*.log 2> /dev/null; exit 1; }
source "$src/tests/e2e/lib.sh"

most=0
for n in $counts; do ((n > most)) && most=$n; done
"$cloud_bin" pki init --state-dir "$work/state" > /dev/null
for i in $(seq 0 $((most - 1))); do
  "$cloud_bin" pki issue --state-dir "$work/state" --client "edge-$i" --out "$work/id/$i" > /dev/null
done
serve() {  # serve N: a cloud for N edges (a shared shard's update sums their N steps)
  local shared=()
  if [[ $shard != own ]]; then
    shared=(--aggregate-every 1000000)  # a federation whose rounds never come: the shared shard alone
    (($1 > 1)) && shared+=(--back-accumulate "$1")
    [[ $shard == batched ]] && (($1 > 1)) && shared+=(--batch-edges)
  fi
  start_cloud_as cloud --backend "$backend" --max-connections $((most + 16)) --max-pending-hello $((most + 16)) \
    --io-threads "${IO_THREADS:-0}" "${shared[@]}"
  grep -E "GPU|listening|split-federated|I/O thread" "$work/cloud.log" | sed 's/^/  /'
}
[[ $shard == own ]] && serve "$most"
one=
for n in $counts; do
  if [[ $shard != own ]]; then
    [[ -n ${cloud_pid:-} ]] && stop_cloud
    rm -rf "$work/state/federation"
    serve "$n"
  fi
  line=$("$build/bench/bench_capacity" localhost "$port" "$work/id" "$model" "$n" "$steps")
  sps=$(grep -o '"samples_per_s":[0-9.]*' <<< "$line" | cut -d: -f2)
  one=${one:-$sps}
  awk -v n="$n" -v s="$sps" -v one="$one" -v p50="$(grep -o '"p50_ms":[0-9.]*' <<< "$line" | cut -d: -f2)" \
    -v p99="$(grep -o '"p99_ms":[0-9.]*' <<< "$line" | cut -d: -f2)" -v b="$backend" -v shard="$shard" 'BEGIN {
    printf "%4d edges on %s (%s): %9.1f samples/s (%.1fx one edge), round trip p50 %.1f ms, p99 %.1f ms\n", n, b, shard, s, s / one, p50, p99 }'
done
