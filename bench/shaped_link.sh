#!/usr/bin/env bash
# Pipelining on shaped links: the cloud runs in its own network namespace behind a veth pair,
# each direction shaped with tc's token bucket (uplink on the edge's end, downlink on the
# cloud's). Prints samples/s, step times and the ratios of the issue's bars:
#  1. balanced: both directions at the rate where sending one micro-batch's activations takes
#     as long as the edge's compute for it (measured first, on an unshaped run):
#     K=4 against K=1 samples/s (bar >= 1.6x);
#  2. a 50 Mbit/s uplink (downlink 200 Mbit/s, so the uplink is the bottleneck): K=4's step
#     time against the time the uplink alone needs for the step's bytes (bar <= 1.05x), synchronous and
#     asynchronous (--pipeline async).
# Needs root and iproute2 (ip netns, tc tbf). Usage: bash bench/shaped_link.sh [SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
samples=${1:-3200}
bin=build/release
[[ -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
source scripts/lib/shaped_link.sh
work=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2> /dev/null || true
  wait 2> /dev/null || true
  shaped_link_down
  rm -rf "$work"
}
trap cleanup EXIT
shaped_link_up || exit 1
cloud_ip=$shaped_cloud_ip
shape() { shaped_link_rates "$1" "$2"; }

model=samples/fashion-mnist/model.json
"$bin/cloud/tandem-cloud" pki init --state-dir "$work/state" --hosts "$cloud_ip" > /dev/null
"$bin/cloud/tandem-cloud" pki issue --state-dir "$work/state" --client bench --out "$work/id" > /dev/null
in_cloud_ns "$bin/cloud/tandem-cloud" serve --listen "$cloud_ip:0" --state-dir "$work/state" \
  --model "$model" > "$work/cloud.log" 2>&1 &
for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
port=$(grep -o "wss://$cloud_ip:[0-9]*" "$work/cloud.log" | cut -d: -f3)

# run NAME K [EDGE ARGS]: one epoch of SAMPLES, batch 64; leaves its metrics line in $work/NAME.json.
run() {
  local name=$1 k=$2
  shift 2
  "$bin/edge/tandem-edge" train --cloud "wss://$cloud_ip:$port" --identity "$work/id" --model "$model" \
    --limit "$samples" --test-limit 100 --batch 64 --microbatches "$k" --metrics-json "$work/$name.json" "$@" > /dev/null 2>&1
}
field() { grep -o "\"$2\":[0-9.]*" "$work/$1.json" | head -1 | cut -d: -f2; }

shape 0 0
run unshaped 4
# Balanced: bytes of one micro-batch's activations (with framing) per edge-busy second of it.
balanced=$(awk -v up="$(field unshaped train_bytes_up)" -v busy="$(field unshaped edge_busy_s)" \
  -v steps="$(field unshaped steps)" 'BEGIN { mb = steps * 4; printf "%d", (up / mb) * 8 / (busy / mb) / 1e6 }')
shape "$balanced" "$balanced"
run balanced_k1 1
run balanced_k4 4
run balanced_async 4 --pipeline async
k1=$(field balanced_k1 samples_per_s) k4=$(field balanced_k4 samples_per_s) k4a=$(field balanced_async samples_per_s)
echo "balanced link: ${balanced} Mbit/s each way (one micro-batch of 16 sends in about its edge compute time)"
awk -v a="$k4" -v b="$k1" -v c="$k4a" 'BEGIN { printf "  K=4 %.1f samples/s, K=1 %.1f samples/s: %.2fx (bar >= 1.6x); K=4 asynchronous %.1f: %.2fx\n",
  a, b, a / b, c, c / b }'

shape 50 200
# What the uplink's queue really sent (tc's counter: TCP/IP and Ethernet headers, TLS records,
# the acknowledgements of the downlink's data), for each run.
uplink_sent() { tc -s qdisc show dev "$shaped_edge_if" | grep -o 'Sent [0-9]*' | head -1 | cut -d' ' -f2; }
s0=$(uplink_sent); run slow_uplink 4; s1=$(uplink_sent)
run slow_uplink_async 4 --pipeline async; s2=$(uplink_sent)
uplink_ratio() {
  awk -v s="$(field "$1" seconds)" -v steps="$(field "$1" steps)" -v up="$(field "$1" train_bytes_up)" -v what="$2" \
    -v wire="$3" 'BEGIN { step = s / steps; link = up * 8 / 50e6 / steps; carried = wire * 8 / 50e6 / steps;
      printf "50 Mbit/s uplink, 200 Mbit/s downlink, %s: K=4 step %.1f ms, uplink time of its %.0f bytes %.1f ms: %.3fx (bar <= 1.05x);\n",
             what, step * 1e3, up / steps, link * 1e3, step / link
      printf "  the uplink carried %.0f bytes a step (%.3fx tandem'"'"'s; headers, TLS, acknowledgements): the step is %.3fx its time on the wire\n",
             wire / steps, wire / up, step / carried }'
}
uplink_ratio slow_uplink synchronous $((s1 - s0))
uplink_ratio slow_uplink_async asynchronous $((s2 - s1))
echo "{\"bench\":\"shaped_link\",\"samples\":$samples,\"balanced_mbit\":$balanced,\"k1_samples_per_s\":$k1,\"k4_samples_per_s\":$k4,\"k4_async_samples_per_s\":$k4a,\"slow_uplink\":$(cat "$work/slow_uplink.json"),\"slow_uplink_async\":$(cat "$work/slow_uplink_async.json")}"
