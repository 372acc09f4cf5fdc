#!/usr/bin/env bash
# A pipeline across parties: four `tandem stage` processes on loopback, one stage each (cuts
# pool1,pool2,fc1), each link mutual TLS with the identity the deployment file names. Under
# gpipe, 1f1b and zero-bubble the stages' merged exports equal the weights of the same
# training in one process (`tandem train`, two stages) within 1e-5, and every process exits
# 0; so with the labels kept at the first party (its own process holds the loss), whose
# parties' egress logs verify and show no labels sent. f16 on the links halves the bytes. A party with another party's certificate is refused
# by name; a party that runs another plan is refused (ModelMismatch), the term named. Under the async
# schedule the parties end on the weights of `tandem train`'s four stages under it. A kill -9 of the first, a middle or the last party, restarted with the same
# command, ends on the uninterrupted run's weights byte for byte; a survivor's Prometheus
# metrics count the restart, its steps, its links' bytes and its bubble; started again after
# the run's end, every party finds it ended from its end record and exits 0. With the privacy
# filters on (noise and NoPeek on the first party's activations, noise on the loss stage's
# gradient), epsilon is accounted and its budget stops the run (a new process of the first
# party goes on from its durable count), and no loss leaves.
# Usage: stage_pipeline.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tandem=$build/tools/tandem cloud_bin=$build/cloud/tandem-cloud diff=$build/tests/tandem_weights_diff
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
source "$src/tests/e2e/lib.sh"
trap 'stop_started; [[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
limit=${STAGE_LIMIT:-1024}
parties=(scanner gpu-box cloud-a cloud-b)

stage_identities "${parties[@]}" scanner-tail

# deployment NAME SCHEDULE [EXTRA]: $work/NAME.toml, four parties on fresh ports.
deployment() {
  local ports i
  read -r -a ports <<< "$(free_ports 8)"
  {
    echo "model = \"$model\""
    echo "cut = \"pool1,pool2,fc1\""
    echo "pipeline-schedule = \"$2\""
    echo "batch = 64"
    echo "microbatches = 4"
    echo "limit = $limit"
    echo "test-limit = 10"
    echo "${3:-}"
    for i in 0 1 2 3; do
      echo "[${parties[$i]}]"
      echo "address = \"127.0.0.1:${ports[$i]}\""
      echo "identity = \"id/${parties[$i]}\""
      echo "backend = \"onednn\""
      echo "export = \"$1-$i.safetensors\""
      echo "checkpoint-dir = \"$1-ckpt-$i\""
      echo "metrics-listen = \"127.0.0.1:${ports[$((i + 4))]}\""
      echo "egress-log = \"$1-egress-$i.jsonl\""
    done
  } > "$work/$1.toml"
}

# run_pipeline NAME: every party's tandem stage, the later ones first; all must exit 0. The
# first party's run ends once every stage has recorded its end (the Bye back up the chain),
# so every export is written when it exits.
run_pipeline() {
  local name=$1 i s pids=() rc
  for i in 3 2 1 0; do
    "$tandem" stage --deployment "$work/$name.toml" --party "${parties[$i]}" --wait-s 60 --silence-s 60 \
      > "$work/$name-$i.out" 2>&1 &
    pids[$i]=$!
  done
  for i in 0 1 2 3; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    ((rc == 0)) || { cat "$work/$name-$i.out"; fail "$name: party ${parties[$i]} exited with $rc"; }
    if ((i == 0)); then
      for s in 1 2 3; do
        [[ -s $work/$name-$s.safetensors ]] || fail "$name: the first party ended before stage $s wrote its export"
      done
    fi
  done
  "$tandem" export --model "$model" --stages "$work/$name-0.safetensors,$work/$name-1.safetensors,$work/$name-2.safetensors,$work/$name-3.safetensors" \
    --out "$work/$name.safetensors" > "$work/$name-export.out" || { cat "$work/$name-export.out"; fail "$name: export --stages"; }
}

"$tandem" train --model "$model" --cut pool2 --limit "$limit" --test-limit 10 --batch 64 --microbatches 4 \
  --edge-backend onednn --cloud-backend onednn --export "$work/one.safetensors" > "$work/one.out" 2>&1 ||
  { cat "$work/one.out"; fail "tandem train"; }
test_of() { grep -o '"test_loss":[0-9.]*,"test_accuracy":[0-9.]*' "$1"; }
for schedule in ${STAGE_SCHEDULES:-gpipe 1f1b zero-bubble}; do
  deployment "$schedule" "$schedule"
  run_pipeline "$schedule"
  "$diff" "$work/one.safetensors" "$work/$schedule.safetensors" 1e-5 > "$work/diff.out" ||
    { cat "$work/diff.out"; fail "$schedule: four parties' weights differ from one process's"; }
  grep -q "\"party\":\"cloud-b\",\"stage\":3,\"steps\":$((limit / 64))," "$work/$schedule-3.out" ||
    fail "$schedule: the last party's summary: $(cat "$work/$schedule-3.out")"
  grep -q "\"epoch\":1,\"samples\":$limit," "$work/$schedule-0.out" || fail "$schedule: the first party's metrics: $(cat "$work/$schedule-0.out")"
  # Evaluated across the parties after the epoch, the test set gives what one process gives.
  [[ $(test_of "$work/$schedule-0.out") == "$(test_of "$work/one.out")" && -n $(test_of "$work/one.out") ]] ||
    fail "$schedule: the parties' test loss and accuracy '$(test_of "$work/$schedule-0.out")' against one process's '$(test_of "$work/one.out")'"
done

# The asynchronous schedule (a step in flight at every stage but the last, drained before the
# evaluation): the weights and test figures of the same four stages under it in one process.
"$tandem" train --model "$model" --cut pool1,pool2,fc1 --pipeline-schedule async --limit "$limit" --test-limit 10 \
  --batch 64 --microbatches 4 --edge-backend onednn --cloud-backend onednn --export "$work/one-async.safetensors" \
  > "$work/one-async.out" 2>&1 || { cat "$work/one-async.out"; fail "tandem train --pipeline-schedule async"; }
deployment async async
run_pipeline async
"$diff" "$work/one-async.safetensors" "$work/async.safetensors" 1e-5 > "$work/diff.out" ||
  { cat "$work/diff.out"; fail "async: four parties' weights differ from one process's four stages under async"; }
! "$diff" "$work/one.safetensors" "$work/async.safetensors" 1e-5 > /dev/null || fail "async: the weights equal gpipe's"
grep -q "\"epoch\":1,\"samples\":$limit," "$work/async-0.out" || fail "async: the first party's metrics: $(cat "$work/async-0.out")"
[[ $(test_of "$work/async-0.out") == "$(test_of "$work/one-async.out")" && -n $(test_of "$work/one-async.out") ]] ||
  fail "async: the parties' test figures '$(test_of "$work/async-0.out")' against one process's '$(test_of "$work/one-async.out")'"
grep -q '"type":"Drain","bytes":[0-9]*,"stage":0,"step":'"$((limit / 64 - 1))" "$work/async-egress-0.jsonl" ||
  fail "async: the first party's egress log shows no Drain of the last step"

# The labels stay at the first party: its second process, scanner-tail, holds the loss and
# reads the labels from the same data; the Activations carry none (the parties between refuse
# any, and the run ends on one process's weights all the same).
# This one starts as a whole from the file: `tandem stage --all`, every party a child process.
parties=(scanner gpu-box cloud-a scanner-tail)
deployment first-party gpipe 'labels = "first-party"'
"$tandem" stage --deployment "$work/first-party.toml" --all --log-dir "$work/first-party-logs" --wait-s 60 \
  > "$work/first-party.out" 2>&1 || { cat "$work/first-party.out" "$work"/first-party-logs/*; fail "stage --all"; }
grep -q "all 4 parties finished" "$work/first-party.out" || fail "stage --all said $(cat "$work/first-party.out")"
grep -q '"party":"scanner-tail","stage":3' "$work/first-party-logs/scanner-tail.log" || fail "no log of scanner-tail"
"$tandem" export --model "$model" --stages "$work/first-party-0.safetensors,$work/first-party-1.safetensors,$work/first-party-2.safetensors,$work/first-party-3.safetensors" \
  --out "$work/first-party.safetensors" > /dev/null || fail "first-party: export --stages"
"$diff" "$work/one.safetensors" "$work/first-party.safetensors" 1e-5 > "$work/diff.out" ||
  { cat "$work/diff.out"; fail "labels at the first party: the weights differ from one process's"; }
parties=(scanner gpu-box cloud-a cloud-b)
# Each party's egress log says what it sent; they verify, and no Activations carried labels
# (where the labels travel, the scanner's did).
for i in 0 1 2 3; do
  "$tandem" audit verify "$work/first-party-egress-$i.jsonl" > "$work/audit.out" 2>&1 ||
    { cat "$work/audit.out"; fail "first-party: party $i's egress log does not verify"; }
  ! grep -q '"type":"Activations".*"labels"' "$work/first-party-egress-$i.jsonl" ||
    fail "first-party: party $i sent labels: $(grep -m1 labels "$work/first-party-egress-$i.jsonl")"
done
grep -q '"type":"Gradients".*"loss":[1-9]' "$work/first-party-egress-3.jsonl" ||
  fail "first-party: without grad-noise the loss stage's Gradients carry the loss: $(grep -m1 Gradients "$work/first-party-egress-3.jsonl")"

# Privacy filters on the links (pipeline/link_filter.h): the scanner's activations leave
# clipped and noised, with NoPeek's penalty, and epsilon is accounted until the budget stops
# the run; the loss stage (at the scanner) sends its gradient up noised (label noise, then
# the gradient's own) and keeps the loss,
# which it alone reports. Every party exits 0.
parties=(scanner gpu-box cloud-a scanner-tail)
# A budget the run passes after a few steps: epsilon grows with the sampling rate batch / limit.
budget=0.8
((limit >= 1024)) && budget=0.5
deployment private gpipe "labels = \"first-party\"
dp-clip = 4
dp-noise = 2
dp-epsilon-budget = $budget
nopeek = 0.1
grad-clip = 0.1
grad-noise = 0.5
label-noise = 0.25"
"$tandem" stage --deployment "$work/private.toml" --all --log-dir "$work/private-logs" --wait-s 60 \
  > "$work/private.out" 2>&1 || { cat "$work/private.out" "$work"/private-logs/*; fail "private: stage --all"; }
first=$(grep '"epoch":1,' "$work/private-logs/scanner.log") || fail "private: no epoch line: $(cat "$work/private-logs/scanner.log")"
[[ $first =~ \"train_loss\":null.*\"dp_epsilon\":([0-9.]+).*\"dcor\":0\.[0-9]+ ]] || fail "private: the scanner's epoch: $first"
awk -v e="${BASH_REMATCH[1]}" -v b="$budget" 'BEGIN { exit !(e > b - 0.1 && e <= b) }' ||
  fail "private: epsilon ${BASH_REMATCH[1]} against a budget of $budget"
released=$(sed -n "s/^stopped before step \([1-9][0-9]*\): it would pass the privacy budget (epsilon $budget at delta 1e-05)$/\1/p" \
  "$work/private-logs/scanner.log")
[[ -n $released ]] || fail "private: the budget did not stop the run: $(cat "$work/private-logs/scanner.log")"
# The count of releases is durable: the ledger says it. The same deployment started again
# finds the run ended (each party's end record) and trains nothing; with the end records
# removed (to train again in the same folders), it starts from step 0 (no checkpoint), goes
# on from the ledger and releases nothing.
grep -qx "releases $released" "$work/private-ckpt-0/dp-releases" ||
  fail "private: the ledger after $released releases: $(cat "$work/private-ckpt-0/dp-releases")"
"$tandem" stage --deployment "$work/private.toml" --all --log-dir "$work/private-ended-logs" --wait-s 60 \
  > "$work/private-ended.out" 2>&1 || { cat "$work/private-ended.out" "$work"/private-ended-logs/*; fail "private ended: stage --all"; }
grep -q "the run ended at step [0-9]* at this party and every one after it: nothing is left to train" \
  "$work/private-ended-logs/scanner.log" || fail "private ended: $(cat "$work/private-ended-logs/scanner.log")"
grep -qx "releases $released" "$work/private-ckpt-0/dp-releases" || fail "private ended: released more"
rm "$work"/private-ckpt-*/stage*.ended
"$tandem" stage --deployment "$work/private.toml" --all --log-dir "$work/private-again-logs" --wait-s 60 \
  > "$work/private-again.out" 2>&1 || { cat "$work/private-again.out" "$work"/private-again-logs/*; fail "private again: stage --all"; }
grep -q "private-ckpt-0/dp-releases: $released noised releases of the training set before this process" \
  "$work/private-again-logs/scanner.log" || fail "private again: $(cat "$work/private-again-logs/scanner.log")"
grep -q "stopped before step 0: it would pass the privacy budget" "$work/private-again-logs/scanner.log" ||
  fail "private again: the spent budget did not stop the run: $(cat "$work/private-again-logs/scanner.log")"
grep -qx "releases $released" "$work/private-ckpt-0/dp-releases" || fail "private again: released more"
grep -q "on the link down: NoPeek (alpha 0.1)" "$work/private-logs/scanner.log" || fail "private: no NoPeek on the link"
grep -q "on the link up: noise on the gradient sent up (clip 0.1, sigma 0.5)" "$work/private-logs/scanner-tail.log" ||
  fail "private: no noise on the loss stage's link"
grep -q "on the link up: noise on the loss gradient sent up (sigma 0.25)" "$work/private-logs/scanner-tail.log" ||
  fail "private: no label noise on the loss stage's link"
grep -q '"epoch":1,"party":"scanner-tail","samples":[1-9][0-9]*,"train_loss":[0-9.]*,' "$work/private-logs/scanner-tail.log" ||
  fail "private: the loss stage reported no loss: $(cat "$work/private-logs/scanner-tail.log")"
grep -q '"epoch":1,"party":"scanner-tail","test_samples":10,"test_loss":[0-9.]*,"test_accuracy":' \
  "$work/private-logs/scanner-tail.log" || fail "private: the loss stage reported no evaluation"
grep -q '"type":"Evaluated"' "$work/private-egress-3.jsonl" || fail "private: no evaluation results in the loss stage's log"
! grep -E '"type":"(Gradients|Evaluated)"' "$work/private-egress-3.jsonl" | grep -v '"loss":0,"correct":0' > /dev/null ||
  fail "private: a loss left the loss stage: $(grep -E '"type":"(Gradients|Evaluated)"' "$work/private-egress-3.jsonl" | grep -v '"loss":0,' | head -1)"
parties=(scanner gpu-box cloud-a cloud-b)

grep -q '"type":"Activations".*"labels":16,' "$work/1f1b-egress-0.jsonl" ||
  fail "1f1b: the scanner's egress log shows no labels sent: $(head -3 "$work/1f1b-egress-0.jsonl")"
grep -q '"type":"Gradients","bytes"' "$work/1f1b-egress-1.jsonl" || fail "1f1b: gpu-box's egress log has no Gradients"

# Compression on the links: f16 halves the bytes every party sends and trains as f32 does.
deployment f16 1f1b 'wire-dtype = "f16"'
run_pipeline f16
sent_of() { sed -n 's/.*"party":"scanner".*"sent_bytes":\([0-9]*\).*/\1/p' "$work/$1-0.out"; }
loss_of() { sed -n 's/.*"train_loss":\([0-9.]*\).*/\1/p' "$work/$1-0.out"; }
need_figures "the f16 and f32 runs' bytes and losses" "$(sent_of f16)" "$(sent_of 1f1b)" "$(loss_of f16)" "$(loss_of 1f1b)"
awk -v a="$(sent_of f16)" -v b="$(sent_of 1f1b)" 'BEGIN { exit !(a < 0.55 * b && a > 0.45 * b) }' ||
  fail "f16: the scanner sent $(sent_of f16) bytes against f32's $(sent_of 1f1b), not half"
awk -v a="$(loss_of f16)" -v b="$(loss_of 1f1b)" 'BEGIN { exit !(a - b < 0.02 * b && b - a < 0.02 * b) }' ||
  fail "f16: train loss $(loss_of f16) against f32's $(loss_of 1f1b)"

# expect_exit NAME PARTY RC MESSAGE: party PARTY's run NAME exited with RC (waited for) and said MESSAGE.
expect_exit() {
  local rc=0
  wait "${pids[$2]}" || rc=$?
  ((rc == $3)) || { cat "$work/$1-$2.out"; fail "$1: party ${parties[$2]} exited with $rc, not $3"; }
  grep -qF "$4" "$work/$1-$2.out" || fail "$1: party ${parties[$2]} said '$(cat "$work/$1-$2.out")', not '$4'"
}
start() {  # start NAME PARTY [DEPLOYMENT [SILENCE_S]]: party PARTY of NAME.toml (or DEPLOYMENT.toml) in the background
  "$tandem" stage --deployment "$work/${3:-$1}.toml" --party "${parties[$2]}" --wait-s 20 --silence-s "${4:-8}" \
    > "$work/$1-$2.out" 2>&1 &
  pids[$2]=$!
}

# An impostor: the party between the scanner and cloud-a presents cloud-a's certificate. The
# scanner refuses its server's identity and tells it so; cloud-a, never joined (it refuses the
# impostor's client identity), ends, and cloud-b after it.
deployment impostor gpipe
sed -i 's|identity = "id/gpu-box"|identity = "id/cloud-a"|' "$work/impostor.toml"
pids=()
start impostor 3; start impostor 2; start impostor 1; start impostor 0
expect_exit impostor 0 1 "presented the identity 'cloud-a', not 'gpu-box' that the deployment names there"
expect_exit impostor 1 1 "the previous stage ended the run: scanner: [stage] 127.0.0.1:"
expect_exit impostor 2 1 "nobody connected as 'gpu-box' (the party before) within 8 s"
expect_exit impostor 3 1 "nobody connected as 'cloud-a' (the party before) within 8 s"
# And a client impostor: the scanner presents cloud-a's certificate to gpu-box, which refuses
# it by name and says why.
deployment client-impostor gpipe
sed -i 's|identity = "id/scanner"|identity = "id/cloud-a"|' "$work/client-impostor.toml"
pids=()
start client-impostor 1; start client-impostor 0
expect_exit client-impostor 0 1 "the next stage ended the run: this stage takes its activations from 'scanner' only; 'cloud-a' is not it"
expect_exit client-impostor 1 1 "nobody connected as 'scanner' (the party before) within 8 s"
grep -qF "refused a connection from 'cloud-a'" "$work/client-impostor-1.out" || fail "gpu-box did not say whom it refused"

# Another plan: the first party runs K = 2 where the others run 4. The second refuses it and
# tells it why; the parties after it, never linked, end.
deployment plan gpipe
sed 's/^microbatches = 4/microbatches = 2/' "$work/plan.toml" > "$work/plan2.toml"
pids=()
start plan 3; start plan 2; start plan 1; start plan 0 plan2
expect_exit plan 0 1 "the next stage ended the run: the previous stage plans steps of at most 64 samples in 2 micro-batches, and stage 1 64 in 4: give every party the same batch and microbatches"
expect_exit plan 1 1 "stage 1 refused the previous stage's message: the previous stage plans steps of at most 64 samples in 2"
expect_exit plan 2 1 "nobody connected as 'gpu-box' (the party before) within 8 s"
expect_exit plan 3 1 "nobody connected as 'cloud-a' (the party before) within 8 s"

# Filters on the links under the async schedule: refused before any link is made.
deployment async-private async 'dp-clip = 4'
pids=()
start async-private 0
expect_exit async-private 0 1 "tandem: [stage] noise on the activations (clip 4, sigma 0) keeps one step's state per micro-batch; the async schedule has two steps in flight: use gpipe or 1f1b with filters on the links"
# Started as a whole, the first party that fails stops the others, and the launcher names it.
rc=0
"$tandem" stage --deployment "$work/async-private.toml" --all --log-dir "$work/async-logs" > "$work/async-all.out" 2>&1 || rc=$?
((rc == 1)) || fail "stage --all of a failing pipeline exited with $rc: $(cat "$work/async-all.out")"
grep -q "failed: see $work/async-logs/.*\.log" "$work/async-all.out" || fail "stage --all said $(cat "$work/async-all.out")"

# Faults: kill -9 of one party mid-run (the first, a middle one, the last; and a middle one
# under async, whose checkpoints hold no step in flight), restarted with the same command.
# Every party goes back to the newest checkpoint all have and the run finishes with the
# weights of an uninterrupted run under the same schedule, byte for byte.
heal_epochs=${HEAL_EPOCHS:-8}
heal_steps=$((heal_epochs * limit / 64))
heal_options="epochs = $heal_epochs"$'\ncheckpoint-every = 4'
deployment heal-ref 1f1b "$heal_options"
run_pipeline heal-ref
heal_runs=${HEAL_RUNS:-1f1b:0 1f1b:1 1f1b:3 async:2}  # SCHEDULE:PARTY, each killed once
if [[ $heal_runs == *async* ]]; then
  deployment heal-ref-async async "$heal_options"
  run_pipeline heal-ref-async
fi
for run in $heal_runs; do
  schedule=${run%:*} k=${run#*:}
  name=heal-$schedule-$k ref=heal-ref
  [[ $schedule == async ]] && ref=heal-ref-async
  deployment "$name" "$schedule" "$heal_options"
  pids=()
  for i in 3 2 1 0; do start "$name" "$i" "$name" 60; done
  for _ in $(seq 1 500); do has_checkpoint_from "$work/$name-ckpt-$k" 8 && break; sleep 0.02; done
  has_checkpoint_from "$work/$name-ckpt-$k" 8 || fail "$name: party ${parties[$k]} wrote no checkpoint of step 8 or later"
  kill -9 "${pids[$k]}"
  rc=0
  wait "${pids[$k]}" || rc=$?
  ((rc == 137)) || { cat "$work/$name-$k.out"; fail "$name: party ${parties[$k]} ended with $rc before it was killed"; }
  mv "$work/$name-$k.out" "$work/$name-$k.killed.out"
  if [[ $run == 1f1b:1 ]]; then  # while gpu-box is down, cloud-a's metrics say it restarted, and what it did before
    metrics_port=$(sed -n 's|^metrics for Prometheus on http://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$work/$name-2.out")
    [[ -n $metrics_port ]] || fail "$name: cloud-a serves no metrics: $(cat "$work/$name-2.out")"
    for _ in $(seq 1 100); do [[ $(metric 'tandem_stage_restarts_total{party="cloud-a",stage="2"}') == 1 ]] && break; sleep 0.05; done
    scrape /metrics > "$work/metrics.txt"
    grep -q '^tandem_stage_restarts_total{party="cloud-a",stage="2"} 1$' "$work/metrics.txt" ||
      fail "$name: cloud-a's metrics do not count the restart: $(cat "$work/metrics.txt")"
    awk '$1 == "tandem_stage_steps_total{party=\"cloud-a\",stage=\"2\"}" && $2 >= 8 { ok = 1 } END { exit !ok }' "$work/metrics.txt" ||
      fail "$name: cloud-a's metrics count fewer than 8 steps: $(cat "$work/metrics.txt")"
    for link in up down; do
      awk -v l="$link" '$1 ~ /^tandem_stage_(sent|received)_bytes_total/ && index($1, "link=\"" l "\"") && $2 > 100000 { n++ } END { exit n != 2 }' "$work/metrics.txt" ||
        fail "$name: cloud-a's metrics lack the bytes of its $link link: $(cat "$work/metrics.txt")"
    done
    grep -q '^tandem_stage_bubble{party="cloud-a",stage="2"} 0\.[0-9]' "$work/metrics.txt" ||
      fail "$name: cloud-a's bubble: $(cat "$work/metrics.txt")"
  fi
  start "$name" "$k" "$name" 60
  for i in 0 1 2 3; do expect_exit "$name" "$i" 0 "\"steps\":$heal_steps"; done
  "$tandem" export --model "$model" --stages "$work/$name-0.safetensors,$work/$name-1.safetensors,$work/$name-2.safetensors,$work/$name-3.safetensors" \
    --out "$work/$name.safetensors" > /dev/null || fail "$name: export --stages"
  cmp "$work/$ref.safetensors" "$work/$name.safetensors" ||
    fail "$name: killing party ${parties[$k]} changed the final weights"
  for i in 0 1 2 3; do
    ((i == k)) || grep -q '"restarts":1' "$work/$name-$i.out" || fail "$name: party ${parties[$i]} did not restart once: $(cat "$work/$name-$i.out")"
  done
done

# Started again after the run's end (each checkpoint-dir holds its party's end record, written
# with its export before the Bye went on): every party finds the run ended at every party
# after it and exits 0 without training; the exports stay as they were. A party started
# alone, the others gone, is told by its wait that they ended too: the first finds nobody
# after it, cloud-a nobody before it.
ended=$name
"$tandem" export --model "$model" --stages "$work/$ended-0.safetensors,$work/$ended-1.safetensors,$work/$ended-2.safetensors,$work/$ended-3.safetensors" \
  --out "$work/$ended-before-again.safetensors" > /dev/null || fail "$ended: export --stages"
for i in 3 2 1 0; do start "$ended-again" "$i" "$ended" 20; done
for i in 0 1 2 3; do expect_exit "$ended-again" "$i" 0 "ended its run at step $heal_steps before this process"; done
for i in 0 1 2 3; do
  grep -q "the run ended at step $heal_steps at this party and every one after it: nothing is left to train" "$work/$ended-again-$i.out" ||
    fail "$ended-again: party ${parties[$i]} did not find the run ended: $(cat "$work/$ended-again-$i.out")"
  grep -q "\"steps\":$heal_steps," "$work/$ended-again-$i.out" || fail "$ended-again: party ${parties[$i]}'s summary"
done
"$tandem" export --model "$model" --stages "$work/$ended-0.safetensors,$work/$ended-1.safetensors,$work/$ended-2.safetensors,$work/$ended-3.safetensors" \
  --out "$work/$ended-after-again.safetensors" > /dev/null || fail "$ended-again: export --stages"
cmp "$work/$ended-before-again.safetensors" "$work/$ended-after-again.safetensors" || fail "$ended-again: the exports changed"
for i in 0 2; do
  rc=0
  "$tandem" stage --deployment "$work/$ended.toml" --party "${parties[$i]}" --wait-s 2 --silence-s 5 > "$work/$ended-alone-$i.out" 2>&1 || rc=$?
  ((rc == 0)) || fail "$ended: ${parties[$i]} started alone after the run's end exited $rc: $(cat "$work/$ended-alone-$i.out")"
done
grep -q "the run ended at step $heal_steps at this party and every one after it" "$work/$ended-alone-0.out" ||
  fail "$ended: the first party alone: $(cat "$work/$ended-alone-0.out")"
grep -q "nobody connected as 'gpu-box' (the party before) within 5 s.*this party recorded the run's end before, and the parties after it theirs: the run is over" "$work/$ended-alone-2.out" ||
  fail "$ended: cloud-a alone: $(cat "$work/$ended-alone-2.out")"
grep -q "\"party\":\"cloud-a\",\"stage\":2,\"steps\":$heal_steps," "$work/$ended-alone-2.out" ||
  fail "$ended: cloud-a alone: $(cat "$work/$ended-alone-2.out")"

echo "ok: four parties over mutual TLS equal one process under gpipe, 1f1b and zero-bubble, and with the labels kept at the first party; f16 halves the bytes; an impostor, another plan and filters under async refused; four parties under async equal one process's four stages under it; a kill -9 of the first, a middle or the last party (and a middle one under async), restarted, leaves the weights byte-identical; started again after the run's end, every party finds it ended; the test set evaluated across the parties as in one process; the privacy filters on the links, epsilon and its budget (durable across a new process), no loss leaving the loss stage"
