#!/usr/bin/env bash
# Pretrained weights under Hugging Face's names: the forms-layoutlm encoder built with torch.nn
# under LayoutLM's module names (tests/interop/layoutlm_check.py) saves seeded weights; tandem
# evaluate loads that file and its logits equal torch's within 1e-4; then a split run where
# each side loads only its shard of the same file (--init-from on both) evaluates through the
# cloud to the same accuracy. Last, both sides train from that file for 3 steps of plain SGD
# on the same 32 pages (K=4 micro-batches), the run is exported, and the trained model's
# logits again equal those of torch after the same 3 steps, within 1e-4.
# Usage: layoutlm_interop.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
model=$src/samples/forms-layoutlm/model.json
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $work/cloud.log ]] && { echo "--- cloud log"; cat "$work/cloud.log"; }; exit 1; }
source "$src/tests/lib/skip.sh"
/usr/bin/python3 -c 'import torch' 2>/dev/null || skip_or_fail "/usr/bin/python3 has no torch (install python3-torch; scripts/setup.sh does)"

python3 "$src/samples/forms-layoutlm/make_data.py" "$work/forms" 200 300 > /dev/null
/usr/bin/python3 "$src/tests/interop/layoutlm_check.py" write "$work/hf.safetensors" "$work/forms" "$work/torch.f32" ||
  fail "torch could not write the model"
"$tandem_bin" evaluate --model "$model" --weights "$work/hf.safetensors" --data "$work/forms" --logits "$work/tandem.f32" \
  > "$work/eval.json" 2> "$work/eval.err" || fail "tandem evaluate: $(cat "$work/eval.err")"
cat "$work/eval.json"
/usr/bin/python3 "$src/tests/interop/layoutlm_check.py" compare "$work/torch.f32" "$work/tandem.f32" ||
  fail "tandem's logits differ from torch's"

source "$src/tests/e2e/lib.sh"
start_cloud_as cloud --init-from "$work/hf.safetensors"
"$cloud_bin" pki issue --state-dir "$work/state" --client clinic-hf --out "$work/c" > /dev/null
"$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/c" --model "$model" --data "$work/forms" \
  --epochs 0 --init-from "$work/hf.safetensors" --metrics-json "$work/init.jsonl" > "$work/init.out" 2>&1 ||
  fail "edge --init-from: $(tail -3 "$work/init.out")"
grep -q "front shard initialised from" "$work/init.out" || fail "the edge did not load its shard: $(cat "$work/init.out")"
want=$(grep -o '"test_accuracy":[0-9.]*' "$work/eval.json" | cut -d: -f2)
got=$(grep -o '"test_accuracy":[0-9.]*' "$work/init.jsonl" | cut -d: -f2)
echo "accuracy of the Hugging Face-named weights: tandem evaluate $want, split run from --init-from $got"
awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; exit !(d < 0.004 && d > -0.004) }' || fail "--init-from run measured $got, evaluate $want"

# Equality after training: 3 steps of SGD (lr 0.1, no momentum), each on all of the first 32
# training pages (one step an epoch: the order within a step does not change its mean loss).
stop_cloud
start_cloud_as cloud-trained --init-from "$work/hf.safetensors" --optimizer sgd --lr 0.1 --momentum 0
"$cloud_bin" pki issue --state-dir "$work/state" --client clinic-trained --out "$work/t" > /dev/null
"$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/t" --model "$model" --data "$work/forms" \
  --init-from "$work/hf.safetensors" --limit 32 --batch 32 --microbatches 4 --epochs 3 --test-limit 1 \
  --optimizer sgd --lr 0.1 --momentum 0 --checkpoint-dir "$work/ckpt" --checkpoint-every 3 \
  > "$work/trained.out" 2>&1 || fail "edge, 3 steps from --init-from: $(tail -3 "$work/trained.out")"
stop_cloud
cloud_pid=
"$tandem_bin" export --model "$model" --edge-ckpt "$work/ckpt/edge-000000000003.tdmc" \
  --cloud-ckpt "$work/state/checkpoints/clinic-trained/cloud-000000000003.tdmc" --identity "$work/t" \
  --out "$work/trained.safetensors" > "$work/export.out" 2>&1 || fail "export after 3 steps: $(cat "$work/export.out")"
"$tandem_bin" evaluate --model "$model" --weights "$work/trained.safetensors" --data "$work/forms" \
  --logits "$work/tandem-trained.f32" > /dev/null 2> "$work/eval.err" || fail "tandem evaluate (trained): $(cat "$work/eval.err")"
/usr/bin/python3 "$src/tests/interop/layoutlm_check.py" train "$work/hf.safetensors" "$work/forms" 32 3 0.1 \
  "$work/torch-trained.f32" || fail "torch could not train the model"
cmp -s "$work/torch.f32" "$work/torch-trained.f32" && fail "3 steps of SGD did not change torch's logits"
/usr/bin/python3 "$src/tests/interop/layoutlm_check.py" compare "$work/torch-trained.f32" "$work/tandem-trained.f32" ||
  fail "after 3 training steps tandem's logits differ from torch's"
echo "PASS"
