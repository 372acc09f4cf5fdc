#!/usr/bin/env bash
# Pretrained weights under Hugging Face's names: the forms-layoutlm encoder built with torch.nn
# under LayoutLM's module names (tests/interop/layoutlm_check.py) saves seeded weights; tandem
# evaluate loads that file and its logits equal torch's within 1e-4; then a split run where
# each side loads only its shard of the same file (--init-from on both) evaluates through the
# cloud to the same accuracy.
# Usage: layoutlm_interop.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
model=$src/samples/forms-layoutlm/model.json
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $work/cloud.log ]] && { echo "--- cloud log"; cat "$work/cloud.log"; }; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "SKIP: /usr/bin/python3 has no torch (install python3-torch; scripts/setup.sh does)"; exit 77; }

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
echo "PASS"
