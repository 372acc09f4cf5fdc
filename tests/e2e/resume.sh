#!/usr/bin/env bash
# Exact resume with real processes: one uninterrupted split-training run, and the same run
# with the edge, then the cloud, killed (SIGKILL) at random points, 5 times each, and
# restarted with the same commands. Both runs' final checkpoints, exported with tandem
# export, must be byte-identical: no step lost, none applied twice. Then the newest edge
# checkpoint is bit-flipped: refused, the previous one used, the same weights reached.
# Each kill comes at a random moment after the run has made progress since the last restart.
# CUT: both sides' cut (default: the spec's); "A,B" runs it U-shaped, where the edge's
# checkpoints hold the tail too and the export puts the three parts together.
# Usage: resume.sh BUILD_DIR SOURCE_DIR [KILLS_EACH] [SAMPLES] [CUT]
set -euo pipefail
build=$1 src=$2 kills_each=${3:-5} samples=${4:-4800}
cut_args=()
[[ -n ${5:-} ]] && cut_args=(--cut "$5")
cloud_bin=$build/cloud/tandem-cloud edge_bin=$build/edge/tandem-edge tandem_bin=$build/tools/tandem
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
cleanup() { kill -9 ${cloud_pid:-} ${edge_pid:-} 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- cloud log"; tail -20 "$work/cloud.log"; echo "--- edge log"; tail -5 "$work/edge.out"; exit 1; }
source "$src/tests/e2e/lib.sh"  # same_final_weights
RANDOM=${TANDEM_TEST_SEED:-$$}

port=0
start_cloud() {
  "$cloud_bin" serve --listen "127.0.0.1:$port" --state-dir "$work/state" --model "$model" "${cut_args[@]}" \
    >> "$work/cloud.log" 2>&1 &
  cloud_pid=$!
  for _ in $(seq 1 100); do
    p=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/cloud.log" | tail -1 | cut -d: -f3 || true)
    [[ -n $p ]] && kill -0 "$cloud_pid" 2>/dev/null && [[ $(grep -c 'listening on' "$work/cloud.log") -ge $starts ]] && break
    sleep 0.1
  done
  port=$p
  [[ -n $port ]] || fail "the cloud did not start"
}
starts=1; start_cloud
# One identity per client: the cloud binds a client id to its certificate's name.
for client in straight resumed; do
  "$cloud_bin" pki issue --state-dir "$work/state" --client "$client" --out "$work/id-$client" > /dev/null
done

# 2 epochs of SAMPLES samples, batch 32, a checkpoint every step. --reconnects 0: this is the
# restart by hand (the edge ends when its cloud dies; resume.heal has an edge reconnect itself).
edge_args=(train --model "$model" --epochs 2 --limit "$samples" --test-limit 200 --batch 32
           --microbatches 4 --checkpoint-every 1 --seed 3 --reconnects 0 "${cut_args[@]}")
run_edge() {  # run_edge CLIENT: in the background, output appended to $work/edge.out
  "$edge_bin" "${edge_args[@]}" --cloud "wss://localhost:$port" --identity "$work/id-$1" --checkpoint-dir "$work/ckpt-$1" \
    >> "$work/edge.out" 2>&1 &
  edge_pid=$!
}
final=$(printf %012d $((2 * ((samples + 31) / 32))))

run_edge straight
wait "$edge_pid" || fail "the uninterrupted run failed"
edge_pid=

edge_kills=0 cloud_kills=0 restarts=0
while :; do
  run_edge resumed
  restarts=$((restarts + 1))
  ((restarts < 60)) || fail "no end after $restarts restarts"
  if ((edge_kills + cloud_kills < 2 * kills_each)); then
    # Wait for a checkpoint newer than any before this start, then 0 to 0.49 s more.
    before=$(ls "$work/ckpt-resumed" 2>/dev/null | tail -1 || true)
    while kill -0 "$edge_pid" 2>/dev/null && [[ $(ls "$work/ckpt-resumed" 2>/dev/null | tail -1) == "$before" ]]; do
      sleep 0.02
    done
    sleep "0.$((RANDOM % 5))$((RANDOM % 10))"
    if kill -0 "$edge_pid" 2>/dev/null; then
      if ((edge_kills <= cloud_kills)); then
        kill -9 "$edge_pid"; wait "$edge_pid" 2>/dev/null || true
        edge_kills=$((edge_kills + 1))
        echo "killed the edge ($edge_kills), at $(ls "$work/ckpt-resumed" | tail -1)"
      else
        kill -9 "$cloud_pid"; wait "$cloud_pid" 2>/dev/null || true
        cloud_kills=$((cloud_kills + 1))
        echo "killed the cloud ($cloud_kills), at $(ls "$work/state/checkpoints/resumed" | tail -1)"
        wait "$edge_pid" 2>/dev/null && fail "the edge finished without its cloud"
        starts=$((starts + 1)); start_cloud
      fi
      edge_pid=
      continue
    fi
  fi
  wait "$edge_pid" || fail "the resumed run failed"
  edge_pid=
  break
done
echo "$edge_kills edge kills, $cloud_kills cloud kills, $restarts edge starts"
((edge_kills == kills_each && cloud_kills == kills_each)) || fail "the run ended before $kills_each kills of each"
grep -c "resuming from the checkpoint of step" "$work/edge.out" | xargs echo "resumed starts:"

same_final_weights straight resumed "$final"
echo "final weights of the interrupted run equal the uninterrupted run's, byte for byte"

# A bit flipped in the edge's newest checkpoint: refused with the reason, the one before is
# used (the cloud still has its own of that step), and the last step is trained again to the
# same weights.
ckpt="$work/ckpt-resumed/edge-$final.tdmc"
/usr/bin/env python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=4; open(p,'wb').write(b)" "$ckpt" 2>/dev/null ||
  printf '\x55' | dd of="$ckpt" bs=1 seek=100 conv=notrunc status=none
run_edge resumed
wait "$edge_pid" || fail "the run after a corrupt checkpoint failed"
edge_pid=
grep -q "refused checkpoint .*edge-$final.tdmc: \[aes-gcm\] authentication failed" "$work/edge.out" ||
  fail "the corrupt checkpoint was not refused with the reason"
grep -q "resuming from the checkpoint of step $((10#$final - 1))" "$work/edge.out" || fail "not resumed from the step before"
"$tandem_bin" export --model "$model" --edge-ckpt "$ckpt" --identity "$work/id-resumed" \
  --cloud-ckpt "$work/state/checkpoints/resumed/cloud-$final.tdmc" --out "$work/again.safetensors" > /dev/null ||
  fail "export after the corrupt checkpoint"
cmp "$work/straight.safetensors" "$work/again.safetensors" || fail "the weights after the corrupt checkpoint differ"
echo "PASS: and a bit-flipped newest checkpoint is refused, the one before used, the same weights reached"
