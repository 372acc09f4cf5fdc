#!/usr/bin/env bash
# A LayoutLM-style encoder (samples/forms-layoutlm) split inside its layers, with real
# processes over TLS on loopback: the edge runs the embeddings (words, positions, the 2-D
# layout) and the first layer on generated pages; the cloud the second layer and the head.
# It learns the task that needs the boxes, and the same model without its 2-D position path
# (the layout node made an identity) stays near the 50% words alone allow; the egress log
# verifies and shows what left: the cut activations, the labels and the padding mask, never
# the ids or the boxes.
# Usage: transformer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
model=$src/samples/forms-layoutlm/model.json
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; cat "$work/cloud.log"; exit 1; }

source "$src/tests/e2e/lib.sh"
python3 "$src/samples/forms-layoutlm/make_data.py" "$work/forms" > /dev/null
# train NAME: a cloud serving $model, one edge trained on it for 4 epochs; sets acc.
train() {
  start_cloud_as "cloud-$1" --optimizer adam --lr 0.003
  "$cloud_bin" pki issue --state-dir "$work/state" --client clinic-forms --out "$work/c" > /dev/null
  "$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/c" --model "$model" --data "$work/forms" \
    --epochs 4 --batch 32 --microbatches 4 --optimizer adam --lr 0.003 --metrics-json "$work/$1.jsonl" \
    > "$work/$1.out" 2>&1 || fail "the edge ($1): $(tail -5 "$work/$1.out")"
  stop_cloud
  cloud_pid=
  acc=$(tail -1 "$work/$1.jsonl" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2)
}
sed 's/op: "layout_embedding", inputs: \["\([^"]*\)", "boxes"\], embedding: { count: 33 }/op: "dropout", inputs: ["\1"], dropout: { p: 0 }/' \
  "$model" > "$work/no-layout.json"
grep -q layout_embedding "$work/no-layout.json" && fail "the ablated spec still has its layout node"
full_model=$model model=$work/no-layout.json
train no-layout
words_only=$acc
echo "forms-layoutlm without its 2-D position path: test accuracy $words_only"
awk -v a="$words_only" 'BEGIN { exit !(a <= 0.65) }' || fail "without boxes the model reached $words_only (> 0.65): the task does not need them"
rm -rf "$work/c" "$work/state"
model=$full_model
train full
echo "forms-layoutlm, split after layer 0: test accuracy $acc"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.90) }' || fail "test accuracy $acc (< 0.90): $(cat "$work/full.out")"

"$tandem_bin" audit verify "$work/c/egress.jsonl" > "$work/audit.out" || fail "audit verify: $(cat "$work/audit.out")"
cat "$work/audit.out"
# 4 epochs of 125 steps of 4 micro-batches; each Forward: [8, 16, 32] activations, 8 x 16 mask tokens.
grep -Eq "^  Forward +2000 messages .* activations f32 \[8,16,32\]; 16000 labels; 256000 mask tokens$" "$work/audit.out" ||
  fail "Forward in the audit (activations, labels, the mask): $(cat "$work/audit.out")"
grep -q '"name":"ids"\|"name":"boxes"' "$work/c/egress.jsonl" && fail "ids or boxes left the edge"
echo "egress log: verifies; only activations, labels and the mask left"
# The same model trained locally (tandem train: both shards in one process) on the same data.
"$tandem_bin" train --model "$model" --data "$work/forms" --epochs 4 --batch 32 --optimizer adam --lr 0.003 \
  --metrics-json "$work/local.jsonl" > "$work/local.out" 2>&1 || fail "tandem train --data: $(tail -3 "$work/local.out")"
local_acc=$(tail -1 "$work/local.jsonl" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2)
echo "tandem train --data (local): test accuracy $local_acc"
awk -v a="$local_acc" 'BEGIN { exit !(a >= 0.90) }' || fail "local training reached $local_acc (< 0.90)"
echo "PASS"
