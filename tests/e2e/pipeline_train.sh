#!/usr/bin/env bash
# `tandem train` as a pipeline of four stages (cuts pool1,pool2,fc1), a real process each run:
# every synchronous schedule, on one thread and a thread a stage, exports the weights of the
# same training cut in two (within 1e-5); `tandem evaluate` on the merged export gives the
# accuracy the run printed; the metrics name each stage; the asynchronous schedule trains and
# exports; a wrong --parties and a cut list out of order are refused with the exact error.
# Usage: pipeline_train.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tandem=$build/tools/tandem diff=$build/tests/tandem_weights_diff
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# One backend for every stage, so that only the cuts and the schedules differ.
common=(--model "$model" --limit 2048 --test-limit 300 --batch 64 --microbatches 4 --edge-backend onednn --cloud-backend onednn)

run() {  # run NAME ARGS...: a training run, its output in $work/NAME.out, weights in $work/NAME.safetensors
  local name=$1; shift
  "$tandem" train "${common[@]}" --export "$work/$name.safetensors" --metrics-json "$work/$name.jsonl" "$@" \
    > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; fail "tandem train $name exited with $?"; }
}
run two --cut pool2
run gpipe --cut pool1,pool2,fc1 --pipeline-schedule gpipe
run onefoneb --cut pool1,pool2,fc1 --pipeline-schedule 1f1b --stage-threads
run zerobubble --cut pool1,pool2,fc1 --pipeline-schedule zero-bubble --stage-threads
for name in gpipe onefoneb zerobubble; do
  "$diff" "$work/two.safetensors" "$work/$name.safetensors" 1e-5 > "$work/diff.out" ||
    { cat "$work/diff.out"; fail "$name's four stages do not match two stages' weights"; }
done
grep -q "4 stages" "$work/onefoneb.out" || fail "the 1f1b run does not say it ran 4 stages: $(cat "$work/onefoneb.out")"
grep -q '"stage_busy_s":\[[0-9.]*,[0-9.]*,[0-9.]*,[0-9.]*\],"bubble":0\.[0-9]*' "$work/onefoneb.jsonl" ||
  fail "the metrics lack four stages' busy time and the bubble: $(cat "$work/onefoneb.jsonl")"

# The merged export is the whole model: evaluated alone it scores what the run printed.
printed=$(sed -n 's/^final test accuracy: \([0-9.]*\)%.*/\1/p' "$work/gpipe.out")
[[ -n $printed ]] || fail "no final accuracy in $(cat "$work/gpipe.out")"
"$tandem" evaluate --model "$model" --weights "$work/gpipe.safetensors" --test-limit 300 > "$work/eval.out" ||
  fail "tandem evaluate failed: $(cat "$work/eval.out")"
evaluated=$(sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' "$work/eval.out")
awk -v p="$printed" -v e="$evaluated" 'BEGIN { exit !(p > 25 && (p / 100 - e) < 1e-4 && (e - p / 100) < 1e-4) }' ||
  fail "the run printed $printed% and its export evaluates to $evaluated (or training stayed near chance)"

# Asynchronous: trains and exports a whole model too.
run async --cut pool1,pool2,fc1 --pipeline-schedule async --stage-threads
"$tandem" evaluate --model "$model" --weights "$work/async.safetensors" --test-limit 300 > /dev/null ||
  fail "the async run's export does not evaluate"

# Refused, with the error and exit status 1.
expect_error() {  # expect_error MESSAGE ARGS...
  local want=$1; shift
  set +e
  "$tandem" train "${common[@]}" "$@" > "$work/err.out" 2>&1
  local rc=$?
  set -e
  ((rc == 1)) || fail "tandem train $* exited with $rc, not 1: $(cat "$work/err.out")"
  grep -qF "$want" "$work/err.out" || fail "tandem train $* said '$(cat "$work/err.out")', not '$want'"
}
expect_error "tandem: [cli] --parties names 2 parties for 4 stages: give one a stage" \
  --cut pool1,pool2,fc1 --parties edge,cloud
expect_error "tandem: [split] cut 'pool1' must come after 'pool2': cuts are listed in the order the data flows through them" \
  --cut pool2,pool1
echo "ok: four stages equal two under gpipe, 1f1b and zero-bubble; the export evaluates to $evaluated; async trains; errors refused"
