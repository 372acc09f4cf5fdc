#!/usr/bin/env bash
# Packs what issue 17's GPU checks need into one file for a machine that cannot build tandem:
# the GPU machine lent to some sessions has CUDA, cuDNN and PyTorch but none of Debian's
# libraries and no network. The kit (.devkit/kit.tar.xz, ignored by git) holds the release
# build's binaries that the checks run, at their build paths, with the build's ctest files; the
# Debian shared libraries they load (not glibc, libstdc++ or CUDA's, which that machine has
# newer); and Fashion-MNIST. bench/gpu/device_check.sh unpacks and runs it there.
# Usage: bash scripts/device_kit.sh   (after scripts/setup.sh release; carry .devkit)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/release out=.devkit
[[ -x $build/cloud/tandem-cloud ]] || { echo "no release build: bash scripts/setup.sh release"; exit 1; }
grep -q "op.conv2d.cuda" "$build/tests/CTestTestfile.cmake" ||
  { echo "the release build has no cuda backend (nvcc was not found when it was configured)"; exit 1; }
binaries=(cloud/tandem-cloud edge/tandem-edge tools/tandem bench/bench_back_shard bench/bench_capacity
          tests/tandem_op_tests tests/tandem_grad_tests tests/tandem_train_tests tests/tandem_split_tests
          tests/tandem_federation_tests tests/tandem_pipeline_tests lib/libtandem-cuda.so
          tests/tandem_replica_tests tests/tandem_replica_child lib/libtandem-nccl.so)
# Every binary a cuda test runs travels (a test whose binary is missing there is "Not Run").
for b in $(grep -E '^add_test\(\[=\[[^]]*(\.cuda|cuda_registry|collective\.nccl)\]=\]' "$build/tests/CTestTestfile.cmake" |
           grep -o "$(realpath "$build")/tests/tandem_[a-z_]*" | sed "s|^$(realpath "$build")/||" | sort -u); do
  [[ " ${binaries[*]} " == *" $b "* ]] || { echo "a cuda test runs $b, which the kit leaves out: add it to binaries"; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build" "$stage/lib" "$stage/data"
for b in "${binaries[@]}"; do
  [[ -x $build/$b ]] || { echo "missing $build/$b: build the release preset first"; exit 1; }
  mkdir -p "$stage/build/$(dirname "$b")"
  cp "$build/$b" "$stage/build/$b"
done
# ctest's files, so ctest there runs the cuda tests as here (paths are this build's: ORIGIN).
(cd "$build" && find . -name CTestTestfile.cmake) | while read -r f; do
  mkdir -p "$stage/build/$(dirname "$f")"
  cp "$build/$f" "$stage/build/$f"
done
realpath "$build" > "$stage/ORIGIN"
realpath . > "$stage/SOURCE"
# What the kit was built from: the commit, and a digest of every tracked file as it is here, which
# device_check.sh recomputes over the carried checkout (that has no .git) and refuses a kit that
# differs: binaries from one tree with the tests and scripts of another measure nothing.
git rev-parse HEAD > "$stage/COMMIT"
git diff --quiet HEAD || echo "(with uncommitted changes)" >> "$stage/COMMIT"
git ls-files > "$stage/FILES"
tr '\n' '\0' < "$stage/FILES" | xargs -0 sha256sum | sha256sum | cut -d' ' -f1 > "$stage/TREE"
# The shared libraries, less those the GPU machine must provide itself.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread\.|libdl\.|librt\.|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcudnn|libnccl|libnvrtc)'
for b in "${binaries[@]}"; do ldd "$build/$b"; done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$stage/lib/$name"
  done
fashion=${TANDEM_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
cp "$fashion"/*-ubyte.gz "$stage/data/"
mkdir -p "$out"
tar -C "$stage" -cJf "$out/kit.tar.xz" .
echo "$out/kit.tar.xz: $(du -m "$out/kit.tar.xz" | cut -f1) MiB ($(ls "$stage/lib" | wc -l) libraries); carry .devkit and run:"
echo "  bash bench/gpu/device_check.sh [tests] [e2e] [bench]"
