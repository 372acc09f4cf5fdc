# Shared by the arm64 tests: finds the cross build (scripts/build-arm64.sh) or says why not.
# Sourced; arm64_require exits 77 (skip) only where the cross toolchain is not installed.

# arm64_skip_or_fail WHY: exits 77 (ctest: skipped) outside CI, 1 with CI=true, where
# scripts/setup.sh installs the toolchain and the tests must run.
arm64_skip_or_fail() {
  if [[ ${CI:-} == true ]]; then
    echo "FAIL: $1 (CI=true: bash scripts/setup.sh installs it, then bash scripts/build-arm64.sh)"
    exit 1
  fi
  echo "SKIPPED: $1, so this arm64 test cannot run. bash scripts/setup.sh installs it," \
       "then bash scripts/build-arm64.sh cross-builds the edge."
  exit 77
}

# arm64_require [--qemu] ARM64_BUILD SYSROOT FILE...: returns when the FILEs (paths in
# ARM64_BUILD) and the sysroot are there, and with --qemu qemu-aarch64-static too. A missing
# build skips only where aarch64-linux-gnu-g++ is not installed; otherwise it fails saying
# what to run.
arm64_require() {
  local qemu=0 missing=()
  [[ $1 == --qemu ]] && qemu=1 && shift
  local build=$1 sysroot=$2
  shift 2
  for f in "$@"; do [[ -f $build/$f ]] || missing+=("$build/$f"); done
  [[ -f $sysroot/.sysroot-stamp ]] || missing+=("the sysroot $sysroot")
  if ((${#missing[@]})); then
    command -v aarch64-linux-gnu-g++ > /dev/null || arm64_skip_or_fail "aarch64-linux-gnu-g++ is not installed"
    echo "FAIL: the arm64 cross build lacks ${missing[*]}: run bash scripts/build-arm64.sh"
    exit 1
  fi
  if ((qemu)) && ! command -v qemu-aarch64-static > /dev/null; then
    arm64_skip_or_fail "qemu-aarch64-static (Debian qemu-user-static) is not installed"
  fi
}
