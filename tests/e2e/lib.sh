# What the end-to-end and load scripts share: starting a tandem-cloud service on a free
# loopback port and reading its Prometheus counters. Source it after setting cloud_bin,
# model and work, and defining fail().

# start_cloud_as LOG ARGS...: `tandem-cloud serve` on 127.0.0.1:0 with --state-dir
# $work/state and --model $model, output in $work/LOG.log. Waits until it listens (and
# serves metrics, when ARGS has --metrics-listen); sets cloud_pid, port and metrics_port.
start_cloud_as() {
  local log=$work/$1.log ready='listening on'; shift
  [[ " $* " == *" --metrics-listen "* ]] && ready='metrics for Prometheus'
  "$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$model" "$@" > "$log" 2>&1 &
  cloud_pid=$!
  for _ in $(seq 1 100); do grep -q "$ready" "$log" && break; sleep 0.1; done
  port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$log" | cut -d: -f3 || true)
  metrics_port=$(grep -o 'http://127.0.0.1:[0-9]*/metrics' "$log" | cut -d: -f3 | cut -d/ -f1 || true)
  [[ -n $port ]] || fail "the cloud ($1) did not start"
  [[ " $* " != *" --metrics-listen "* || -n $metrics_port ]] || fail "the cloud ($1) serves no metrics"
}

# scrape PATH: the cloud's metrics listener's answer; metric NAME: one counter's value.
scrape() {
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$metrics_port$1', timeout=5).read().decode())"
}
metric() { scrape /metrics | awk -v m="$1" '$1 == m { print $2 }'; }

# stop_cloud [PID]: SIGTERM to the cloud (cloud_pid by default), then its exit status must be
# 0: a crash or, under ASan, a leak at its shutdown fails the test. A cloud killed with -9 on
# purpose is waited for with `|| true` instead.
stop_cloud() {
  local pid=${1:-$cloud_pid} rc=0
  kill "$pid" 2> /dev/null || true
  wait "$pid" || rc=$?
  [[ $rc == 0 ]] || fail "the cloud (pid $pid) exited with status $rc when stopped (want 0: it crashed or leaked at shutdown)"
}

# need_figures WHAT VALUE...: fails unless every VALUE is a number. A benchmark whose run or peer
# run failed stops there, instead of counting the missing figure as 0 in a median.
need_figures() {
  local what=$1 v
  shift
  for v in "$@"; do
    [[ $v =~ ^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$ ]] || fail "$what gave no figure ('$v'): a failed run fails the benchmark"
  done
}

# free_ports N: N loopback ports free now (bound together, then released), on one line.
free_ports() { /usr/bin/python3 -c "
import socket
s = [socket.socket() for _ in range($1)]
for x in s: x.bind(('127.0.0.1', 0))
print(' '.join(str(x.getsockname()[1]) for x in s))"; }

# stage_identities PARTY...: a throwaway PKI in $work/ca and a certificate a party in
# $work/id/PARTY (its common name the party's, valid for 127.0.0.1 and localhost).
stage_identities() {
  local p
  "$cloud_bin" pki init --state-dir "$work/ca" > /dev/null
  for p in "$@"; do
    "$cloud_bin" pki issue --state-dir "$work/ca" --client "$p" --hosts 127.0.0.1,localhost --out "$work/id/$p" > /dev/null
  done
}

# stop_started: stops every process this script started in the background and their children
# (a function run with & is a subshell whose child is the edge), then waits for them: a
# cleanup for every exit path, so a failure leaves nothing running.
stop_started() {
  local p
  for p in $(jobs -p); do
    pkill -TERM -P "$p" 2> /dev/null || true
    kill "$p" 2> /dev/null || true
  done
  wait 2> /dev/null || true
}

# same_final_weights RUN_A RUN_B STEP: exports each run's edge and cloud checkpoints of STEP
# (edge: $work/ckpt-RUN, identity $work/id-RUN; cloud: $work/state/checkpoints/RUN) with
# tandem export, and fails unless the two files are byte-identical.
same_final_weights() {
  local run
  for run in "$1" "$2"; do
    "$tandem_bin" export --model "$model" --edge-ckpt "$work/ckpt-$run/edge-$3.tdmc" --identity "$work/id-$run" \
      --cloud-ckpt "$work/state/checkpoints/$run/cloud-$3.tdmc" --out "$work/$run.safetensors" > /dev/null ||
      fail "export of the $run run"
  done
  cmp "$work/$1.safetensors" "$work/$2.safetensors" || fail "the $2 run's weights differ from the $1 run's"
}

# has_checkpoint_from DIR STEP: true once DIR holds a checkpoint (NAME-STEP.tdmc, tandem
# stage's CheckpointStore) of step STEP or later.
has_checkpoint_from() {
  local f n
  for f in "$1"/*.tdmc; do
    [[ -e $f ]] || continue
    n=${f##*-}
    n=${n%.tdmc}
    ((10#$n >= $2)) && return 0
  done
  return 1
}

# replica_state FROM DIR: a cloud replica's state folder DIR with the consortium's CA, server
# identity and register of issued certificates copied from FROM (where `pki init` wrote them):
# every replica of a set serves the same PKI.
replica_state() {
  mkdir -p "$2"
  cp "$1"/*.crt "$1"/*.key "$2/" 2> /dev/null || fail "no PKI to copy from $1: $(ls "$1")"
  if [[ -f $1/issued.tsv ]]; then cp "$1/issued.tsv" "$2/"; fi
}

# epoch_rate FILE...: the sum of each file's last "samples_per_s" (the epoch line tandem stage,
# tandem train and tandem-edge print); a run without one fails (a failed run has none).
epoch_rate() {
  local f v sum=0
  for f in "$@"; do
    v=$(grep -o '"samples_per_s":[0-9.]*' "$f" | tail -1 | cut -d: -f2)
    [[ -n $v ]] || fail "no epoch line in $f"
    sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { printf "%.1f", a + b }')
  done
  echo "$sum"
}
