#!/usr/bin/env bash
# The cloud's TLS on one service thread against several (tandem-cloud --io-threads): N edges
# (bench_capacity: a thread and a TLS WebSocket each, replaying a recorded micro-batch of the
# cut's activations) against a CPU cloud (onednn, one kernel thread a session, a back shard
# each), the two settings alternated ROUNDS times in one run; prints each round's aggregate
# samples/s and the median ratio. On a machine whose edges share its cores the ratio says
# little about a cloud whose edges are elsewhere: state the cores.
# Usage: [ROUNDS=5] [EDGES=16] [STEPS=40] [THREADS=2] bash bench/io_threads.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5} edges=${EDGES:-16} steps=${STEPS:-40} threads=${THREADS:-2}
run() {  # run IO_THREADS: samples/s
  DEVICE=cpu EDGES=$edges STEPS=$steps IO_THREADS=$1 bash bench/gpu/capacity.sh |
    grep -o '[0-9.]* samples/s' | cut -d' ' -f1
}
echo "io_threads: $edges edges, $steps steps each, cloud on onednn, 1 vs $threads TLS threads, $rounds rounds alternated; $(nproc) cores"
one=() many=()
for r in $(seq 1 "$rounds"); do
  a=$(run 1) b=$(run "$threads")
  [[ $a =~ ^[0-9.]+$ && $b =~ ^[0-9.]+$ ]] || { echo "FAIL: round $r gave no figure ('$a', '$b')"; exit 1; }
  one+=("$a") many+=("$b")
  echo "round $r: 1 thread $a samples/s, $threads threads $b samples/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m1=$(median "${one[@]}") m2=$(median "${many[@]}")
awk -v a="$m1" -v b="$m2" -v t="$threads" 'BEGIN { printf "median: 1 thread %.1f samples/s, %d threads %.1f samples/s: %.2fx\n", a, t, b, b / a }'
