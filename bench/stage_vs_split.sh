#!/usr/bin/env bash
# The two protocols of one cloud, side by side: hospitals running `tandem stage` (the
# pipeline's stage peer, StageHello, Activations and Gradients) against `tandem-cloud serve`,
# and the same hospitals running `tandem-edge` (the two-party session, Hello, Forward and
# Backward) against the same service. The same spec, cut, batch, K and data per hospital (the
# first LIMIT training samples each), zero-bubble on both (tandem-cloud's default: the cut's
# gradient before the back shard's own), one kernel thread everywhere, all on this machine
# over loopback TLS, the cloud pinned to CLOUD_CPUS (default 0) and the hospitals to EDGE_CPUS
# (default the others). What the N = 2 move must keep: today's two-party speed.
# The figure is the aggregate training rate: the sum over the hospitals of each one's last
# epoch's samples/s (the epoch line both programs print). The two alternate for ROUNDS rounds
# (default 3); prints each round, the medians and the ratio. A failed run fails the script.
# Usage: bash bench/stage_vs_split.sh [HOSPITALS LIMIT EPOCHS] (SPEC, CUT, BATCH, K, ROUNDS in
#   the environment; default 1 hospital x 2048 samples x 1 epoch, the Fashion-MNIST CNN cut at
#   pool1, 64, 4, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
hospitals=${1:-1} limit=${2:-2048} epochs=${3:-1}
spec=${SPEC:-samples/fashion-mnist/model.json} cut=${CUT:-pool1} batch=${BATCH:-64} k=${K:-4} rounds=${ROUNDS:-3}
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
stage_identities "${names[@]}"  # $work/ca: the cloud's state folder, its PKI and certificate

# round MODE: the service, then every hospital as `tandem stage` (MODE stage) or `tandem-edge`
# (MODE edge); the aggregate rate.
round() {
  local mode=$1 port i pids=() outs=()
  rm -rf "$work/ca/checkpoints"
  taskset -c "$cloud_cpus" "$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/ca" --model "$spec" --cut "$cut" \
    --batch "$batch" --microbatches "$k" --backend onednn > "$work/serve.log" 2>&1 &
  local cloud=$!
  for _ in $(seq 1 100); do grep -q 'listening on' "$work/serve.log" && break; sleep 0.1; done
  port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/serve.log" | cut -d: -f3)
  [[ -n $port ]] || { cat "$work/serve.log" >&2; fail "tandem-cloud serve did not start"; }
  for i in "${names[@]}"; do
    if [[ $mode == stage ]]; then
      printf 'model = "%s"\ncut = "%s"\npipeline-schedule = "zero-bubble"\nbatch = %s\nmicrobatches = %s\nlimit = %s\n' \
        "$PWD/$spec" "$cut" "$batch" "$k" "$limit" > "$work/$i.toml"
      printf 'test-limit = 64\nepochs = %s\n[%s]\nidentity = "id/%s"\n' "$epochs" "$i" "$i" >> "$work/$i.toml"
      printf '[tandem-cloud]\naddress = "127.0.0.1:%s"\nidentity = "id/%s"\n' "$port" "$i" >> "$work/$i.toml"
      taskset -c "$edge_cpus" "$tandem" stage --deployment "$work/$i.toml" --party "$i" --wait-s 60 > "$work/$mode-$i.out" 2>&1 &
    else
      taskset -c "$edge_cpus" "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/id/$i" --model "$spec" \
        --cut "$cut" --epochs "$epochs" --limit "$limit" --test-limit 64 --batch "$batch" --microbatches "$k" \
        > "$work/$mode-$i.out" 2>&1 &
    fi
    pids+=($!)
    outs+=("$work/$mode-$i.out")
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { cat "${outs[$i]}" >&2; fail "$mode ${names[$i]} failed"; }; done
  kill "$cloud"
  wait "$cloud" || fail "tandem-cloud serve exited with $? when stopped: $(tail -3 "$work/serve.log")"
  epoch_rate "${outs[@]}"
}

echo "spec $spec, cut $cut, $hospitals hospital(s) x $limit samples x $epochs epoch(s), batch $batch, K $k, zero-bubble," \
  "one kernel thread a process, the cloud on CPUs $cloud_cpus and the hospitals on $edge_cpus, $rounds rounds"
stage_rates=() edge_rates=()
for ((r = 1; r <= rounds; r++)); do
  s=$(round stage)
  e=$(round edge)
  echo "round $r: tandem stage -> tandem-cloud (StageHello) $s samples/s, tandem-edge -> tandem-cloud (Hello) $e samples/s"
  stage_rates+=("$s")
  edge_rates+=("$e")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ms=$(median "${stage_rates[@]}") me=$(median "${edge_rates[@]}")
echo "median aggregate training samples/s: stage protocol $ms, two-party protocol $me"
echo "ratio (stage / two-party): $(awk -v a="$ms" -v b="$me" 'BEGIN { printf "%.2f", a / b }')x"
