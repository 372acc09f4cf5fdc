#!/usr/bin/env bash
# Issue 17's GPU checks in one run, on a GPU machine that cannot build tandem (the device
# machine some sessions are lent: CUDA, cuDNN and PyTorch, none of Debian's libraries, no
# network). Unpacks .devkit/kit.tar.xz (scripts/device_kit.sh, built here and carried) into
# build/release, points its ctest files at this checkout and the loader at the kit's libraries
# and at the CUDA and cuDNN libraries found there, then runs the stages asked for (default all),
# each under a time limit, logs in $OUT (else .devkit/out):
#   check: every binary's libraries resolve, and `tandem gpu` sees a GPU (always runs first)
#   tests: ctest's cuda tests: op, grad, train, split and federation on cuda against the reference
#   e2e:   e2e.cuda_cloud (one epoch with the cloud on cuda within 0.3 points of onednn; four
#          edges' micro-batches joined on cuda)
#   bench: bench/gpu/back_shard.sh (ROUNDS=2) and bench/gpu/capacity.sh (N = 1, 16, 64, 256 on
#          cuda, own shards and batched; one CPU session on onednn for the 50x bar)
#   alloc: train.no_allocation on cuda with the stacks of tandem's own allocations (addr2line)
#   managed: the cuda tests and e2e.cuda_cloud with tensors in managed memory (used in place by
#          kernels, TANDEM_CUDA_MEMORY=managed), the grad, train, split and federation tests with
#          calls running ahead (TANDEM_CUDA_ASYNC=1), then ResNet18's and spam-bert's backs
#          alone, page-locked against managed against managed and ahead, two rounds
#   one:   everything in one call (a session's device time fits one start and one call): the
#          cuda tests page-locked, managed and running ahead and e2e side by side, then bench
#          with one round of a quarter of the steps, the placements (one round), then
#          compute-sanitizer's memcheck over the cuda op and gradient tests in what is left of
#          ONE_DEADLINE (400) s
# Usage: bash bench/gpu/device_check.sh [check] [tests] [e2e] [bench] [managed] [one]   (`check` alone: no GPU work)
# Each stage's limits keep one 600 s call whole: `check tests e2e` in one call (limits 570 s),
# `bench` in the next (560 s), or `one`; the correctness bars first, as device time is short.
set -uo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
out=${OUT:-$src/.devkit/out}
mkdir -p "$out"
stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || stages=(tests e2e bench)
summary=$out/summary.txt
say() { echo "$*" | tee -a "$summary"; }
: > "$summary"

[[ -f .devkit/kit.tar.xz ]] || { say "no .devkit/kit.tar.xz: run scripts/device_kit.sh where tandem builds, and carry .devkit"; exit 1; }
build=$src/build/release
if [[ -e $build/CMakeCache.txt ]]; then say "build/release is a real build here: device_check.sh unpacks only where none is"; exit 1; fi
rm -rf "$build" && mkdir -p "$build" "$src/build/devkit"
tar -C "$src/build/devkit" -xJf .devkit/kit.tar.xz
cp -a "$src/build/devkit/build/." "$build/"
origin=$(cat "$src/build/devkit/ORIGIN") source_then=$(cat "$src/build/devkit/SOURCE")
kit=$src/build/devkit
tree=$(tr '\n' '\0' < "$kit/FILES" | xargs -0 sha256sum 2> /dev/null | sha256sum | cut -d' ' -f1)
if [[ $tree != "$(cat "$kit/TREE")" ]]; then
  say "stale kit: built from $(paste -sd' ' "$kit/COMMIT"), whose tracked files differ from this checkout's;"
  say "run scripts/device_kit.sh again here after the last change, and carry the new .devkit"
  exit 1
fi
say "kit built from $(paste -sd' ' "$kit/COMMIT"); this checkout's tracked files match it"
# The ctest files name the kit's build and source paths: this checkout's instead (build first:
# it lies inside the source).
find "$build" -name CTestTestfile.cmake -exec sed -i "s|$origin|$build|g; s|$source_then|$src|g" {} +

# CUDA's libraries from this machine: the toolkit's, and PyTorch's wheels (cuBLAS, cuDNN)
# wherever that machine's Python keeps them (its site-packages: nvidia/*/lib, torch/lib; asked of
# the Python itself, so a virtual environment or a user install is found too).
# The driver's libcuda where the loader does not already know it (a read-only mount there).
py_dirs=$("${PYTHON:-python3}" - 2> /dev/null <<'PY'
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")])
for root in sorted(roots):
    for d in glob.glob(os.path.join(root, "nvidia", "*", "lib")) + [os.path.join(root, "torch", "lib")]:
        if os.path.isdir(d):
            print(d)
PY
)
cuda_dirs=$(find /usr/local /opt /usr/lib $py_dirs -xdev \( -name 'libcublas.so.13*' -o -name 'libcublasLt.so.13*' -o \
  -name 'libcudnn.so.9*' -o -name 'libcudnn_graph.so.9*' \) -printf '%h\n' 2> /dev/null | sort -u | paste -sd:)
ldconfig -p | grep 'libcuda\.so\.1' > /dev/null || for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [[ -e $d/libcuda.so.1 ]] && cuda_dirs=$d${cuda_dirs:+:$cuda_dirs}
done
export LD_LIBRARY_PATH=$src/build/devkit/lib${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TANDEM_FASHION_MNIST_DIR=$src/build/devkit/data
export PYTHON=${PYTHON:-$(command -v python3)}
say "libraries: the kit's and ${cuda_dirs:-no CUDA libraries found}"

# check: no binary misses a library.
missing=0
for b in $(cd "$build" && find . -type f -perm -u+x ! -name '*.cmake'); do
  if ldd "$build/$b" | grep "not found" > /dev/null; then
    say "$b cannot load: $(ldd "$build/$b" | grep "not found" | paste -sd' ')"
    missing=1
  fi
done
[[ $missing == 0 ]] || exit 1
say "every binary loads; ctest lists $(ctest --test-dir "$build" -N -R '\.cuda$' | grep -c 'Test *#') cuda tests"
if ! gpu=$("$build/tools/tandem" gpu 2>&1); then
  say "no usable GPU: $gpu"
  [[ " ${stages[*]} " == " check " ]] && exit 0
  exit 77
fi
say "GPU: $gpu"
command -v nvidia-smi > /dev/null && nvidia-smi >> "$summary" 2>&1

status=0
# stage NAME SECONDS COMMAND...: runs it under a limit into $out/NAME.log; records PASS/FAIL.
stage() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >> "$out/$name.log" 2>&1
  local rc=$?
  say "$name: rc $rc after $((SECONDS - t0)) s ($(tail -1 "$out/$name.log"))"
  [[ $rc == 0 ]] || status=1
}
# placements ROUNDS: ResNet18's and spam-bert's backs alone (bench_back_shard's JSON line, and
# before it in placement.log where a step's time went), with tensors page-locked, in managed
# memory, and managed with calls running ahead (TANDEM_CUDA_ASYNC=1), alternating.
placements() {
  for _ in $(seq 1 "$1"); do
    for mode in "TANDEM_CUDA_MEMORY=pinned" "TANDEM_CUDA_MEMORY=managed" "TANDEM_CUDA_MEMORY=managed TANDEM_CUDA_ASYNC=1"; do
      while read -r name spec cut; do
        # shellcheck disable=SC2086  # the mode is two assignments at most
        stage placement 45 env $mode "$build/bench/bench_back_shard" "$spec" --cut "$cut" \
          --backend cuda --batch 64 --steps 30 --warmup 3 --breakdown 1
        say "  ($name, $mode)"
      done << 'MODELS'
resnet18 samples/models/resnet18-32.json relu17
spam-bert samples/spam-bert/model.json bert.encoder.layer.1.output.LayerNorm
MODELS
    done
  done
}
cuda_tests='\.cuda$|cuda_registry|^collective\.nccl$'
# With calls running ahead only a network's passes wait (Backend::wait): the op tests, which
# read a kernel's outputs right after the call, are not for that mode. Every tensor managed
# (TANDEM_CUDA_MANAGED_MIN_BYTES=0), so that the tests' small ones run ahead too.
async_tests='^(grad|train|split|federation)\..*\.cuda$'
for s in "${stages[@]}"; do
  case $s in
    check) ;;
    tests) stage tests 240 ctest --test-dir "$build" -R "$cuda_tests" --output-on-failure -j 4 ;;
    managed)
      stage tests_managed 240 env TANDEM_CUDA_MEMORY=managed ctest --test-dir "$build" -R "$cuda_tests" \
        --output-on-failure -j 4
      stage e2e_managed 330 env TANDEM_CUDA_MEMORY=managed ctest --test-dir "$build" -R '^e2e\.cuda_cloud$' \
        --output-on-failure
      stage tests_async 240 env TANDEM_CUDA_MEMORY=managed TANDEM_CUDA_ASYNC=1 TANDEM_CUDA_MANAGED_MIN_BYTES=0 ctest --test-dir "$build" \
        -R "$async_tests" --output-on-failure -j 4
      placements 2 ;;
    alloc) stage alloc 60 env TANDEM_ALLOC_TRACE=1 TANDEM_BACKEND=cuda "$build/tests/tandem_train_tests" \
      --gtest_filter=Train.SteadyStateStepDoesNotAllocate ;;
    e2e) stage e2e 330 ctest --test-dir "$build" -R '^e2e\.cuda_cloud$' --output-on-failure ;;
    bench)
      stage back_shard 220 env ROUNDS=2 bash bench/gpu/back_shard.sh
      stage capacity 170 bash bench/gpu/capacity.sh
      stage capacity 110 env SHARD=batched bash bench/gpu/capacity.sh
      stage capacity 60 env DEVICE=cpu EDGES=1 bash bench/gpu/capacity.sh ;;
    one)
      stage tests 200 ctest --test-dir "$build" -R "$cuda_tests" --output-on-failure --timeout 90 -j 4 &
      stage tests_managed 200 env TANDEM_CUDA_MEMORY=managed ctest --test-dir "$build" -R "$cuda_tests" \
        --output-on-failure --timeout 90 -j 4 &
      stage tests_async 200 env TANDEM_CUDA_MEMORY=managed TANDEM_CUDA_ASYNC=1 TANDEM_CUDA_MANAGED_MIN_BYTES=0 ctest --test-dir "$build" \
        -R "$async_tests" --output-on-failure --timeout 90 -j 2 &
      stage e2e 200 ctest --test-dir "$build" -R '^e2e\.cuda_cloud$' --output-on-failure &
      wait
      stage back_shard 150 env ROUNDS=1 QUICK=1 bash bench/gpu/back_shard.sh
      placements 1
      stage capacity 60 env STEPS=10 bash bench/gpu/capacity.sh
      stage capacity 30 env STEPS=10 SHARD=batched EDGES="1 16 64" bash bench/gpu/capacity.sh
      stage capacity 25 env STEPS=10 DEVICE=cpu EDGES=1 bash bench/gpu/capacity.sh
      for t in op grad; do
        left=$((${ONE_DEADLINE:-400} - SECONDS))
        command -v compute-sanitizer > /dev/null && ((left > 20)) || break
        stage sanitize "$left" env TANDEM_BACKEND=cuda OMP_NUM_THREADS=1 compute-sanitizer --tool memcheck \
          --print-limit 30 --error-exitcode 3 "$build/tests/tandem_${t}_tests"
      done ;;
    *) say "unknown stage '$s' (check, tests, alloc, e2e, bench, managed, one)"; exit 2 ;;
  esac
done
# (a stage run in the background records its failure only in the summary)
grep -q ': rc [1-9]' "$summary" && status=1
exit $status
