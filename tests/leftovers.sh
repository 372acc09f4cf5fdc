#!/usr/bin/env bash
# Run last by ctest: fails when a program of this build (tandem-cloud, tandem-edge, tandem,
# a test binary) is still running, i.e. a test that started a process did not stop it.
# Usage: leftovers.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd -P)
scan() {
left=()
for exe in /proc/[0-9]*/exe; do
  target=$(readlink "$exe" 2> /dev/null) || continue
  pid=${exe#/proc/}
  pid=${pid%/exe}
  [[ $pid == "$$" || $pid == "$PPID" ]] && continue
  [[ $target == "$build"/* ]] || continue
  left+=("$pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | cut -c1-160)")
done
}
# A process sent SIGTERM by its test's last step may take a moment to exit.
for _ in 1 2 3 4 5 6 7 8 9 10; do
  scan
  ((${#left[@]})) || break
  sleep 0.5
done
if ((${#left[@]})); then
  echo "FAIL: ${#left[@]} process(es) of this build still run after the suite:"
  printf '  %s\n' "${left[@]}"
  exit 1
fi
echo "no process of $build left running"
