#!/usr/bin/env bash
# A pipeline's first party against `tandem-cloud serve`: a hospital runs `tandem stage` with
# a two-party deployment whose later party is a tandem cloud service (its certificate's name,
# tandem-cloud, names the section). The cloud keeps the hospital's last stage as a session of
# its own (cloud/service: a StagePeer on the session's thread), taking the hospital's batch, K,
# schedule and wire dtype within its limits. The hospital's weights equal, to the bit, those of
# the same deployment run with `tandem stage` at both parties; the hospital started again after
# its run ended hears that it ended (the cloud recorded it); a kill -9 of the cloud mid-run,
# restarted with the same command, ends on the same weights (the cloud keeping only this run's
# checkpoints); a hospital planning a batch over the cloud's --batch is refused by name; a
# second hospital beyond the cloud's memory bound is told Busy and links again until it fits.
# Usage: cloud_stage.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tandem=$build/tools/tandem cloud_bin=$build/cloud/tandem-cloud diff=$build/tests/tandem_weights_diff
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
source "$src/tests/e2e/lib.sh"
trap 'stop_started; [[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
steps=$((512 / 32))

# The hospital's certificate and the cloud's (tandem-cloud's own, from `pki init` in $work/ca,
# which serves as the cloud's state folder); tandem-cloud also for the `tandem stage` peer.
stage_identities hospital hospital-b tandem-cloud
port=$(free_ports 1)

# deployment NAME [BATCH [LIMIT [HOSPITAL]]]: $work/NAME.toml, the hospital and the party after
# it at $port.
deployment() {
  cat > "$work/$1.toml" << EOF
model = "$model"
cut = "pool2"
pipeline-schedule = "1f1b"
batch = ${2:-32}
microbatches = 2
wire-dtype = "f16"
epochs = 1
limit = ${3:-512}
test-limit = 64
checkpoint-every = 2
[${4:-hospital}]
identity = "id/${4:-hospital}"
backend = "onednn"
export = "$1-hospital.safetensors"
checkpoint-dir = "$1-ckpt-hospital"
[tandem-cloud]
address = "127.0.0.1:$port"
identity = "id/tandem-cloud"
backend = "onednn"
checkpoint-dir = "$1-ckpt-cloud"
EOF
}
declare -A pids
start() {  # start NAME PARTY: PARTY of NAME.toml in the background, its output in NAME-PARTY.out
  "$tandem" stage --deployment "$work/$1.toml" --party "$2" --wait-s 30 --silence-s 30 > "$work/$1-$2.out" 2>&1 &
  pids[$2]=$!
}
expect_ok() {  # expect_ok NAME PARTY: PARTY's run NAME exited 0
  local rc=0
  wait "${pids[$2]}" || rc=$?
  ((rc == 0)) || { cat "$work/$1-$2.out"; fail "$1: $2 exited with $rc"; }
}
serve() {  # serve [ARGS...]: the cloud service on $port, its state in $work/ca, once it listens
  local before
  before=$(grep -c "listening on" "$work/cloud.log" 2> /dev/null || true)
  "$cloud_bin" serve --listen "127.0.0.1:$port" --state-dir "$work/ca" --model "$model" --cut pool2 --backend onednn \
    --batch 64 --microbatches 4 "$@" >> "$work/cloud.log" 2>&1 &
  cloud_pid=$!
  for _ in $(seq 1 100); do (($(grep -c "listening on" "$work/cloud.log") > ${before:-0})) && break; sleep 0.1; done
}
# cloud_said COUNT TEXT: waits until the cloud's log has COUNT lines with TEXT.
cloud_said() {
  for _ in $(seq 1 1500); do (($(grep -cF "$2" "$work/cloud.log") >= $1)) && return 0; sleep 0.02; done
  fail "the cloud did not say '$2' $1 times: $(cat "$work/cloud.log")"
}
epoch_line() { grep -o '"test_loss":[0-9.]*,"test_accuracy":[0-9.]*' "$work/$1-hospital.out"; }

# Both parties as `tandem stage`: the weights to meet.
deployment pair
start pair tandem-cloud
start pair hospital
expect_ok pair hospital
expect_ok pair tandem-cloud

# The same hospital against tandem-cloud serve.
deployment cloud
serve
start cloud hospital
expect_ok cloud hospital
grep -q "\"party\":\"hospital\",\"stage\":0,\"steps\":$steps," "$work/cloud-hospital.out" ||
  fail "the hospital did not train $steps steps: $(tail -3 "$work/cloud-hospital.out")"
"$diff" "$work/pair-hospital.safetensors" "$work/cloud-hospital.safetensors" 0 > /dev/null ||
  fail "against tandem-cloud the hospital's weights differ: $("$diff" "$work/pair-hospital.safetensors" "$work/cloud-hospital.safetensors" 0 2>&1)"
[[ $(epoch_line cloud) == "$(epoch_line pair)" ]] ||
  fail "the evaluation through tandem-cloud ($(epoch_line cloud)) differs from the pair's ($(epoch_line pair))"
grep -q "(hospital): a pipeline's last stage cut at 'pool2', 1f1b schedule, from step 0" "$work/cloud.log" &&
  grep -q "(hospital): the party ended its run at step $steps" "$work/cloud.log" ||
  fail "the cloud did not serve the hospital's run: $(cat "$work/cloud.log")"

# The hospital started again after its run ended: the cloud recorded the end, and answers Bye.
start cloud hospital
expect_ok cloud hospital
grep -qF "the run ended at step $steps at this party and every one after it" "$work/cloud-hospital.out" ||
  fail "the hospital started again after its end did not hear it: $(cat "$work/cloud-hospital.out")"
grep -qF "(hospital): its run ended here at step $steps before: answered Bye" "$work/cloud.log" ||
  fail "the cloud did not answer the ended run with Bye: $(cat "$work/cloud.log")"
"$diff" "$work/pair-hospital.safetensors" "$work/cloud-hospital.safetensors" 0 > /dev/null ||
  fail "the ended run's export changed"

# kill -9 of the cloud once it has a checkpoint of step 4 of a new run (the cloud keeps the
# last run's checkpoints until this one links: then only its own), restarted with the same
# command: the hospital links again and both go on from their newest common checkpoint.
deployment kill
from0=$(grep -cF "(hospital): a pipeline's last stage cut at 'pool2', 1f1b schedule, from step 0" "$work/cloud.log")
start kill hospital
cloud_said $((from0 + 1)) "(hospital): a pipeline's last stage cut at 'pool2', 1f1b schedule, from step 0"
for _ in $(seq 1 1500); do has_checkpoint_from "$work/ca/checkpoints/hospital" 4 && break; sleep 0.02; done
has_checkpoint_from "$work/ca/checkpoints/hospital" 4 || fail "the cloud wrote no checkpoint of step 4"
kill -9 "$cloud_pid"
wait "$cloud_pid" || true
serve
expect_ok kill hospital
"$diff" "$work/pair-hospital.safetensors" "$work/kill-hospital.safetensors" 0 > /dev/null ||
  fail "after the cloud's kill the hospital's weights differ: $("$diff" "$work/pair-hospital.safetensors" "$work/kill-hospital.safetensors" 0 2>&1)"
grep -q '"restarts":1,' "$work/kill-hospital.out" || fail "the hospital did not link again once: $(tail -2 "$work/kill-hospital.out")"

# A batch over the cloud's --batch: refused by name; the cloud then serves the next hospital.
deployment big 128
rc=0
"$tandem" stage --deployment "$work/big.toml" --party hospital --wait-s 10 > "$work/big-hospital.out" 2>&1 || rc=$?
((rc == 1)) && grep -qF "the next stage ended the run: the previous stage plans steps of at most 128 samples in 2 micro-batches, and stage 1 takes at most 64 in 4: plan a smaller batch or fewer micro-batches" "$work/big-hospital.out" ||
  fail "a batch over the cloud's: exit $rc, $(cat "$work/big-hospital.out")"

# Memory for one session (about 8 MiB at the cloud's batch): hospital-b, linking while the
# hospital's session holds it (the hospital paused with SIGSTOP), is told Busy and links again
# after a while, until the hospital's session ends.
stop_cloud
serve --session-memory-mb 12
deployment long 32 2048
deployment busy 32 256 hospital-b
long_from=$(grep -cF "(hospital): a pipeline's last stage cut at 'pool2', 1f1b schedule, from step 0" "$work/cloud.log")
start long hospital
cloud_said $((long_from + 1)) "(hospital): a pipeline's last stage cut at 'pool2', 1f1b schedule, from step 0"
kill -STOP "${pids[hospital]}"
start busy hospital-b
cloud_said 1 "(hospital-b): closed: this session's back shard"
kill -CONT "${pids[hospital]}"
expect_ok long hospital
expect_ok busy hospital-b
grep -qF "the next stage is busy: this session's back shard" "$work/busy-hospital-b.out" &&
  grep -q "linking again in [0-9.]* s" "$work/busy-hospital-b.out" ||
  fail "hospital-b was not told Busy and did not wait: $(cat "$work/busy-hospital-b.out")"
grep -q "\"party\":\"hospital-b\",\"stage\":0,\"steps\":8," "$work/busy-hospital-b.out" ||
  fail "hospital-b did not train its 8 steps: $(tail -2 "$work/busy-hospital-b.out")"
stop_cloud

echo "ok: a hospital's tandem stage trains against tandem-cloud serve (its own batch, K, schedule and f16 within the cloud's limits) to the weights of two tandem stages, to the bit; started again after its end it hears the run ended; a kill -9 of the cloud mid-run, restarted, ends on the same weights; a batch over the cloud's is refused by name; a hospital beyond the cloud's memory is told Busy and links again until it fits"
