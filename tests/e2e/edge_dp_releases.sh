#!/usr/bin/env bash
# Noise on the cut counts releases, not steps, across processes: tandem-edge with --dp-clip,
# --dp-noise and --checkpoint-dir against a real cloud. An uninterrupted run of 20 steps
# leaves a count of 20 in DIR/dp-releases. The same run killed (-9) after it has sent a step
# past its newest checkpoint and started again resumes from that checkpoint and sends those
# steps again: its count is what it had sent when killed plus the steps after the checkpoint,
# more than 20, and its epsilon is larger than the uninterrupted run's. The same folder under
# another noise is refused by name.
# Usage: edge_dp_releases.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
source "$src/tests/e2e/lib.sh"
trap 'stop_started; [[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

start_cloud_as cloud
for client in straight killed; do
  "$cloud_bin" pki issue --state-dir "$work/state" --client "$client" --out "$work/id-$client" > /dev/null
done
# 1280 samples in batches of 64: 20 steps; a checkpoint every 2.
edge() {  # edge CLIENT [ARGS...]: in the background, output in $work/CLIENT.out (appended)
  local client=$1
  shift
  "$edge_bin" train --model "$model" --epochs 1 --limit 1280 --test-limit 100 --batch 64 --microbatches 4 \
    --checkpoint-every 2 --seed 3 --reconnects 0 --dp-clip 4 --dp-noise 1 --cloud "wss://localhost:$port" \
    --identity "$work/id-$client" --checkpoint-dir "$work/ckpt-$client" "$@" >> "$work/$client.out" 2>&1 &
  edge_pid=$!
}
released() { sed -n 's/^releases \([0-9]*\)$/\1/p' "$work/ckpt-$1/dp-releases" 2> /dev/null || true; }
epsilon() { sed -n 's/.*differential privacy on the cut: epsilon \([0-9.]*\) at delta.*/\1/p' "$work/$1.out" | tail -1; }

edge straight
wait "$edge_pid" || { cat "$work/straight.out"; fail "the uninterrupted run failed"; }
[[ $(released straight) == 20 ]] || fail "the uninterrupted run counted '$(released straight)' releases, not 20"

edge killed
newest=""
for _ in $(seq 1 1500); do
  newest=$( (ls "$work/ckpt-killed" 2> /dev/null || true) | sed -n 's/^edge-0*\([0-9][0-9]*\)\.tdmc$/\1/p' | sort -n | tail -1)
  sent=$(released killed)
  [[ -n $newest ]] && ((${sent:-0} > newest)) && break
  kill -0 "$edge_pid" 2> /dev/null || break
  sleep 0.01
done
kill -9 "$edge_pid" 2> /dev/null || fail "the run ended before a step past its checkpoint could be lost: $(tail -3 "$work/killed.out")"
wait "$edge_pid" 2> /dev/null || true
at_kill=$(released killed)
edge killed
wait "$edge_pid" || { cat "$work/killed.out"; fail "the restarted run failed"; }
from=$(sed -n 's/.*resuming from the checkpoint of step \([0-9]*\).*/\1/p' "$work/killed.out" | tail -1)
[[ -n $from ]] || fail "the restarted edge did not resume: $(cat "$work/killed.out")"
grep -q "dp-releases: $at_kill noised releases of the training set before this process" "$work/killed.out" ||
  fail "the restarted edge did not say what it had released: $(cat "$work/killed.out")"
want=$((at_kill + 20 - from))
((want > 20)) || fail "killed at $at_kill releases, resumed from step $from: no step was sent twice"
[[ $(released killed) == "$want" ]] ||
  fail "killed after $at_kill releases and resumed from step $from: counted $(released killed), not $want"
a=$(epsilon straight) b=$(epsilon killed)
awk -v a="$a" -v b="$b" 'BEGIN { exit !(a > 0 && b > a) }' ||
  fail "the restarted run's epsilon '$b' is not above the uninterrupted run's '$a'"

# Another noise on the same folder: its releases do not simply add up with these.
edge killed --dp-noise 2
rc=0
wait "$edge_pid" || rc=$?
((rc != 0)) || fail "a run under another noise used the folder's count"
grep -q "dp-releases counts the releases of another plan (another noise, batch or data" "$work/killed.out" ||
  fail "another noise was not refused by name: $(tail -3 "$work/killed.out")"
stop_cloud
echo "ok: epsilon counts releases across a kill -9 and restart ($at_kill sent before the kill, from step $from again: $want releases, epsilon $a -> $b); another noise on the same count refused"
