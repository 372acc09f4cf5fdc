#!/usr/bin/env bash
# A pipeline stage split into layer shards (tensor parallel over Gloo, tools/layer_shard_party.h):
# three parties over mutual TLS (cuts pool1,pool2), the last one's stage (fc1 -> relu -> fc2
# and the loss) split over two processes with layer-shards = 2. Its merged export equals one
# process's training within 1e-5, and every process exits 0. A kill -9 of member 1, and then
# of member 0, each started again with the same command, ends on the uninterrupted split run's
# weights byte for byte: the parties go back to the newest checkpoint every member holds.
# Refused, with what to do: a stage without a linear pair to split, clip-norm on a split stage,
# --shard past the party's members, and the section's keys out of range.
# Usage: stage_layer_shards.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tandem=$build/tools/tandem cloud_bin=$build/cloud/tandem-cloud diff=$build/tests/tandem_weights_diff
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
source "$src/tests/e2e/lib.sh"
trap 'stop_started; [[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
limit=${SHARD_LIMIT:-512}
parties=(scanner gpu-box cloud)
stage_identities "${parties[@]}"

# deployment NAME [EXTRA]: $work/NAME.toml, three parties on fresh ports, the last split in two.
deployment() {
  local ports i
  read -r -a ports <<< "$(free_ports 3)"
  {
    echo "model = \"$model\""
    echo "cut = \"pool1,pool2\""
    echo "pipeline-schedule = \"1f1b\""
    echo "batch = 64"
    echo "microbatches = 4"
    echo "limit = $limit"
    echo "test-limit = 10"
    echo "${2:-}"
    for i in 0 1 2; do
      echo "[${parties[$i]}]"
      echo "address = \"127.0.0.1:${ports[$i]}\""
      echo "identity = \"id/${parties[$i]}\""
      echo "backend = \"onednn\""
      echo "export = \"$1-$i.safetensors\""
      echo "checkpoint-dir = \"$1-ckpt-$i\""
    done
    echo "layer-shards = 2"
    echo "shard-set = \"$1-shards\""
    echo "metrics-listen = \"127.0.0.1:0\""
  } > "$work/$1.toml"
}
merge() {  # merge NAME: the parties' exports as one file, NAME.safetensors
  "$tandem" export --model "$model" --stages "$work/$1-0.safetensors,$work/$1-1.safetensors,$work/$1-2.safetensors" \
    --out "$work/$1.safetensors" > "$work/$1-export.out" || { cat "$work/$1-export.out"; fail "$1: export --stages"; }
}

"$tandem" train --model "$model" --cut pool2 --limit "$limit" --test-limit 10 --batch 64 --microbatches 4 \
  --edge-backend onednn --cloud-backend onednn --export "$work/one.safetensors" > "$work/one.out" 2>&1 ||
  { cat "$work/one.out"; fail "tandem train"; }

# The whole pipeline from the file (`--all` starts the member too): one process's weights.
deployment split
"$tandem" stage --deployment "$work/split.toml" --all --log-dir "$work/split-logs" --wait-s 60 \
  > "$work/split.out" 2>&1 || { cat "$work/split.out" "$work"/split-logs/*; fail "stage --all"; }
grep -q "all 3 parties finished (and 1 layer-shard members)" "$work/split.out" || fail "stage --all said $(cat "$work/split.out")"
grep -q "layer shards: 2 members, 1 linear pairs split" "$work/split-logs/cloud.log" || fail "cloud: $(cat "$work/split-logs/cloud.log")"
grep -q '"party":"cloud","shard":1,"stage":2,"steps":'"$((limit / 64))"',"losses":0,' "$work/split-logs/cloud.shard1.log" ||
  fail "the member's summary: $(cat "$work/split-logs/cloud.shard1.log")"
merge split
"$diff" "$work/one.safetensors" "$work/split.safetensors" 1e-5 > "$work/diff.out" ||
  { cat "$work/diff.out"; fail "a stage split in two layer shards: the weights differ from one process's"; }
test_of() { grep -o '"test_loss":[0-9.]*,"test_accuracy":[0-9.]*' "$1"; }
[[ -n $(test_of "$work/one.out") ]] || fail "one process reported no test figures: $(cat "$work/one.out")"
[[ $(test_of "$work/split-logs/scanner.log") == "$(test_of "$work/one.out")" ]] ||
  fail "the split pipeline's test figures '$(test_of "$work/split-logs/scanner.log")' against one process's '$(test_of "$work/one.out")'"

# Faults: member 1 killed (-9), then member 0, each after a checkpoint and started again with
# the same command; the run ends on the uninterrupted split run's weights, byte for byte.
epochs=${SHARD_EPOCHS:-4}
steps=$((epochs * limit / 64))
options="epochs = $epochs"$'\ncheckpoint-every = 4'
deployment heal-ref "$options"
"$tandem" stage --deployment "$work/heal-ref.toml" --all --log-dir "$work/heal-ref-logs" --wait-s 60 \
  > "$work/heal-ref.out" 2>&1 || { cat "$work/heal-ref.out" "$work"/heal-ref-logs/*; fail "heal-ref: stage --all"; }
merge heal-ref
pids=()
start() {  # start NAME WHO: WHO is 0..2 (a party) or m (the cloud's member 1)
  local extra=() party=${parties[2]}
  if [[ $2 == m ]]; then extra=(--shard 1); else party=${parties[$2]}; fi
  "$tandem" stage --deployment "$work/$1.toml" --party "$party" "${extra[@]}" --wait-s 60 --silence-s 60 \
    > "$work/$1-$2.out" 2>&1 &
  pids[${2/m/3}]=$!
}
for victim in m 2; do
  name=heal-$victim
  deployment "$name" "$options"
  pids=()
  for who in m 2 1 0; do start "$name" "$who"; done
  k=${victim/m/3}
  # Member 1 keeps its checkpoints beside member 0's.
  for _ in $(seq 1 500); do has_checkpoint_from "$work/$name-ckpt-2" 8 && break; sleep 0.02; done
  has_checkpoint_from "$work/$name-ckpt-2" 8 || fail "$name: the cloud's members wrote no checkpoint of step 8 or later"
  ls "$work/$name-ckpt-2" | grep -q '^stage2\.shard1-of-2-' || fail "$name: member 1 keeps no checkpoint: $(ls "$work/$name-ckpt-2")"
  if [[ $victim == m ]]; then  # member 0's /metrics: the members' collectives and their session
    metrics_port=$(sed -n 's|^metrics for Prometheus on http://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$work/$name-2.out")
    [[ -n $metrics_port ]] || fail "$name: the cloud serves no metrics: $(cat "$work/$name-2.out")"
    scrape /metrics > "$work/metrics.txt"
    grep -q '^tandem_stage_layer_shard_session{party="cloud",stage="2"} 1$' "$work/metrics.txt" &&
      awk '$1 == "tandem_stage_layer_shard_collectives_total{party=\"cloud\",stage=\"2\"}" && $2 > 100 { ok = 1 } END { exit !ok }' "$work/metrics.txt" ||
      fail "$name: the cloud's metrics: $(grep layer_shard "$work/metrics.txt")"
  fi
  kill -9 "${pids[$k]}"
  rc=0
  wait "${pids[$k]}" || rc=$?
  ((rc == 137)) || { cat "$work/$name-$victim.out"; fail "$name: $victim ended with $rc before it was killed"; }
  mv "$work/$name-$victim.out" "$work/$name-$victim.killed.out"
  start "$name" "$victim"
  for who in 0 1 2 m; do
    rc=0
    wait "${pids[${who/m/3}]}" || rc=$?
    ((rc == 0)) || { cat "$work/$name-$who.out"; fail "$name: $who exited with $rc"; }
  done
  grep -q "\"steps\":$steps" "$work/$name-m.out" || fail "$name: the member's summary: $(cat "$work/$name-m.out")"
  merge "$name"
  cmp "$work/heal-ref.safetensors" "$work/$name.safetensors" ||
    fail "$name: killing the cloud's $victim changed the final weights"
done
grep -q "waiting up to 60 s for the layer shards to meet again" "$work/heal-m-2.out" || fail "heal-m: member 0 did not see member 1 go: $(cat "$work/heal-m-2.out")"
grep -q "layer shards: 2 members met (session 2)" "$work/heal-m-2.out" || fail "heal-m: no second session: $(cat "$work/heal-m-2.out")"
grep -q '"losses":1,' "$work/heal-2-m.out" || fail "heal-2: member 1 did not count member 0's loss: $(cat "$work/heal-2-m.out")"

# Refused with what to do.
deployment bad
sed -i '/^layer-shards = 2$/d; /^shard-set = /d' "$work/bad.toml"
sed -i '/^\[gpu-box\]$/a layer-shards = 2\nshard-set = "bad-shards"' "$work/bad.toml"
rc=0
"$tandem" stage --deployment "$work/bad.toml" --party gpu-box > "$work/bad.out" 2>&1 || rc=$?
((rc == 1)) && grep -qF "[layer shards] stage 1 of model 'fashion-mnist-cnn' has no linear pair to split over 2 shards" "$work/bad.out" ||
  fail "a stage without a pair ($rc): $(cat "$work/bad.out")"
deployment clip 'clip-norm = 1'
rc=0
"$tandem" stage --deployment "$work/clip.toml" --party cloud > "$work/clip.out" 2>&1 || rc=$?
((rc == 1)) && grep -qF "clip-norm = 1 clips by the global norm, and each layer shard of [cloud] holds a slice of the gradients" "$work/clip.out" ||
  fail "clip-norm on a split stage ($rc): $(cat "$work/clip.out")"
rc=0
"$tandem" stage --deployment "$work/split.toml" --party cloud --shard 2 > "$work/shard2.out" 2>&1 || rc=$?
((rc == 1)) && grep -qF -- "--shard 2: [cloud] has layer-shards = 2, members 1 to 1" "$work/shard2.out" ||
  fail "--shard 2 of 2 ($rc): $(cat "$work/shard2.out")"

# The section's keys, checked as the file is read.
refused() {  # refused NAME SED MESSAGE: the split deployment edited by SED is refused, saying MESSAGE
  sed "$2" "$work/split.toml" > "$work/$1.toml"
  rc=0
  "$tandem" stage --deployment "$work/$1.toml" --party cloud > "$work/$1.out" 2>&1 || rc=$?
  ((rc == 1)) && grep -qF -- "$3" "$work/$1.out" || fail "$1 ($rc): $(cat "$work/$1.out")"
}
refused zero 's/^layer-shards = 2$/layer-shards = 0/' "[cloud] layer-shards = '0' is not a count from 1 to 64"
refused no-set '/^shard-set = /d' "[cloud] layer-shards = 2 needs shard-set = \"DIR\""
refused addresses '/^shard-set = /a shard-addresses = "10.0.0.1,10.0.0.2,10.0.0.3"' "[cloud] shard-addresses names 3 addresses for 2 members"
refused public '/^shard-set = /a shard-allow-public = "yes"' "[cloud] shard-allow-public = 'yes' is not true or false"
refused first '/^\[scanner\]$/a layer-shards = 2' "[scanner] layer-shards = 2: a first party's stage runs where its data is"

echo "ok: a stage split into two layer shards equals one process within 1e-5; kill -9 of either member, started again, leaves the weights byte-identical; a stage without a pair, clip-norm, a member past the count and bad section keys refused"
