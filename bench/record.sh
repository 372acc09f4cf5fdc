#!/usr/bin/env bash
# Runs a benchmark and records it: bench/results/DATE-NAME.md (DATE-NAME-2.md and on when one
# of that day exists) with the date, the machine, the commit, the command and its output.
# A benchmark that fails records nothing and fails this script with its status.
# Usage: bash bench/record.sh NAME -- COMMAND [ARGS...]
#   e.g. bash bench/record.sh split_vs_pytorch -- env ROUNDS=5 bash bench/split_vs_pytorch.sh
set -euo pipefail
if (($# < 3)) || [[ $2 != -- ]]; then
  echo "usage: bash bench/record.sh NAME -- COMMAND [ARGS...]" >&2
  exit 2
fi
name=$1
shift 2
[[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "bench/record.sh: NAME may hold letters, digits, '.', '_' and '-' only" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
date=$(date -u +%Y-%m-%d)
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
set +e
"$@" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
set -e
if ((status != 0)); then
  echo "bench/record.sh: '$*' failed (exit status $status): nothing recorded" >&2
  exit "$status"
fi
cpu=$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1)
memory=$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1 || true)
commit=$(git -C "$root" describe --always --dirty --abbrev=12 2> /dev/null || echo "unknown (not a git checkout)")
file=$root/bench/results/$date-$name.md
for n in $(seq 2 99); do
  [[ -e $file ]] || break
  file=$root/bench/results/$date-$name-$n.md
done
mkdir -p "$root/bench/results"
{
  echo "date: $started"
  echo "machine: $(hostname), ${cpu:-unknown CPU}, $(nproc) cores, $memory${gpu:+, $gpu}"
  echo "commit: $commit"
  printf 'command:'
  printf ' %q' "$@"
  printf '\n\n```\n'
  cat "$out"
  printf '```\n'
} > "$file"
echo "recorded: ${file#"$root"/}"
