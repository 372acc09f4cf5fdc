#!/usr/bin/env bash
# A stage shared by several first parties: two hospitals (first-parties = 2) each train their
# own first stage of the CNN on their half of the data (every other sample) and take turns,
# a step each, on the stages after it, held by gpu-box and cloud, over mutual TLS. Every
# process exits 0; each hospital's epochs cover its own half, the later parties train both
# hospitals' steps, and the run is the same run twice. Without averaging the hospitals'
# first stages end apart; with average-every = 3 they are averaged after every third round
# and once more at the end, and end equal.
# A kill -9 of the shared party, or of a hospital, restarted with the same command, ends on
# the uninterrupted run's weights at every party, byte for byte. A third hospital the file
# does not name is refused by the shared party.
# Usage: stage_shared.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tandem=$build/tools/tandem cloud_bin=$build/cloud/tandem-cloud
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
source "$src/tests/e2e/lib.sh"
trap 'stop_started; [[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
limit=${SHARED_LIMIT:-512} epochs=${SHARED_EPOCHS:-4}
parties=(hospital-a hospital-b gpu-box cloud)
own_steps=$((epochs * limit / 2 / 64)) all_steps=$((epochs * limit / 64))

stage_identities "${parties[@]}" hospital-c

# deployment NAME [EXTRA [A B]]: $work/NAME.toml, two hospitals sharing gpu-box and cloud,
# fresh ports; their first stages averaged every 3 rounds (EXTRA: other top-level lines), A
# and B more lines in the hospitals' sections.
deployment() {
  local ports i
  read -r -a ports <<< "$(free_ports 4)"
  {
    echo "model = \"$model\""
    echo "cut = \"pool2,fc1\""
    echo "first-parties = 2"
    echo "pipeline-schedule = \"1f1b\""
    echo "batch = 64"
    echo "microbatches = 4"
    echo "limit = $limit"
    echo "test-limit = ${test_limit:-10}"
    echo "epochs = $epochs"
    echo "checkpoint-every = 2"
    echo "${2-average-every = 3}"
    for i in 0 1 2 3; do
      echo "[${parties[$i]}]"
      ((i < 2)) || echo "address = \"127.0.0.1:${ports[$i]}\""
      ((i != 0)) || echo "${3:-}"
      ((i != 1)) || echo "${4:-}"
      echo "identity = \"id/${parties[$i]}\""
      echo "backend = \"onednn\""
      echo "export = \"$1-$i.safetensors\""
      echo "checkpoint-dir = \"$1-ckpt-$i\""
    done
  } > "$work/$1.toml"
}
start() {  # start NAME PARTY: party PARTY of NAME.toml in the background
  "$tandem" stage --deployment "$work/$1.toml" --party "${parties[$2]}" --wait-s 30 --silence-s 30 \
    > "$work/$1-$2.out" 2>&1 &
  pids[$2]=$!
}
# expect_exit NAME PARTY RC MESSAGE: party PARTY's run NAME exited with RC and said MESSAGE.
expect_exit() {
  local rc=0
  wait "${pids[$2]}" || rc=$?
  ((rc == $3)) || { cat "$work/$1-$2.out"; fail "$1: party ${parties[$2]} exited with $rc, not $3"; }
  grep -qF -- "$4" "$work/$1-$2.out" || fail "$1: party ${parties[$2]} said '$(cat "$work/$1-$2.out")', not '$4'"
}
summary() { echo "\"party\":\"${parties[$1]}\",\"stage\":$2,\"steps\":$3,"; }
# Averages after every third of the rounds (each hospital's steps), and one at the end.
averages=$(((own_steps + 2) / 3))
expect_finished() {  # expect_finished NAME [AVERAGES]: every party exited 0 with its summary
  local a=${2-$averages}
  expect_exit "$1" 0 0 "$(summary 0 0 "$own_steps")\"restarts\""
  expect_exit "$1" 1 0 "$(summary 1 0 "$own_steps")"
  expect_exit "$1" 2 0 "$(summary 2 1 "$all_steps")"
  expect_exit "$1" 3 0 "$(summary 3 2 "$all_steps")"
  if [[ -n $a ]]; then
    local i
    for i in 0 1 2; do
      grep -q "\"averages\":$a," "$work/$1-$i.out" || fail "$1: party ${parties[$i]} did not take $a averages: $(tail -3 "$work/$1-$i.out")"
    done
  fi
}

deployment apart ""
pids=()
for i in 3 2 1 0; do start apart "$i"; done
expect_finished apart ""
! cmp -s "$work/apart-0.safetensors" "$work/apart-1.safetensors" || fail "without averaging, the hospitals' first stages are the same"

deployment ref
pids=()
for i in 3 2 1 0; do start ref "$i"; done
expect_finished ref
for i in 0 1; do
  grep -q "\"epoch\":$epochs,\"samples\":$((limit / 2))," "$work/ref-$i.out" ||
    fail "hospital ${parties[$i]}'s epochs do not cover its half of the data: $(cat "$work/ref-$i.out")"
  grep -q '"test_loss":[0-9.]*,"test_accuracy":[0-9.]*' "$work/ref-$i.out" ||
    fail "hospital ${parties[$i]} evaluated nothing: $(cat "$work/ref-$i.out")"
done
grep -q "listening on wss://127.0.0.1:[0-9]* for 'hospital-a', 'hospital-b'" "$work/ref-2.out" ||
  fail "gpu-box does not wait for both hospitals: $(cat "$work/ref-2.out")"
cmp "$work/ref-0.safetensors" "$work/ref-1.safetensors" || fail "averaged, the hospitals' first stages end apart"
((own_steps % 3 == 0)) || grep -q "the first stages averaged at the run's end (average $averages)" "$work/ref-0.out" ||
  fail "hospital-a did not average at the run's end: $(cat "$work/ref-0.out")"

# The same deployment again: the same weights at every party (turns are deterministic).
deployment again
pids=()
for i in 3 2 1 0; do start again "$i"; done
expect_finished again
for i in 0 1 2 3; do
  cmp "$work/ref-$i.safetensors" "$work/again-$i.safetensors" || fail "party ${parties[$i]}'s weights differ between two runs"
done

# Each hospital's own data (its section's limit): 128 samples at one and 256 at the other
# are 2 and 4 steps an epoch, and gpu-box refuses the one that differs, by name.
deployment own-data "" 'limit = 256' 'limit = 128'
pids=()
for i in 3 2 1 0; do start own-data "$i"; done
expect_exit own-data 2 1 "member 1 trains 2 steps an epoch and member 0 4: the first parties take turns, a step each, so each needs as many"
kill "${pids[3]}" 2> /dev/null || true  # cloud, never linked, would wait out its silence
for i in 0 1 3; do wait "${pids[$i]}" && fail "own-data: party ${parties[$i]} finished" || true; done

# A hospital the file does not name (hospital-c's certificate, with hospital-b's place) is
# refused by gpu-box, which says whom it takes.
deployment impostor
sed -i 's|id/hospital-b|id/hospital-c|' "$work/impostor.toml"
pids=()
for i in 3 2 0; do start impostor "$i"; done
"$tandem" stage --deployment "$work/impostor.toml" --party hospital-b --wait-s 5 --silence-s 5 > "$work/impostor-1.out" 2>&1 &
pids[1]=$!
for _ in $(seq 1 300); do grep -q "refused a connection from 'hospital-c'" "$work/impostor-2.out" && break; sleep 0.1; done
grep -qF "refused a connection from 'hospital-c': this stage takes its activations from 'hospital-a', 'hospital-b' only; 'hospital-c' is not one of them" \
  "$work/impostor-2.out" || fail "gpu-box did not refuse hospital-c by name: $(cat "$work/impostor-2.out")"
stop_started

# Faults: kill -9 of the shared party, or of hospital-b, once a checkpoint of step 8 (the end
# of round 4) is written; restarted with the same command, every party ends on the
# uninterrupted run's weights.
for k in ${SHARED_KILLS:-2 1}; do
  name=heal-$k
  deployment "$name"
  pids=()
  for i in 3 2 1 0; do start "$name" "$i"; done
  for _ in $(seq 1 1500); do has_checkpoint_from "$work/$name-ckpt-$k" 8 && break; sleep 0.02; done
  has_checkpoint_from "$work/$name-ckpt-$k" 8 || fail "$name: party ${parties[$k]} wrote no checkpoint of step 8: $(ls "$work/$name-ckpt-$k" 2>&1)"
  kill -9 "${pids[$k]}"
  rc=0
  wait "${pids[$k]}" || rc=$?
  ((rc == 137)) || { cat "$work/$name-$k.out"; fail "$name: party ${parties[$k]} ended with $rc before it was killed"; }
  mv "$work/$name-$k.out" "$work/$name-$k.killed.out"
  start "$name" "$k"
  expect_finished "$name"
  for i in 0 1 2 3; do
    cmp "$work/ref-$i.safetensors" "$work/$name-$i.safetensors" ||
      fail "$name: killing ${parties[$k]} changed party ${parties[$i]}'s final weights"
    ((i == k)) || grep -q '"restarts":1' "$work/$name-$i.out" ||
      fail "$name: party ${parties[$i]} did not restart once: $(cat "$work/$name-$i.out")"
  done
done

# The end of the run: hospital-a has evaluated its last epoch and said Bye, and waits while
# hospital-b evaluates (a bigger test set keeps it at it); hospital-b is killed then and
# started again. Every party, hospital-a too, goes back to the newest checkpoint (the run's
# last step), the hospitals take the run's last average again, and all end on the
# uninterrupted run's weights.
test_limit=5000 deployment heal-end
pids=()
for i in 3 2 1 0; do start heal-end "$i"; done
for _ in $(seq 1 3000); do grep -q "\"epoch\":$epochs," "$work/heal-end-0.out" && break; sleep 0.01; done
grep -q "\"epoch\":$epochs," "$work/heal-end-0.out" || fail "heal-end: hospital-a did not reach its last epoch's line"
kill -9 "${pids[1]}" 2> /dev/null || fail "heal-end: hospital-b had ended already: $(tail -3 "$work/heal-end-1.out")"
rc=0
wait "${pids[1]}" || rc=$?
((rc == 137)) || fail "heal-end: hospital-b ended with $rc before it was killed"
grep -q "\"party\":\"hospital-a\",\"stage\":0" "$work/heal-end-0.out" && fail "heal-end: hospital-a ended before hospital-b"
mv "$work/heal-end-1.out" "$work/heal-end-1.killed.out"
start heal-end 1
expect_finished heal-end
for i in 0 1 2 3; do
  cmp "$work/ref-$i.safetensors" "$work/heal-end-$i.safetensors" ||
    fail "heal-end: killing hospital-b at the end changed party ${parties[$i]}'s final weights"
done
grep -q '"restarts":1' "$work/heal-end-0.out" || fail "heal-end: hospital-a did not start again: $(tail -3 "$work/heal-end-0.out")"

echo "ok: two hospitals take turns on shared stages over mutual TLS, each on its half of the data with its own first stage, apart without averaging and one average with it (every 3 rounds and at the end); the same run twice gives the same weights; a hospital the file does not name is refused; a kill -9 of the shared party or of a hospital, restarted, also at the run's end while the other waits, ends on the uninterrupted run's weights at every party"
