#!/usr/bin/env bash
# Many hospitals, each its own model, one cloud: `tandem stage` with later-stages = "own" (one
# process serving every hospital's last stage on one executor thread, pipeline/stage_host.h)
# against today's two-party `tandem-cloud serve` (a worker thread a hospital) with
# `tandem-edge`, side by side: the same spec, cut, batch, K, data per hospital (the first LIMIT
# training samples each), one kernel thread everywhere, all on this machine over loopback TLS,
# the cloud pinned to CLOUD_CPUS (default 0) and the hospitals to EDGE_CPUS (default the
# others), as machines of their own. EXECUTORS sets the cloud's executors (default: one a
# hospital).
# The figure is the aggregate training rate: the sum over the hospitals of each one's last
# epoch's samples/s (the epoch line both programs print), so start-up (loading data, drawing
# the model, linking) is left out; the wall time from the first start to the last end is
# printed beside it (HOSPITALS * LIMIT * EPOCHS over it). The two alternate for ROUNDS rounds
# (default 3); prints each round, the medians and the ratio. A failed run fails the script.
# Usage: bash bench/stage_host_vs_cloud.sh [HOSPITALS LIMIT EPOCHS] (SPEC, CUT, BATCH, K,
#   ROUNDS in the environment; default the Fashion-MNIST CNN cut at pool1, 64, 4, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
hospitals=${1:-4} limit=${2:-1024} epochs=${3:-1}
spec=${SPEC:-samples/fashion-mnist/model.json} cut=${CUT:-pool1} batch=${BATCH:-64} k=${K:-4} rounds=${ROUNDS:-3}
schedule=${SCHEDULE:-zero-bubble}  # input gradients first, as tandem-cloud answers by default
cores=$(nproc)
cloud_cpus=${CLOUD_CPUS:-0} edge_cpus=${EDGE_CPUS:-$( ((cores > 1)) && echo "1-$((cores - 1))" || echo 0)}
build=$PWD/build/release
tandem=$build/tools/tandem cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge
[[ -x $tandem && -x $cloud_bin && -x $edge_bin ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1
source tests/e2e/lib.sh
names=()
for ((i = 0; i < hospitals; i++)); do names+=("hospital-$i"); done
stage_identities "${names[@]}" cloud
samples=$((hospitals * limit * epochs))
now() { date +%s.%N; }
rate() { awk -v n="$samples" -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", n / (b - a) }'; }

# One round of tandem stage: the cloud, then every hospital; the rate over all of them.
stage_round() {
  local port i t0 t1 pids=()
  port=$(free_ports 1)
  {
    echo "model = \"$PWD/$spec\""
    echo "cut = \"$cut\""
    echo "first-parties = $hospitals"
    echo 'later-stages = "own"'
    echo "pipeline-schedule = \"$schedule\""
    echo "batch = $batch"
    echo "microbatches = $k"
    echo "limit = $limit"
    echo 'test-limit = 64'
    echo "epochs = $epochs"
    for i in "${names[@]}"; do printf '[%s]\nidentity = "id/%s"\nlimit = %s\n' "$i" "$i" "$limit"; done
    printf '[cloud]\naddress = "127.0.0.1:%s"\nidentity = "id/cloud"\nbackend = "onednn"\n' "$port"
    [[ -z ${EXECUTORS:-} ]] || echo "executors = $EXECUTORS"
  } > "$work/own.toml"
  taskset -c "$cloud_cpus" ${CLOUD_WRAP:-} "$tandem" stage --deployment "$work/own.toml" --party cloud --wait-s 60 \
    > "$work/stage-cloud.out" 2>&1 &
  local cloud=$!
  # As for tandem-cloud below: the hospitals start once the cloud listens (else their first
  # attempt finds no server and they try again a second later).
  for _ in $(seq 1 100); do grep -q 'listening on' "$work/stage-cloud.out" && break; sleep 0.1; done
  t0=$(now)
  for i in "${names[@]}"; do
    taskset -c "$edge_cpus" "$tandem" stage --deployment "$work/own.toml" --party "$i" --wait-s 60 > "$work/stage-$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { cat "$work/stage-${names[$i]}.out" >&2; fail "tandem stage ${names[$i]} failed"; }; done
  t1=$(now)
  wait "$cloud" || { cat "$work/stage-cloud.out" >&2; fail "the tandem stage cloud failed"; }
  local outs=()
  for i in "${names[@]}"; do outs+=("$work/stage-$i.out"); done
  echo "$(epoch_rate "${outs[@]}") $(rate "$t0" "$t1")"
}

# One round of tandem-cloud serve and tandem-edge: the same hospitals, data and steps.
cloud_round() {
  local port i t0 t1 pids=()
  rm -rf "$work/state"
  taskset -c "$cloud_cpus" ${CLOUD_WRAP:-} "$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$spec" --cut "$cut" --batch "$batch" \
    --microbatches "$k" --backend onednn > "$work/serve.log" 2>&1 &
  local cloud=$!
  for _ in $(seq 1 100); do grep -q 'listening on' "$work/serve.log" && break; sleep 0.1; done
  port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/serve.log" | cut -d: -f3)
  [[ -n $port ]] || { cat "$work/serve.log" >&2; fail "tandem-cloud serve did not start"; }
  for i in "${names[@]}"; do
    [[ -d $work/edge-id/$i ]] || "$cloud_bin" pki issue --state-dir "$work/state" --client "$i" --out "$work/edge-id/$i" > /dev/null
  done
  t0=$(now)
  for i in "${names[@]}"; do
    taskset -c "$edge_cpus" "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/edge-id/$i" --model "$spec" --cut "$cut" \
      --epochs "$epochs" --limit "$limit" --test-limit 64 --batch "$batch" --microbatches "$k" > "$work/edge-$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { cat "$work/edge-${names[$i]}.out" >&2; fail "tandem-edge ${names[$i]} failed"; }; done
  t1=$(now)
  kill "$cloud"
  wait "$cloud" 2> /dev/null || true
  rm -rf "$work/edge-id"
  local outs=()
  for i in "${names[@]}"; do outs+=("$work/edge-$i.out"); done
  echo "$(epoch_rate "${outs[@]}") $(rate "$t0" "$t1")"
}

echo "spec $spec, cut $cut, $hospitals hospitals x $limit samples x $epochs epochs, batch $batch, K $k, $schedule," \
  "one kernel thread a process, the cloud on CPUs $cloud_cpus and the hospitals on $edge_cpus, $rounds rounds"
stage_rates=() cloud_rates=()
for ((r = 1; r <= rounds; r++)); do
  read -r s sw <<< "$(stage_round)"
  read -r c cw <<< "$(cloud_round)"
  echo "round $r: tandem stage (later-stages = own, executors ${EXECUTORS:-one a hospital}) $s samples/s training ($sw over the wall time)," \
    "tandem-cloud + tandem-edge (a thread a hospital) $c samples/s ($cw)"
  stage_rates+=("$s")
  cloud_rates+=("$c")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ms=$(median "${stage_rates[@]}") mc=$(median "${cloud_rates[@]}")
echo "median aggregate training samples/s: tandem stage later-stages = own $ms, tandem-cloud serve $mc"
echo "ratio: $(awk -v a="$ms" -v b="$mc" 'BEGIN { printf "%.2f", a / b }')x"
