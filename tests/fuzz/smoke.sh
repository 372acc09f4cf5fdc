#!/usr/bin/env bash
# Runs every libFuzzer harness of a fuzz build (the fuzz preset) for a bounded time: first
# over its regression inputs (tests/fuzz/regressions/<name>/, each once), then fuzzing from
# a temporary copy of its seed corpus (tests/fuzz/corpus/<name>/), so nothing is written into
# the repository. Fails if any harness crashes, leaks, times out or trips a sanitizer; the
# crashing input and the log are kept in the work folder it names.
# Usage: bash tests/fuzz/smoke.sh <build dir of the harnesses> [seconds per harness, default 45]
# The file parsers (model_spec, checkpoint, safetensors, token, onnx) get a third of it; the
# two-party session's harnesses (cloud_session, edge_session and their U-shaped and sequence
# kinds: a protocol that is moving onto the stage peer) two thirds; stage_peer, which every
# party of a pipeline and tandem-cloud's pipeline sessions run, all of it.
# (env TANDEM_FUZZ_JOBS: harnesses run at once, default 2).
set -uo pipefail
bin=${1:?usage: smoke.sh <build/fuzz/tests/fuzz> [seconds]}
seconds=${2:-45}
jobs=${TANDEM_FUZZ_JOBS:-2}
src=$(cd "$(dirname "$0")" && pwd)
harnesses=(cloud_session edge_session ushaped_cloud_session ushaped_edge_session sequence_cloud_session sequence_edge_session
  stage_peer model_spec checkpoint safetensors token onnx)
work=$(mktemp -d /tmp/tandem-fuzz-smoke-XXXXXX)

run_one() {
  local h=$1 exe=$bin/${1}_fuzz
  local log=$work/$h.log
  [[ -x $exe ]] || { echo "fuzz smoke: $exe is missing (build the fuzz preset)" >"$log"; return 1; }
  mkdir -p "$work/$h.corpus" "$work/$h.artifacts"
  cp "$src/corpus/$h"/* "$work/$h.corpus/"
  local opts=(-timeout=10 -rss_limit_mb=2048 -close_fd_mask=1 -artifact_prefix="$work/$h.artifacts/")
  if compgen -G "$src/regressions/$h/*" >/dev/null; then
    "$exe" "${opts[@]}" "$src/regressions/$h"/* >"$log" 2>&1 || return 1
  fi
  local t=$seconds
  case $h in
    model_spec | checkpoint | safetensors | token | onnx) t=$(((seconds + 2) / 3)) ;;
    stage_peer) ;;
    *) t=$((seconds * 2 / 3)) ;;
  esac
  "$exe" "${opts[@]}" -max_total_time="$t" -print_final_stats=1 "$work/$h.corpus" >>"$log" 2>&1
}

start=$(date +%s)
declare -A pid
failed=()
for h in "${harnesses[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_one "$h" &
  pid[$h]=$!
done
for h in "${harnesses[@]}"; do
  if wait "${pid[$h]}"; then
    stats=$(grep -E '^#[0-9]+.*DONE' "$work/$h.log" | tail -1 | sed 's/^#\([0-9]*\)[[:space:]]*DONE[[:space:]]*/\1 execs, /')
    echo "fuzz smoke: $h ok ($stats)"
  else
    failed+=("$h")
    echo "fuzz smoke: $h FAILED; its log ($work/$h.log) ends:"
    tail -n 40 "$work/$h.log" | sed 's/^/    /'
    ls "$work/$h.artifacts" 2>/dev/null | sed "s|^|    input: $work/$h.artifacts/|"
  fi
done
echo "fuzz smoke: ${#harnesses[@]} harnesses, ${seconds}s each (the parsers half), $((jobs)) at a time: $(($(date +%s) - start))s"
if ((${#failed[@]})); then
  echo "fuzz smoke: failed: ${failed[*]} (work folder $work kept)"
  exit 1
fi
rm -rf "$work"
