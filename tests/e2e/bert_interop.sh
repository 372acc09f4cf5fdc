#!/usr/bin/env bash
# A Hugging Face BERT checkpoint as such files come (tests/interop/bert_check.py: BF16 weights,
# a 64-row position table for a 16-token model, a token-type table, the embeddings' LayerNorm
# as gamma and beta, position_ids and an MLM head's bias beside): tandem evaluate loads it and
# its logits equal torch's within 1e-4; a split run where each side reads only its shard of
# the file (--init-from on both) evaluates to the same accuracy; after 2 training steps,
# tandem export's file loads strictly into the same torch BERT (16 positions, a zero
# token-type table) and its logits equal tandem's; a checkpoint whose weights are F64 is
# refused with the exact error.
# Usage: bert_interop.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $work/cloud.log ]] && { echo "--- cloud log"; cat "$work/cloud.log"; }; exit 1; }
source "$src/tests/lib/skip.sh"
/usr/bin/python3 -c 'import torch' 2>/dev/null || skip_or_fail "/usr/bin/python3 has no torch (install python3-torch; scripts/setup.sh does)"
model=$work/tiny-bert.json

# The forms pages' ids and masks (their boxes unread): 16 tokens, ids below 32.
python3 "$src/samples/forms-layoutlm/make_data.py" "$work/forms" 200 300 > /dev/null
/usr/bin/python3 "$src/tests/interop/bert_check.py" spec "$model"
/usr/bin/python3 "$src/tests/interop/bert_check.py" write "$work/hf.safetensors" "$work/forms" "$work/torch.f32" ||
  fail "torch could not write the checkpoint"
"$tandem_bin" evaluate --model "$model" --weights "$work/hf.safetensors" --data "$work/forms" --logits "$work/tandem.f32" \
  > "$work/eval.json" 2> "$work/eval.err" || fail "tandem evaluate: $(cat "$work/eval.err")"
cat "$work/eval.json"
/usr/bin/python3 "$src/tests/interop/layoutlm_check.py" compare "$work/torch.f32" "$work/tandem.f32" ||
  fail "tandem's logits differ from torch's"

source "$src/tests/e2e/lib.sh"
start_cloud_as cloud --init-from "$work/hf.safetensors"
"$cloud_bin" pki issue --state-dir "$work/state" --client clinic-bert --out "$work/c" > /dev/null
"$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/c" --model "$model" --data "$work/forms" \
  --epochs 0 --init-from "$work/hf.safetensors" --metrics-json "$work/init.jsonl" > "$work/init.out" 2>&1 ||
  fail "edge --init-from: $(tail -3 "$work/init.out")"
want=$(grep -o '"test_accuracy":[0-9.]*' "$work/eval.json" | cut -d: -f2)
got=$(grep -o '"test_accuracy":[0-9.]*' "$work/init.jsonl" | cut -d: -f2)
echo "accuracy of the Hugging Face checkpoint: tandem evaluate $want, split run from --init-from $got"
awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; exit !(d < 0.004 && d > -0.004) }' || fail "--init-from run measured $got, evaluate $want"

# Two steps from the checkpoint, exported: Hugging Face's BERT loads the file as it is.
stop_cloud
start_cloud_as cloud-trained --init-from "$work/hf.safetensors"
"$cloud_bin" pki issue --state-dir "$work/state" --client clinic-trained --out "$work/t" > /dev/null
"$edge_bin" train --cloud "wss://localhost:$port" --identity "$work/t" --model "$model" --data "$work/forms" \
  --init-from "$work/hf.safetensors" --limit 64 --batch 32 --epochs 1 --test-limit 1 --checkpoint-dir "$work/ckpt" \
  --checkpoint-every 2 > "$work/trained.out" 2>&1 || fail "edge, 2 steps: $(tail -3 "$work/trained.out")"
stop_cloud
cloud_pid=
"$tandem_bin" export --model "$model" --edge-ckpt "$work/ckpt/edge-000000000002.tdmc" \
  --cloud-ckpt "$work/state/checkpoints/clinic-trained/cloud-000000000002.tdmc" --identity "$work/t" \
  --out "$work/exported.safetensors" > "$work/export.out" 2>&1 || fail "export: $(cat "$work/export.out")"
"$tandem_bin" evaluate --model "$model" --weights "$work/exported.safetensors" --data "$work/forms" \
  --logits "$work/tandem-exported.f32" > /dev/null 2> "$work/eval.err" || fail "evaluate the export: $(cat "$work/eval.err")"
/usr/bin/python3 "$src/tests/interop/bert_check.py" load "$work/exported.safetensors" "$work/forms" "$work/torch-exported.f32" ||
  fail "torch's BERT could not load tandem's export"
/usr/bin/python3 "$src/tests/interop/layoutlm_check.py" compare "$work/torch-exported.f32" "$work/tandem-exported.f32" ||
  fail "the exported model's logits differ between torch and tandem"
cmp -s "$work/torch.f32" "$work/torch-exported.f32" && fail "two training steps did not change the logits"

# A dtype tandem does not widen: the exact error.
/usr/bin/python3 - "$work/hf.safetensors" "$work/f64.safetensors" <<'PY'
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
header["bert.pooler.dense.bias"]["dtype"] = "F64"
a, b = header["bert.pooler.dense.bias"]["data_offsets"]
data = blob[8 + n:]
data = data[:a] + data[a:b] * 4 + data[b:]  # F64's 8 bytes a value where BF16 had 2
for v in header.values():
    if isinstance(v, dict) and "data_offsets" in v and v["data_offsets"][0] >= b:
        v["data_offsets"] = [v["data_offsets"][0] + 3 * (b - a), v["data_offsets"][1] + 3 * (b - a)]
header["bert.pooler.dense.bias"]["data_offsets"] = [a, a + 4 * (b - a)]
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data)
PY
"$tandem_bin" evaluate --model "$model" --weights "$work/f64.safetensors" --data "$work/forms" > "$work/f64.out" 2>&1 &&
  fail "F64 weights were taken"
grep -q "dtype 'F64' is not supported (tandem reads F32, F16, BF16, I32, I64, U8 and BOOL)" "$work/f64.out" ||
  fail "F64 weights: $(cat "$work/f64.out")"
echo "PASS"
