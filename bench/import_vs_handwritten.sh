#!/usr/bin/env bash
# ONNX import's speed: a model written in PyTorch, exported to ONNX and imported (`tandem
# import`), against tandem's hand-written spec of the same graph:
#  resnet18:  CIFAR's ResNet18 (torchvision's resnet18 with a 3x3 stem and no max pool), cut
#             at module layer1, against samples/models/resnet18-32.json (67 nodes), on
#             BATCH * STEPS random images;
#  spam-bert: a BERT-style classifier under Hugging Face's names (tests/interop/hf_encoder.py:
#             4 layers, hidden 256, 4 heads, 128 tokens, vocabulary 8000, no dropout), cut at
#             module bert.encoder.layer.1, its mask's length buckets 32,64,96 (tandem import
#             --length-buckets), against samples/spam-bert/model.json, on the first
#             BATCH * STEPS mails of samples/spam-bert/data (scripts/setup.sh prepares them).
# Both train split in one process (`tandem train`, one thread, BATCH samples a step, K
# micro-batches) two epochs; the second epoch's samples/s counts. They alternate for ROUNDS
# rounds (default 3); prints each round, the medians and the ratio imported / hand-written,
# and fails below 0.95 (issue: within 5%) or when either run fails.
# Usage: bash bench/import_vs_handwritten.sh [MODEL [BATCH K STEPS]]
#        (default resnet18 64 4 8; spam-bert 32 4 8; ROUNDS)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-resnet18}
case $model in
  resnet18) default_batch=64 ;;
  spam-bert) default_batch=32 ;;
  *) echo "usage: bash bench/import_vs_handwritten.sh [resnet18|spam-bert [BATCH K STEPS]]" >&2; exit 2 ;;
esac
batch=${2:-$default_batch} k=${3:-4} steps=${4:-8} rounds=${ROUNDS:-3}
tandem=$PWD/build/release/tools/tandem
[[ -x $tandem ]] || bash scripts/setup.sh release > /dev/null
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null || { echo "needs python3-torch and python3-torchvision (scripts/setup.sh installs them)"; exit 1; }
fail() { echo "FAIL: $*" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ $model == resnet18 ]]; then
  hand=samples/models/resnet18-32.json data=$work/data
  /usr/bin/python3 - "$work/model.onnx" <<'PY'
import sys, warnings, torch, torchvision
model = torchvision.models.resnet18(num_classes=10)
model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # CIFAR's stem: 3x3, stride 1, no max pool
model.maxpool = torch.nn.Identity()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(model, torch.randn(2, 3, 32, 32), sys.argv[1], training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=14, input_names=["image"],
                      dynamic_axes={"image": {0: "batch"}})
PY
  import_args=(--cut layer1)
  /usr/bin/python3 bench/random_dataset.py "$hand" "$data" $((batch * steps)) "$batch"
else
  hand=samples/spam-bert/model.json data=samples/spam-bert/data
  [[ -f $data/train.safetensors ]] || fail "no $data/train.safetensors: run bash scripts/setup.sh"
  /usr/bin/python3 - "$work/model.onnx" <<'PY'
import sys, warnings, torch
sys.path.insert(0, "tests/interop")
from hf_encoder import BertForSequenceClassification
model = BertForSequenceClassification(vocab=8000, tokens=128, hidden=256, layers=4, heads=4, inter=1024, classes=2, p=0.0)
ids, mask = torch.randint(0, 8000, (2, 128)), torch.ones(2, 128, dtype=torch.int64)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(model, (ids, mask), sys.argv[1], training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=14, input_names=["input_ids", "attention_mask"],
                      dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}})
PY
  import_args=(--cut bert.encoder.layer.1 --length-buckets 32,64,96)
fi
"$tandem" import "$work/model.onnx" --out "$work/imported" "${import_args[@]}" > "$work/import.out" || fail "import: $(cat "$work/import.out")"
head -1 "$work/import.out"

run() {  # run SPEC: the second epoch's samples/s
  OMP_NUM_THREADS=1 "$tandem" train --model "$1" --data "$data" --epochs 2 --batch "$batch" --microbatches "$k" \
    --limit $((batch * steps)) --test-limit "$batch" --metrics-json "$work/m.jsonl" > "$work/train.out" 2>&1 || fail "$1: $(tail -3 "$work/train.out")"
  sed -n 's/.*"epoch":2,.*"samples_per_s":\([0-9.]*\).*/\1/p' "$work/m.jsonl" | tail -1
  rm -f "$work/m.jsonl"
}
echo "$model: batch $batch, K $k, $steps steps an epoch, $rounds rounds (each: hand-written, then imported)"
hand_sps=() imp_sps=()
for ((r = 1; r <= rounds; r++)); do
  h=$(run "$hand") i=$(run "$work/imported/model.json")
  [[ -n $h && -n $i ]] || fail "round $r: no second-epoch samples/s"
  echo "round $r: hand-written $h samples/s, imported $i samples/s"
  hand_sps+=("$h") imp_sps+=("$i")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mh=$(median "${hand_sps[@]}") mi=$(median "${imp_sps[@]}")
ratio=$(awk -v a="$mi" -v b="$mh" 'BEGIN { printf "%.3f", a / b }')
echo "median: hand-written $mh samples/s, imported $mi samples/s: imported / hand-written = $ratio (bar: at least 0.95)"
awk -v r="$ratio" 'BEGIN { exit !(r >= 0.95) }' || fail "the imported model trains at $ratio of the hand-written one's speed"
