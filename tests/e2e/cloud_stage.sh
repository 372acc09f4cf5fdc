#!/usr/bin/env bash
# A pipeline's first party against `tandem-cloud serve`: a hospital runs `tandem stage` with
# a two-party deployment whose later party is a tandem cloud service (its certificate's name,
# tandem-cloud, names the section). The cloud keeps the hospital's last stage as a session of
# its own (cloud/service: a StagePeer on the session's thread), taking the hospital's batch, K,
# schedule and wire dtype within its limits. The hospital's weights equal, to the bit, those of
# the same deployment run with `tandem stage` at both parties; a kill -9 of the cloud mid-run,
# restarted with the same command, ends on the same weights; a hospital planning a batch over
# the cloud's --batch is refused by name, and the cloud serves the next one.
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
stage_identities hospital tandem-cloud
port=$(free_ports 1)

# deployment NAME [BATCH]: $work/NAME.toml, the hospital and the party after it at $port.
deployment() {
  cat > "$work/$1.toml" << EOF
model = "$model"
cut = "pool2"
pipeline-schedule = "1f1b"
batch = ${2:-32}
microbatches = 2
wire-dtype = "f16"
epochs = 1
limit = 512
test-limit = 64
checkpoint-every = 2
[hospital]
identity = "id/hospital"
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
serve() {  # serve: the cloud service on $port, its state in $work/ca
  "$cloud_bin" serve --listen "127.0.0.1:$port" --state-dir "$work/ca" --model "$model" --cut pool2 --backend onednn \
    --batch 64 --microbatches 4 >> "$work/cloud.log" 2>&1 &
  cloud_pid=$!
  for _ in $(seq 1 100); do grep -q "listening on" "$work/cloud.log" && break; sleep 0.1; done
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

# kill -9 of the cloud once it has a checkpoint of step 4, restarted with the same command: the
# hospital links again and both go on from their newest common checkpoint.
deployment kill
rm -rf "$work/ca/checkpoints"
start kill hospital
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
deployment again
start again hospital
expect_ok again hospital
stop_cloud

echo "ok: a hospital's tandem stage trains against tandem-cloud serve (its own batch, K, schedule and f16 within the cloud's limits) to the weights of two tandem stages, to the bit; a kill -9 of the cloud mid-run, restarted, ends on the same weights; a batch over the cloud's is refused by name"
