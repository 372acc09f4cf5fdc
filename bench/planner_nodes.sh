#!/usr/bin/env bash
# The pipeline partitioner on machines of different speed and memory, against measurement:
# three machines emulated here with cgroups (cgroup v1 cpu quotas: a machine of speed S gets S
# of a core, the quota enforced every 10 ms; memory limits where memory_mb is given), one
# `tandem stage` process each (one kernel thread, mutual TLS on loopback). `tandem plan --nodes
# FILE --profile` measures the model here node by node and predicts every choice of cuts at
# K; then each choice that fits every machine's memory runs as three processes, each in its
# machine's cgroup, and the first party's second-epoch samples/s gives its step time (the
# first epoch warms up). The chosen cuts and the sweep's fastest few then run again a few
# times, and their medians decide. Prints each choice, the prediction's error for the chosen
# cuts and how far they are from the best measured (bars: within 15% and 10%). Needs root
# (cgroups).
# Usage: bash bench/planner_nodes.sh [SPEC NODES BATCH K]
#   (default samples/models/resnet18-32.json, three machines of speed 0.4, 0.8 and 0.4, the
#   first with 40 MiB for training, 16, 4; BACKEND, STEPS, LIMIT (candidates measured, best
#   predicted first; 0: all), FINALISTS and ROUNDS in the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-samples/models/resnet18-32.json}
nodes=${2:-}
batch=${3:-16} k=${4:-4}
backend=${BACKEND:-onednn} steps=${STEPS:-4} limit=${LIMIT:-0}
tandem=$PWD/build/release/tools/tandem cloud_bin=$PWD/build/release/cloud/tandem-cloud
[[ -x $tandem && -x $cloud_bin ]] || bash scripts/setup.sh release > /dev/null
fail() { echo "FAIL: $*" >&2; exit 1; }
cg_cpu=/sys/fs/cgroup/cpu cg_mem=/sys/fs/cgroup/memory
[[ -w $cg_cpu && -w $cg_mem ]] || fail "needs root and cgroup v1's cpu and memory controllers at $cg_cpu and $cg_mem"
work=$(mktemp -d)
groups=()
cleanup() {
  local g
  for g in "${groups[@]}"; do rmdir "$cg_cpu/$g" "$cg_mem/$g" 2> /dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # the cgroups go on every exit
if [[ -z $nodes ]]; then
  nodes=$work/nodes.toml
  printf '[scanner]\nspeed = 0.4\nmemory_mb = 40\nlink_mbps = 10000\n[gpu-box]\nspeed = 0.8\nlink_mbps = 10000\n[cloud]\nspeed = 0.4\n' > "$nodes"
fi
# The machines, in the file's order: name, speed and memory (MiB, 0 for none).
mapfile -t machines < <(awk '
  /^\[/ { if (name != "") print name, speed, memory; name = substr($0, 2, length($0) - 2); speed = 0; memory = 0 }
  /^speed *=/ { speed = $3 } /^memory_mb *=/ { memory = $3 }
  END { if (name != "") print name, speed, memory }' "$nodes")
((${#machines[@]} >= 2)) || fail "$nodes: two machines or more, each with speed = S (this machine's share)"
parties=()
for ((i = 0; i < ${#machines[@]}; i++)); do
  read -r name speed memory <<< "${machines[$i]}"
  awk -v s="$speed" 'BEGIN { exit !(s > 0 && s <= 1) }' || fail "[$name] speed = $speed: give each machine a share of one core, in (0, 1]"
  parties+=("$name")
  g=tandem-bench-$$-$i
  mkdir -p "$cg_cpu/$g" "$cg_mem/$g"
  groups+=("$g")
  echo 10000 > "$cg_cpu/$g/cpu.cfs_period_us"
  awk -v s="$speed" 'BEGIN { printf "%d\n", s * 10000 }' > "$cg_cpu/$g/cpu.cfs_quota_us"
  # What training may take there, and the process around it (binary, libraries, TLS) besides.
  if [[ $memory != 0 ]]; then echo $(((memory + 256) * 1048576)) > "$cg_mem/$g/memory.limit_in_bytes"; fi
done

"$tandem" plan --model "$spec" --nodes "$nodes" --profile --backend "$backend" --batch "$batch" --microbatches "$k" \
  --all > "$work/plan.txt" 2> "$work/plan.err" || { cat "$work/plan.err"; fail "tandem plan failed"; }
sed -n 's/^measured here/measured here/p' "$work/plan.err"
chosen=$(sed -n 's/^recommended: cut=\([^ ]*\) .*/\1/p' "$work/plan.txt")
[[ -n $chosen ]] || fail "tandem plan recommended nothing"
# Every choice that fits, best predicted first: "cuts predicted_step_s".
sed -n 's/^{"candidate":"\([^"]*\)","microbatches":[0-9]*,"predicted_step_s":\([0-9.]*\),"fits":true}$/\1 \2/p' \
  "$work/plan.txt" | sort -k2 -g > "$work/candidates.txt"
total=$(wc -l < "$work/candidates.txt")
((total > 0)) || fail "no choice of cuts fits: $(cat "$work/plan.txt")"
((limit > 0)) && head -n "$limit" "$work/candidates.txt" > "$work/measured.txt" || cp "$work/candidates.txt" "$work/measured.txt"
grep -q "^$chosen " "$work/measured.txt" || grep "^$chosen " "$work/candidates.txt" >> "$work/measured.txt"

/usr/bin/python3 bench/random_dataset.py "$spec" "$work/data" $((batch * steps)) "$batch"
source tests/e2e/lib.sh
stage_identities "${parties[@]}"

# measure CUTS: the first party's second-epoch step time, every party in its machine's cgroup.
measure() {
  local i ports pids=() rc t sps
  read -r -a ports <<< "$(free_ports ${#parties[@]})"
  {
    echo "model = \"$PWD/$spec\""
    echo "cut = \"$1\""
    echo "pipeline-schedule = \"1f1b\""
    echo "batch = $batch"
    echo "microbatches = $k"
    echo "epochs = 2"
    echo "data = \"$work/data\""
    echo "momentum = 0.9"
    for i in "${!parties[@]}"; do
      echo "[${parties[$i]}]"
      echo "address = \"127.0.0.1:${ports[$i]}\""
      echo "identity = \"id/${parties[$i]}\""
      echo "backend = \"$backend\""
      echo "threads = 1"
    done
  } > "$work/run.toml"
  for ((i = ${#parties[@]} - 1; i >= 0; i--)); do
    OMP_NUM_THREADS=1 bash -c 'echo $$ > "$1/cgroup.procs" && echo $$ > "$2/cgroup.procs" && shift 2 && exec "$@"' _ \
      "$cg_cpu/${groups[$i]}" "$cg_mem/${groups[$i]}" \
      "$tandem" stage --deployment "$work/run.toml" --party "${parties[$i]}" --wait-s 60 > "$work/party-$i.log" 2>&1 &
    pids[$i]=$!
  done
  for i in "${!parties[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    ((rc == 0)) || { cat "$work"/party-*.log >&2; fail "cuts $1: party ${parties[$i]} exited with $rc"; }
  done
  t=$(grep '"epoch":2,' "$work/party-0.log") || fail "cuts $1: no second epoch: $(cat "$work/party-0.log")"
  sps=$(sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p' <<< "$t")
  need_figures "cuts $1" "$sps"
  awk -v b="$batch" -v s="$sps" 'BEGIN { printf "%.4f\n", b / s }'
}

echo "machines: ${machines[*]} (name speed memory_mb); batch $batch, K $k, $steps timed steps, $backend"
echo "measuring $(wc -l < "$work/measured.txt") of the $total choices that fit (best predicted first)"
echo "cuts predicted_step_s measured_step_s"
while read -r cuts predicted; do
  measured=$(measure "$cuts")
  echo "$cuts $predicted $measured"
  echo "$cuts $predicted $measured" >> "$work/sweep.txt"
done < "$work/measured.txt"
# One run a choice is noisy on a shared machine, and the lowest of many noisy runs is lucky:
# the chosen cuts and the sweep's fastest FINALISTS (default 5) run ROUNDS more times
# (default 3), and their medians decide.
finalists=${FINALISTS:-5} rounds=${ROUNDS:-3}
{ grep "^$chosen " "$work/sweep.txt"; sort -k3 -g "$work/sweep.txt" | grep -v "^$chosen " | head -n "$finalists"; } > "$work/final.txt"
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "finalists, $rounds more runs each: cuts predicted_step_s runs... median_step_s"
best_cuts="" best="" chosen_measured="" chosen_predicted=""
while read -r cuts predicted first; do
  runs=("$first")
  for ((r = 0; r < rounds; r++)); do runs+=("$(measure "$cuts")"); done
  m=$(median "${runs[@]}")
  echo "$cuts $predicted ${runs[*]} $m"
  if [[ -z $best ]] || awk -v a="$m" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$m best_cuts=$cuts; fi
  if [[ $cuts == "$chosen" ]]; then chosen_measured=$m chosen_predicted=$predicted; fi
done < "$work/final.txt"
awk -v c="$chosen" -v p="$chosen_predicted" -v m="$chosen_measured" -v bc="$best_cuts" -v b="$best" 'BEGIN {
  printf "chosen %s: predicted %.4f s, measured %.4f s (median): prediction off by %+.1f%% (bar: within 15%%)\n", c, p, m, 100 * (p - m) / m
  printf "best measured %s: %.4f s (median); the chosen cuts are %.1f%% slower (bar: within 10%%)\n", bc, b, 100 * (m - b) / b }'
