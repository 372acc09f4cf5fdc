#!/usr/bin/env bash
# The cuda backend is a module (libtandem-cuda.so) loaded when cuda is asked for, so a CPU
# cloud neither needs nor maps CUDA's libraries (issue 36):
# - tandem-cloud, tandem and tandem-edge link no CUDA library (they start where none is);
# - a cloud on the default backend, on a machine where no GPU can be used, serves on onednn
#   with no CUDA library mapped and holds under 50 MB at idle;
# - where this build has the module: tandem gpu loads it (a GPU, or cudart's reason there is
#   none, never a loading error); a missing module and another build's module are refused
#   with their exact texts; the cloud asked for cuda without a GPU says why and what to use;
#   every binary that loads it exports each core symbol it needs, and so for NCCL's module.
# Usage: cuda_module.sh BUILD_DIR SOURCE_DIR [cuda (this build has the module)]
set -euo pipefail
build=$1 src=$2 with_cuda=${3:-}
cloud_bin=$build/cloud/tandem-cloud tandem_bin=$build/tools/tandem module=$build/lib/libtandem-cuda.so
model=$src/samples/fashion-mnist/model.json
work=$(mktemp -d)
cloud_pid=
cleanup() {
  [[ -z $cloud_pid ]] || kill "$cloud_pid" 2> /dev/null || true
  wait 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -n 20 "$work"/*.log 2> /dev/null || true; exit 1; }
source "$src/tests/e2e/lib.sh"
cuda_libs='lib(cuda|cudart|cublas|cublasLt|cudnn|nccl)[^/ ]*\.so'

for b in "$cloud_bin" "$tandem_bin" "$build/edge/tandem-edge"; do
  if ldd "$b" | grep -E "$cuda_libs"; then fail "$b links CUDA's libraries: it could not start where they are missing"; fi
done
echo "tandem-cloud, tandem and tandem-edge link no CUDA library"

gpu=no
if [[ -n $with_cuda ]] && "$tandem_bin" gpu > /dev/null 2>&1; then gpu=yes; fi
# On a GPU machine the default is cuda: the CPU cloud is then asked for by name.
if [[ $gpu == yes ]]; then start_cloud_as cloud --backend onednn; else start_cloud_as cloud; fi
grep -q "back shard on onednn" "$work/cloud.log" || fail "the CPU cloud is not on onednn: $(head -1 "$work/cloud.log")"
sleep 1
if grep -E "$cuda_libs" "/proc/$cloud_pid/maps"; then fail "the CPU cloud maps CUDA's libraries"; fi
rss_kb=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$cloud_pid/status")
((rss_kb < 50 * 1024)) || fail "the CPU cloud holds $((rss_kb / 1024)) MiB at idle (bar: under 50 MB)"
echo "a CPU cloud on onednn: no CUDA library mapped, $((rss_kb / 1024)) MiB at idle (bar 50 MB)"
stop_cloud
cloud_pid=

if [[ -z $with_cuda ]]; then
  echo "this build has no cuda backend (no nvcc when it was configured): nothing more to check"
  exit 0
fi
[[ -f $module ]] || fail "this build has the cuda backend but no $module"

# Every core symbol the module needs is exported by each binary that loads it.
needed=$(nm -D -u "$module" | awk '$1 == "U" && $2 ~ /tandem/ { print $2 }')
[[ -n $needed ]] || fail "the module needs no core symbol: it carries a core of its own (two tensor memories)"
for b in "$cloud_bin" "$tandem_bin" "$build/bench/bench_back_shard"; do
  exported=$(nm -D --defined-only "$b" | awk '{ print $3 }')
  for s in $needed; do
    grep -qxF "$s" <<< "$exported" || fail "$b does not export $(c++filt "$s"), which the module needs"
  done
done
echo "tandem-cloud, tandem and bench_back_shard export the $(wc -w <<< "$needed") core symbols the module needs"
# NCCL's module (collective/nccl_group.h) the same way, for the binaries that may load it.
nccl_module=$build/lib/libtandem-nccl.so
if [[ -f $nccl_module ]]; then
  # It uses only core's inline parts (Error, cat): none of its own defined strongly, so no
  # second copy of a core function or global can differ from the binary's.
  own=$(nm -D --defined-only "$nccl_module" | awk '$2 ~ /^[TDB]$/ && $3 ~ /N6tandem/ { print $3 }')
  [[ -z $own ]] || fail "NCCL's module defines core symbols of its own: $(c++filt $own | head -3)"
  needed=$(nm -D -u "$nccl_module" | awk '$1 == "U" && $2 ~ /tandem/ { print $2 }')
  for b in "$cloud_bin" "$tandem_bin" "$build/tests/tandem_replica_tests"; do
    exported=$(nm -D --defined-only "$b" | awk '{ print $3 }')
    for s in $needed; do
      grep -qxF "$s" <<< "$exported" || fail "$b does not export $(c++filt "$s"), which NCCL's module needs"
    done
  done
  echo "NCCL's module defines no core symbol; tandem-cloud, tandem and the replica tests export the $(wc -w <<< "$needed") it needs"
fi

out=$("$tandem_bin" gpu 2>&1) || true
if [[ $gpu == yes ]]; then
  echo "tandem gpu: $out"
else
  [[ $out == "no CUDA device: "* ]] || fail "tandem gpu without a GPU: want cudart's reason, got: $out"
  echo "tandem gpu loads the module and says: $out"
  rc=0
  "$cloud_bin" serve --listen 127.0.0.1:0 --state-dir "$work/state" --model "$model" --backend cuda \
    > "$work/cuda.log" 2>&1 || rc=$?
  [[ $rc != 0 ]] || fail "the cloud served on cuda without a GPU"
  grep -qF "$out; this machine can train on onednn (--backend onednn)" "$work/cuda.log" ||
    fail "the cloud on cuda without a GPU: $(cat "$work/cuda.log")"
  echo "the cloud asked for cuda: $(grep -F "$out" "$work/cuda.log")"
fi

out=$(TANDEM_CUDA_MODULE=$work/none.so "$tandem_bin" gpu 2>&1) && fail "tandem gpu without its module succeeded"
want="the cuda backend's module could not be loaded: $work/none.so: cannot open shared object file: No such file or directory; it is built beside tandem where nvcc was found (build/<preset>/lib/), or set TANDEM_CUDA_MODULE to its path"
[[ $out == "$want" ]] || fail "a missing module: got '$out', want '$want'"
echo "a missing module is refused: $out"

stamp=$(awk -F= '/^TANDEM_BUILD_STAMP:INTERNAL=/ { print $2 }' "$build/CMakeCache.txt")
[[ $stamp =~ ^[0-9a-f]{16}$ ]] || fail "no build stamp in $build/CMakeCache.txt"
/usr/bin/python3 -c "
import sys
data = open(sys.argv[1], 'rb').read()
assert data.count(sys.argv[2].encode()) == 1, 'the stamp is not in the module once'
open(sys.argv[3], 'wb').write(data.replace(sys.argv[2].encode(), b'0123456789abcdef'))" "$module" "$stamp" "$work/other.so"
out=$(TANDEM_CUDA_MODULE=$work/other.so "$tandem_bin" gpu 2>&1) && fail "tandem gpu on another build's module succeeded"
want="the cuda backend's module $work/other.so comes from another build (stamp 0123456789abcdef, this binary's $stamp): rebuild both, or point TANDEM_CUDA_MODULE at this build's"
[[ $out == "$want" ]] || fail "another build's module: got '$out', want '$want'"
echo "another build's module is refused: $out"
echo "PASS"
