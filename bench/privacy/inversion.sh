#!/usr/bin/env bash
# Model inversion against cut depth and protection (issue 18, attack (a)): for each setting,
# the Fashion-MNIST sample is split-trained through a local cloud over TLS (K=4, batch 64,
# EPOCHS epochs, same seed) with the edge's checkpoints on, exported (`tandem export`), and
# bench/privacy/inversion_attack.py (the curious cloud: front weights, the test split as
# auxiliary data, a decoder) reconstructs 1000 training images from what the edge sent (the
# last epoch's activations as they left the edge, noise and codec applied: --record-sent).
# Prints each setting's test accuracy, epsilon, SSIM and MSE, beside the mean-image floor.
# Usage: bash bench/privacy/inversion.sh [EPOCHS] [SETTING...]
#   SETTING: CUT (no protection), CUT:dp:C:SIGMA[:clean] (clean: --dp-eval clean, the test
#   set's activations leave without noise) or CUT:nopeek:ALPHA
#   (default 1 epoch; pool1 pool2 relu3 pool2:nopeek:1 pool2:dp:4:0.5 relu3:dp:4:0.5)
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-1}
shift $(( $# < 1 ? $# : 1 ))
settings=("$@")
((${#settings[@]})) || settings=(pool1 pool2 relu3 pool2:nopeek:1 pool2:dp:4:0.5 relu3:dp:4:0.5)
bin=build/release
model=samples/fashion-mnist/model.json
[[ -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "needs Debian's python3-torch: apt-get install python3-torch libopenblas0-pthread"; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -5 "$work/cloud.log"; exit 1; }
cloud_bin=$bin/cloud/tandem-cloud
source tests/e2e/lib.sh
start_cloud_as cloud --cut any

: > "$work/results.jsonl"
n=0
for setting in "${settings[@]}"; do
  IFS=: read -r cut kind x y eval_mode <<< "$setting"
  n=$((n + 1))
  id=$work/id$n
  "$cloud_bin" pki issue --state-dir "$work/state" --client "bench$n" --out "$id" > /dev/null
  protect=() attack=()
  case ${kind:-} in
    "") ;;
    dp) protect=(--dp-clip "$x" --dp-noise "$y" --dp-eval "${eval_mode:-noised}"); attack=(--dp-clip "$x" --dp-noise "$y") ;;
    nopeek) protect=(--nopeek "$x") ;;
    *) fail "unknown setting $setting" ;;
  esac
  "$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$id" --model "$model" --cut "$cut" \
    --epochs "$epochs" --checkpoint-dir "$work/ckpt$n" --checkpoint-every 0 --metrics-json "$work/$n.jsonl" \
    --record-sent "$work/$n.sent.safetensors" --record-sent-limit 1000 \
    "${protect[@]}" > "$work/$n.out" 2>&1 || fail "training $setting: $(tail -3 "$work/$n.out")"
  edge_ckpt=$(ls "$work/ckpt$n"/edge-*.tdmc | tail -1)
  cloud_ckpt=$(ls "$work/state/checkpoints/bench$n"/cloud-*.tdmc | tail -1)
  "$bin/tools/tandem" export --model "$model" --edge-ckpt "$edge_ckpt" --identity "$id" --cloud-ckpt "$cloud_ckpt" \
    --out "$work/$n.safetensors" > /dev/null
  accuracy=$(tail -1 "$work/$n.jsonl" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2)
  epsilon=$(tail -1 "$work/$n.jsonl" | grep -o '"dp_epsilon":[0-9.]*' | cut -d: -f2 || true)
  /usr/bin/python3 bench/privacy/inversion_attack.py "$model" "$work/$n.safetensors" "$cut" "$work/$n.sent.safetensors" "${attack[@]}" \
    --label "$setting" | sed "s/}\$/,\"test_accuracy\":$accuracy,\"epsilon\":${epsilon:-null},\"epochs\":$epochs}/" |
    tee -a "$work/results.jsonl"
done

printf "\n%-22s %7s %9s %8s %7s %8s %11s\n" setting "values" accuracy epsilon SSIM MSE "mean SSIM"
/usr/bin/python3 - "$work/results.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    eps = "-" if r["epsilon"] is None else f"{r['epsilon']:.2f}"
    print(f"{r['label']:<22} {r['cut_values']:>7} {100 * r['test_accuracy']:>8.2f}% {eps:>8} {r['ssim']:>7.3f} "
          f"{r['mse']:>8.4f} {r['mean_image_ssim']:>11.3f}")
PY
echo "bar (issue 18): with DP at epsilon <= 8, SSIM <= 0.3, beside the no-noise SSIM"
