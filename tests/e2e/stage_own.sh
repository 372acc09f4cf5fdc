#!/usr/bin/env bash
# later-stages = "own": one cloud keeps a last stage for each of two hospitals, their own
# models of the CNN, and serves both at once on one executor thread (pipeline/stage_host.h,
# `executors = 1`: their sessions interleave) over mutual TLS; hospital-b plans its own batch, K
# and wire dtype. Each hospital's weights, and the cloud's stage of them, equal that hospital's
# run alone against a cloud of its own, to the byte. A kill -9 of a hospital, restarted with
# the same command, restarts its session only (the other hospital never restarts); a kill -9
# of the cloud after hospital-b has ended its run restarts hospital-a's session from its
# checkpoint, and the new cloud, which finds hospital-b's end recorded, does not wait for it;
# either way every party ends on the uninterrupted run's weights. A cloud started after every
# run ended answers a hospital whose last Bye was lost, and exits 0. A hospital the file does not
# name is refused by the cloud.
# Usage: stage_own.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tandem=$build/tools/tandem cloud_bin=$build/cloud/tandem-cloud diff=$build/tests/tandem_weights_diff
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
source "$src/tests/e2e/lib.sh"
trap 'stop_started; [[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
epochs=2
# hospital-b plans its own batch, K and wire dtype (32 samples in 2 micro-batches, f16), within
# the run's (64 in 4): the cloud's session takes them, and hospital-b alone runs with them too.
declare -A steps=([hospital-a]=$((epochs * 512 / 64)) [hospital-b]=$((epochs * 128 / 32)))
own_terms=('batch = 32' 'microbatches = 2' 'wire-dtype = "f16"')

stage_identities hospital-a hospital-b cloud hospital-c

# deployment NAME PARTY...: $work/NAME.toml, the hospitals named (hospital-a on the first 512
# training samples, hospital-b on the first 128) and then the cloud, on a fresh port; with two
# hospitals the cloud keeps each one's last stage (later-stages = "own").
deployment() {
  local name=$1 p port
  shift
  port=$(free_ports 1)
  {
    echo "model = \"$model\""
    echo 'cut = "pool2"'
    echo "first-parties = $(($# - 1))"
    (($# == 2)) || echo 'later-stages = "own"'
    echo 'pipeline-schedule = "1f1b"'
    if [[ $* == "hospital-b cloud" ]]; then printf '%s\n' "${own_terms[@]}"; else printf '%s\n' 'batch = 64' 'microbatches = 4'; fi
    echo 'test-limit = 64'
    echo "epochs = $epochs"
    echo 'checkpoint-every = 2'
    for p in "$@"; do
      echo "[$p]"
      case $p in
        hospital-a) echo 'limit = 512' ;;
        hospital-b)
          echo 'limit = 128'
          (($# == 2)) || printf '%s\n' "${own_terms[@]}"
          ;;
        cloud)
          echo "address = \"127.0.0.1:$port\""
          (($# == 2)) || echo 'executors = 1'
          ;;
      esac
      echo "identity = \"id/$p\""
      echo 'backend = "onednn"'
      echo "export = \"$name-$p.safetensors\""
      echo "checkpoint-dir = \"$name-ckpt-$p\""
    done
  } > "$work/$name.toml"
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
same() {  # same A B: two exports of one stage, every tensor equal to the bit
  "$diff" "$work/$1" "$work/$2" 0 > /dev/null || fail "$1 and $2 differ: $("$diff" "$work/$1" "$work/$2" 0 2>&1)"
}
# expect_own_finished NAME: both hospitals and the cloud, every process exiting 0 with its summary.
expect_own_finished() {
  local h
  expect_ok "$1" cloud
  for h in hospital-a hospital-b; do
    expect_ok "$1" "$h"
    grep -q "\"party\":\"$h\",\"stage\":0,\"steps\":${steps[$h]}," "$work/$1-$h.out" ||
      fail "$1: $h did not train ${steps[$h]} steps: $(tail -3 "$work/$1-$h.out")"
    grep -q "\"party\":\"cloud\",\"session\":\"$h\",\"stage\":1,\"steps\":${steps[$h]}," "$work/$1-cloud.out" ||
      fail "$1: the cloud's session of $h did not train ${steps[$h]} steps: $(cat "$work/$1-cloud.out")"
  done
}

deployment own hospital-a hospital-b cloud
for p in cloud hospital-a hospital-b; do start own "$p"; done
expect_own_finished own
grep -q "listening on wss://127.0.0.1:[0-9]* for 'hospital-a', 'hospital-b', each with a last stage of its own, on 1 executor$" \
  "$work/own-cloud.out" || fail "the cloud does not serve both hospitals: $(cat "$work/own-cloud.out")"
grep -q '"test_loss":[0-9.]*,"test_accuracy":[0-9.]*' "$work/own-hospital-a.out" ||
  fail "hospital-a evaluated nothing: $(cat "$work/own-hospital-a.out")"
"$diff" "$work/own-cloud-hospital-a.safetensors" "$work/own-cloud-hospital-b.safetensors" 0 > /dev/null &&
  fail "the two hospitals' last stages are the same: one model, not two"

# Each hospital alone with a cloud of its own: the same weights at both stages.
for h in hospital-a hospital-b; do
  deployment "solo-$h" "$h" cloud
  for p in cloud "$h"; do start "solo-$h" "$p"; done
  expect_ok "solo-$h" cloud
  expect_ok "solo-$h" "$h"
  same "own-$h.safetensors" "solo-$h-$h.safetensors"
  same "own-cloud-$h.safetensors" "solo-$h-cloud.safetensors"
done

# kill -9 of hospital-b once it has a checkpoint of step 2, or of the cloud once hospital-b
# has ended its run; restarted with the same command.
for victim in hospital-b cloud; do
  name=kill-$victim
  deployment "$name" hospital-a hospital-b cloud
  for p in cloud hospital-a hospital-b; do start "$name" "$p"; done
  if [[ $victim == hospital-b ]]; then
    for _ in $(seq 1 1500); do has_checkpoint_from "$work/$name-ckpt-hospital-b" 2 && break; sleep 0.02; done
    has_checkpoint_from "$work/$name-ckpt-hospital-b" 2 || fail "$name: hospital-b wrote no checkpoint of step 2"
  else
    # Ended: hospital-b exits once the cloud has recorded its end (the export, then the
    # marker) and answered its Bye, so the record is there as soon as it has exited.
    expect_ok "$name" hospital-b
    [[ -f $work/$name-ckpt-cloud/hospital-b/finished ]] || fail "$name: hospital-b exited before the cloud recorded its end: $(ls -R "$work/$name-ckpt-cloud")"
    grep -q "'hospital-b' ended its run" "$work/$name-cloud.out" || fail "$name: hospital-b did not end its run"
  fi
  kill -9 "${pids[$victim]}"
  rc=0
  wait "${pids[$victim]}" || rc=$?
  ((rc == 137)) || { cat "$work/$name-$victim.out"; fail "$name: $victim ended with $rc before it was killed"; }
  mv "$work/$name-$victim.out" "$work/$name-$victim.killed.out"
  start "$name" "$victim"
  if [[ $victim == cloud ]]; then
    expect_ok "$name" cloud  # hospital-b exited 0 before the kill: the new cloud takes its end from its record
    expect_ok "$name" hospital-a
    grep -q "\"session\":\"hospital-a\",\"stage\":1,\"steps\":${steps[hospital-a]},\"runs\":1," "$work/$name-cloud.out" &&
      grep -q "\"session\":\"hospital-b\",\"stage\":1,\"steps\":${steps[hospital-b]},\"runs\":0," "$work/$name-cloud.out" ||
      fail "$name: the new cloud's sessions: $(cat "$work/$name-cloud.out")"
    grep -q "'hospital-b' ended its run before this process, at step ${steps[hospital-b]}" "$work/$name-cloud.out" ||
      fail "$name: the new cloud did not find hospital-b's end: $(cat "$work/$name-cloud.out")"
  else
    expect_own_finished "$name"
  fi
  for f in hospital-a hospital-b cloud-hospital-a cloud-hospital-b; do same "own-$f.safetensors" "$name-$f.safetensors"; done
  if [[ $victim == hospital-b ]]; then
    grep -q "\"party\":\"hospital-a\",\"stage\":0,\"steps\":${steps[hospital-a]},\"restarts\":0," "$work/$name-hospital-a.out" ||
      fail "$name: hospital-a restarted when hospital-b was killed: $(tail -2 "$work/$name-hospital-a.out")"
    grep -q '"party":"cloud","session":"hospital-b","stage":1,"steps":[0-9]*,"runs":2' "$work/$name-cloud.out" ||
      fail "$name: hospital-b's session did not run twice: $(cat "$work/$name-cloud.out")"
  else
    grep -q "\"party\":\"hospital-a\",\"stage\":0,\"steps\":${steps[hospital-a]},\"restarts\":1," "$work/$name-hospital-a.out" ||
      fail "$name: hospital-a did not restart once: $(tail -2 "$work/$name-hospital-a.out")"
  fi
done

# The cloud started again after every hospital has ended its run, and hospital-b, whose last
# Bye was lost (its record of the end unanswered): the cloud answers it with Bye, hospital-b
# takes the run as over and exits 0, and the cloud, with nothing left to train, exits 0 once
# nobody has linked for --silence-s.
record=$work/kill-cloud-ckpt-hospital-b/stage0.ended
grep -q " acknowledged$" "$record" || fail "hospital-b's end record is not answered: $(cat "$record")"
sed -i 's/ acknowledged$//' "$record"
"$tandem" stage --deployment "$work/kill-cloud.toml" --party cloud --silence-s 5 > "$work/again-cloud.out" 2>&1 &
pids[cloud]=$!
"$tandem" stage --deployment "$work/kill-cloud.toml" --party hospital-b --wait-s 30 --silence-s 5 > "$work/again-hospital-b.out" 2>&1 ||
  fail "hospital-b with an unanswered end record, against a cloud that saw its end, said: $(cat "$work/again-hospital-b.out")"
grep -qF "the run ended at step ${steps[hospital-b]} at this party and every one after it" "$work/again-hospital-b.out" &&
  grep -q " acknowledged$" "$record" || fail "hospital-b did not take its run as over: $(cat "$work/again-hospital-b.out")"
expect_ok again cloud
grep -qF "every first party has ended its run here before" "$work/again-cloud.out" &&
  grep -qF "nobody linked within 5 s: the run is over" "$work/again-cloud.out" ||
  fail "a cloud started after every run ended said: $(cat "$work/again-cloud.out")"

# A hospital's own batch beyond the run's, and a batch of its own where every party shares the
# run's: each refused at start, by name.
expect_refused() {  # expect_refused NAME PARTY TEXT: PARTY of NAME.toml exits 1 at once, saying TEXT
  local rc=0
  "$tandem" stage --deployment "$work/$1.toml" --party "$2" > "$work/$1-$2.out" 2>&1 || rc=$?
  ((rc == 1)) && grep -qF "$3" "$work/$1-$2.out" || fail "$1: $2 exited with $rc and said: $(cat "$work/$1-$2.out")"
}
deployment big hospital-a hospital-b cloud
sed -i 's/^batch = 32$/batch = 128/' "$work/big.toml"
expect_refused big hospital-b "[hospital-b] batch = 128 is more than the run's batch = 64, the most the later party takes"
deployment shared-terms hospital-b cloud
sed -i '/^\[hospital-b\]$/a microbatches = 1' "$work/shared-terms.toml"
expect_refused shared-terms cloud "[hospital-b] gives microbatches: a party's own batch, microbatches and wire-dtype are a first party's with later-stages = \"own\""

# hospital-c's certificate in hospital-b's place: refused by the cloud, which says whom it serves.
deployment impostor hospital-a hospital-b cloud
sed -i 's|id/hospital-b|id/hospital-c|' "$work/impostor.toml"
start impostor cloud
"$tandem" stage --deployment "$work/impostor.toml" --party hospital-b --wait-s 5 --silence-s 5 > "$work/impostor-b.out" 2>&1 &&
  fail "hospital-c in hospital-b's place was served: $(cat "$work/impostor-b.out")"
grep -qF "this stage serves the first parties it was given; 'hospital-c' is not one of them" "$work/impostor-b.out" ||
  fail "the cloud did not refuse hospital-c by name: $(cat "$work/impostor-b.out")"
stop_started

echo "ok: one cloud keeps a last stage for each of two hospitals (one with a batch, K and wire dtype of its own) and serves both at once on one executor thread over mutual TLS; each hospital's weights at both stages equal its run alone, to the bit; a kill -9 of a hospital restarts its session only, and of the cloud both, ending on the uninterrupted run's weights; a hospital the file does not name is refused"
