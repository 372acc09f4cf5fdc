#!/usr/bin/env bash
# LoRA against full fine-tuning on samples/spam-bert, from the same pretrained start, split over
# TLS (tandem-cloud and tandem-edge on loopback, K=4, a federation of one edge averaging every
# 25 steps, so FrontWeights rounds go up). The start: the whole model trained for one epoch on
# the training split's first PRETRAIN mails, exported. Then one epoch of all training mails:
#  - full: every weight trains (AdamW, lr 5e-4);
#  - LoRA: rank 8, alpha 16, dropout 0.1 on every query and value (PEFT's defaults for BERT),
#    the rest of the encoder and the embeddings frozen; the pooler and classifier train
#    (AdamW, lr 1e-3).
# Prints, side by side: the edge's trainable share of its front, its peak RSS and its training
# state (weights, gradients, AdamW's two moments), the FrontWeights bytes a round, and the test
# accuracy (issue 16's bars: <= 2%, <= 50% memory, <= 5% round bytes, within 1 point).
# Usage: bash bench/spam_bert_lora.sh [PRETRAIN (2048)]
set -euo pipefail
cd "$(dirname "$0")/.."
pretrain=${1:-2048}
bin=build/release data=samples/spam-bert/data model=samples/spam-bert/model.json
[[ -f $data/test.safetensors && -x $bin/edge/tandem-edge ]] || bash scripts/setup.sh release > /dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "spam_bert_lora: $*" >&2; exit 1; }
cloud_bin=$bin/cloud/tandem-cloud
source tests/e2e/lib.sh
"$cloud_bin" pki init --state-dir "$work/state" > /dev/null

# The LoRA spec: adapters on the queries and values, the other encoder weights frozen.
python3 - "$model" "$work/lora.json" <<'PY'
import re, sys
out = []
for line in open(sys.argv[1]):
    m = re.match(r'(\s*\{ name: "([^"]+)", op: "(\w+)".*) \}(,?)$', line.rstrip("\n"))
    if m and re.search(r"attention\.self\.(query|value)$", m.group(2)):
        line = f"{m.group(1)}, lora: {{ rank: 8, alpha: 16, dropout: 0.1 }} }}{m.group(4)}\n"
    elif m and m.group(3) in ("linear", "layer_norm", "embedding", "position_embedding") \
            and m.group(2) not in ("bert.pooler.dense", "classifier"):
        line = f"{m.group(1)}, freeze: true }}{m.group(4)}\n"
    out.append(line)
open(sys.argv[2], "w").write("".join(out))
PY

# run NAME SPEC LR LIMIT CLOUD_ARGS... -- EDGE_ARGS...: one cloud and one edge, one epoch; the
# edge under /usr/bin/time (its peak RSS); its stderr in $work/NAME.out.
run() {
  local name=$1 spec=$2 lr=$3 limit=$4; shift 4
  local cloud_args=() edge_args=()
  while (($#)) && [[ $1 != -- ]]; do cloud_args+=("$1"); shift; done
  (($#)) && shift
  edge_args=("$@")
  model=$spec
  start_cloud_as "cloud-$name" --optimizer adamw --lr "$lr" "${cloud_args[@]}"
  "$cloud_bin" pki issue --state-dir "$work/state" --client "clinic-$name" --out "$work/$name" > /dev/null
  OMP_NUM_THREADS=1 /usr/bin/time -v "$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$work/$name" \
    --model "$spec" --data "$data" --limit "$limit" --epochs 1 --batch 32 --microbatches 4 --optimizer adamw --lr "$lr" \
    --metrics-json "$work/$name.jsonl" "${edge_args[@]}" > "$work/$name.out" 2>&1 ||
    fail "the edge ($name): $(tail -5 "$work/$name.out")"
  stop_cloud
}
steps_of() { echo $(( ($1 + 31) / 32 )); }

echo "pretraining: the whole model, one epoch of $pretrain mails..."
run pre "$model" 0.0005 "$pretrain" -- --checkpoint-dir "$work/ckpt" --checkpoint-every "$(steps_of "$pretrain")"
step=$(printf "%012d" "$(steps_of "$pretrain")")
"$bin/tools/tandem" export --model "$model" --edge-ckpt "$work/ckpt/edge-$step.tdmc" \
  --cloud-ckpt "$work/state/checkpoints/clinic-pre/cloud-$step.tdmc" --identity "$work/pre" \
  --out "$work/pre.safetensors" > /dev/null || fail "export of the pretrained model"
echo "pretrained start: test accuracy $(grep -o '"test_accuracy":[0-9.]*' "$work/pre.jsonl" | tail -1 | cut -d: -f2)"

echo "fine-tuning from it, one epoch of every training mail: full, then LoRA..."
run full "$model" 0.0005 0 --init-from "$work/pre.safetensors" --aggregate-every 25 -- --init-from "$work/pre.safetensors"
run lora "$work/lora.json" 0.001 0 --init-from "$work/pre.safetensors" --aggregate-every 25 -- --init-from "$work/pre.safetensors"

report() {  # NAME: trainable all acc rss_kib round_bytes
  local name=$1 line
  line=$(grep -o "edge shard ([0-9]* nodes): [0-9]* parameters, [0-9]* trainable" "$work/$name.out" | head -1)
  local all trainable
  all=$(awk '{ print $5 }' <<< "$line") trainable=$(awk '{ print $7 }' <<< "$line")
  local acc rss rounds bytes
  acc=$(grep -o '"test_accuracy":[0-9.]*' "$work/$name.jsonl" | tail -1 | cut -d: -f2)
  rss=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$work/$name.out")
  read -r rounds bytes < <("$bin/tools/tandem" audit verify "$work/$name/egress.jsonl" |
    awk '$1 == "FrontWeights" { n = $2; b = $4; u = $5; if (u == "KiB") b *= 1024; if (u == "MiB") b *= 1048576; print n, b }')
  echo "$all $trainable $acc $rss $rounds $bytes"
}
read -r f_all f_train f_acc f_rss f_rounds f_bytes < <(report full)
read -r l_all l_train l_acc l_rss l_rounds l_bytes < <(report lora)
echo "full: $f_all parameters, $f_train trainable, accuracy $f_acc, peak RSS $f_rss KiB, $f_rounds rounds of $f_bytes bytes"
echo "LoRA: $l_all parameters, $l_train trainable, accuracy $l_acc, peak RSS $l_rss KiB, $l_rounds rounds of $l_bytes bytes"
awk -v fa="$f_all" -v ft="$f_train" -v facc="$f_acc" -v frss="$f_rss" -v fr="$f_rounds" -v fb="$f_bytes" \
    -v la="$l_all" -v lt="$l_train" -v lacc="$l_acc" -v lrss="$l_rss" -v lr="$l_rounds" -v lb="$l_bytes" '
BEGIN {
  # Training state: every weight, plus a gradient and the two AdamW moments per trainable one.
  fs = (fa + 3 * ft) * 4 / 1048576; ls = (la + 3 * lt) * 4 / 1048576
  row = "%-6s %12d %9.2f%% %6.0f MiB %10.1f MiB %13.1f KiB %13.2f%%\n"
  printf "%-6s %12s %10s %10s %14s %17s %14s\n", "", "front params", "trainable", "peak RSS", "training state", "FrontWeights/round", "test accuracy"
  printf row, "full", fa, 100 * ft / fa, frss / 1024, fs, fb / fr / 1024, 100 * facc
  printf row, "LoRA", la, 100 * lt / la, lrss / 1024, ls, lb / lr / 1024, 100 * lacc
  share = lt / la; mem = lrss / frss; state = ls / fs; bytes = (lb / lr) / (fb / fr); gap = (lacc - facc) * 100
  printf "LoRA / full: trainable %.2f%% (bar <= 2%%), peak RSS %.0f%% and training state %.0f%% (bar <= 50%%), ", 100 * share, 100 * mem, 100 * state
  printf "round bytes %.2f%% (bar <= 5%%), accuracy %+.2f points (bar >= -1)\n", 100 * bytes, gap
  printf "{\"bench\":\"spam_bert_lora\",\"trainable_share\":%.4f,\"peak_rss_ratio\":%.3f,\"state_ratio\":%.3f,", share, mem, state
  printf "\"round_bytes_ratio\":%.4f,\"full_accuracy\":%s,\"lora_accuracy\":%s}\n", bytes, facc, lacc
}'
