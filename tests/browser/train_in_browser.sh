#!/usr/bin/env bash
# The browser edge end to end: tandem-cloud serves the page (--web) and takes enrolment tokens;
# headless Chromium (Debian's, driven by playwright-core) opens the page, trains 50 steps over
# wss, and the loss falls; a replayed and a forged token are refused; the cloud keeps serving;
# the page trains on local image files too; on a split-federated cloud it takes part in the
# rounds with its front updated once a round; and the page trains the vision transformer's
# front (samples/fashion-vit) against a cloud serving it; and a cloud at its bound answers the page
# Busy, the page tries again and trains; and a cloud killed mid-run and started again on its
# port: the page reconnects (with the token the cloud's Welcome gave it) and finishes its run.
# Usage: train_in_browser.sh NATIVE_BUILD_DIR SOURCE_DIR WASM_BUILD_DIR
set -euo pipefail
build=$1 src=$2 wasm=$3
source "$src/tests/wasm/require_wasm_build.sh"
require_wasm_build
for need in /usr/bin/chromium "$src/tests/browser/node_modules/playwright-core"; do
  if [[ ! -e $need ]]; then
    echo "$need is missing: bash scripts/setup.sh installs Debian's chromium and playwright-core"
    [[ ${CI:-} == true ]] && exit 1
    echo "SKIPPED"
    exit 77
  fi
done
cloud_bin=$build/cloud/tandem-cloud
work=$(mktemp -d)
cleanup() {
  for pid in ${cloud_pid:-} ${fed_pid:-} ${vit_pid:-} ${busy_pid:-} ${held_pid:-} ${watch_pid:-}; do kill "$pid" 2>/dev/null || true; done
  [[ -f $work/heal.pid ]] && kill "$(cat "$work/heal.pid")" 2> /dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for log in cloud busy held heal; do [[ -f $work/$log.log ]] && { echo "--- $log log"; cat "$work/$log.log"; }; done
  exit 1
}

"$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$src/samples/fashion-mnist/model.json" \
  --batch 32 --microbatches 4 --web "$wasm/web" > "$work/cloud.log" 2>&1 &
cloud_pid=$!
for _ in $(seq 1 100); do grep -q 'listening on' "$work/cloud.log" && break; sleep 0.1; done
port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/cloud.log" | cut -d: -f3)
[[ -n $port ]] || fail "the cloud did not start"
token=$("$cloud_bin" pki token --state-dir "$work/state" --client page-1 --ttl 10m)
other=$("$cloud_bin" pki token --state-dir "$work/state" --client page-2 --ttl 10m)
files=$("$cloud_bin" pki token --state-dir "$work/state" --client page-3 --ttl 10m)
async_token=$("$cloud_bin" pki token --state-dir "$work/state" --client page-4 --ttl 10m)
"$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/fed-state" \
  --model "$src/samples/fashion-mnist/model.json" --batch 32 --microbatches 4 --web "$wasm/web" --aggregate-every 5 \
  > "$work/fed.log" 2>&1 &
fed_pid=$!
for _ in $(seq 1 100); do grep -q 'listening on' "$work/fed.log" && break; sleep 0.1; done
fed_port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/fed.log" | cut -d: -f3)
[[ -n $fed_port ]] || fail "the federated cloud did not start: $(cat "$work/fed.log")"
fed_token=$("$cloud_bin" pki token --state-dir "$work/fed-state" --client page-fed --ttl 10m)
"$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/vit-state" --model "$src/samples/fashion-vit/model.json" \
  --batch 32 --microbatches 4 --lr 0.02 --web "$wasm/web" > "$work/vit.log" 2>&1 &
vit_pid=$!
for _ in $(seq 1 100); do grep -q 'listening on' "$work/vit.log" && break; sleep 0.1; done
vit_port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/vit.log" | cut -d: -f3)
[[ -n $vit_port ]] || fail "the ViT cloud did not start: $(cat "$work/vit.log")"
vit_token=$("$cloud_bin" pki token --state-dir "$work/vit-state" --client page-vit --ttl 10m)
# A cloud at its bound (one WebSocket, held by a probe until the page has been refused; its page
# is served all the same, and from it so that the browser trusts the wss certificate):
# the page is answered Busy, says it will try again, and trains once there is room.
"$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/busy-state" --model "$src/samples/fashion-mnist/model.json" \
  --batch 32 --microbatches 4 --web "$wasm/web" --max-connections 1 --hello-timeout-s 300 > "$work/busy.log" 2>&1 &
busy_pid=$!
for _ in $(seq 1 100); do grep -q 'listening on' "$work/busy.log" && break; sleep 0.1; done
busy_port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/busy.log" | cut -d: -f3)
[[ -n $busy_port ]] || fail "the busy cloud did not start: $(cat "$work/busy.log")"
busy_token=$("$cloud_bin" pki token --state-dir "$work/busy-state" --client page-busy --ttl 10m)
"$cloud_bin" pki issue --state-dir "$work/busy-state" --client holder --out "$work/holder" > /dev/null
python3 "$src/tests/e2e/ws_raw.py" "$busy_port" "$work/holder" hold:1 "until:$work/released" > "$work/held.log" 2>&1 &
held_pid=$!
for _ in $(seq 1 100); do grep -q holding "$work/held.log" && break; sleep 0.1; done
grep -q holding "$work/held.log" || fail "the probe holds no connection"
# A cloud the page's run outlives: killed (SIGKILL) once it holds a checkpoint of the page's
# run, started again on the same port 2 s later (heal_watch, in the background).
start_heal_cloud() {  # start_heal_cloud PORT
  "$cloud_bin" serve --listen "127.0.0.1:$1" --state-dir "$work/heal-state" --model "$src/samples/fashion-mnist/model.json" \
    --batch 32 --microbatches 4 --web "$wasm/web" >> "$work/heal.log" 2>&1 &
  heal_pid=$!
  echo "$heal_pid" > "$work/heal.pid"
}
start_heal_cloud 0
for _ in $(seq 1 100); do grep -q 'listening on' "$work/heal.log" && break; sleep 0.1; done
heal_port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$work/heal.log" | cut -d: -f3)
[[ -n $heal_port ]] || fail "the cloud to restart did not start: $(cat "$work/heal.log")"
heal_token=$("$cloud_bin" pki token --state-dir "$work/heal-state" --client page-heal --ttl 10m)
heal_watch() {
  for _ in $(seq 1 3000); do
    compgen -G "$work/heal-state/checkpoints/page-heal/cloud-*.tdmc" > /dev/null && break
    sleep 0.1
  done
  kill -9 "$(cat "$work/heal.pid")"
  echo "killed the page's cloud at $(ls "$work/heal-state/checkpoints/page-heal" | tail -1)" >> "$work/heal.log"
  sleep 2
  start_heal_cloud "$heal_port"
  wait "$heal_pid"  # until cleanup stops it
}
heal_watch &
watch_pid=$!
shot=$build/browser-train.png
node "$src/tests/browser/train_in_browser.mjs" "https://127.0.0.1:$port/" "$token" "$other" "$files" "$shot" 50 \
  "$wasm/web" "https://127.0.0.1:$fed_port/" "$fed_token" "$work/egress.jsonl" "https://127.0.0.1:$vit_port/" "$vit_token" "$async_token" \
  "https://127.0.0.1:$busy_port/" "$busy_token" "$work/released" "https://127.0.0.1:$heal_port/" "$heal_token" ||
  fail "the browser run failed"
"$build/tools/tandem" audit verify "$work/egress.jsonl" > "$work/audit.out" || fail "the page's egress log: $(cat "$work/audit.out")"
grep -q "verifies: .* 1 run (client page-1)" "$work/audit.out" || fail "the page's egress log: $(cat "$work/audit.out")"
grep -Eq "^  Forward +200 messages .* activations f32" "$work/audit.out" || fail "the page's egress log: $(cat "$work/audit.out")"
echo "the page's egress log verifies: $(grep -c . "$work/egress.jsonl") lines"
grep -q "round 3: 1 of 1 edges" "$work/fed.log" || fail "the federated cloud closed no third round: $(cat "$work/fed.log")"
kill -0 "$cloud_pid" || fail "the cloud died"
grep -q "session 1 (token for page-1), cut 'pool2': 50 steps, 1600 samples" "$work/cloud.log" ||
  fail "the cloud did not train 50 steps of the page's session"
grep -q "session 4 (token for page-3), cut 'pool2': 10 steps, 160 samples" "$work/cloud.log" ||
  fail "the cloud did not train 10 steps on the page's local files"
grep -q "session 5 (token for page-4), cut 'pool2': 20 steps, 640 samples" "$work/cloud.log" ||
  fail "the cloud did not train 20 steps of the page's asynchronous session: $(cat "$work/cloud.log")"
grep -q "session 1 (token for page-vit), cut 'vit.encoder.layer.0.output.residual': 30 steps, 960 samples" "$work/vit.log" ||
  fail "the ViT cloud did not train 30 steps of the page's session: $(cat "$work/vit.log")"
grep -q "session [0-9]* (token for page-busy), cut 'pool2': 5 steps, 160 samples" "$work/busy.log" ||
  fail "the busy cloud did not train the page's 5 steps: $(cat "$work/busy.log")"
echo "PASS: the page trained 50 steps in Chromium, the loss fell; replayed and forged tokens refused; local files trained; the asynchronous pipeline trained; three federation rounds; the ViT's front trained; a busy cloud's page retried and trained (screenshot $shot)"
