# Shared by the arm64 tests: finds the cross build (scripts/build-arm64.sh) or says why not.
# Sourced; arm64_require exits 77 (skip) only where the cross toolchain is not installed.

# arm64_require ARM64_BUILD SYSROOT FILE...: returns when the FILEs (paths in ARM64_BUILD),
# the sysroot and qemu-aarch64-static are all there. Otherwise exits 77 (ctest: skipped) when
# aarch64-linux-gnu-g++ or qemu-aarch64-static is not installed, outside CI (CI=true: setup.sh
# installs them, so the tests must run), and exits 1 saying what to run in every other case.
arm64_require() {
  local build=$1 sysroot=$2 missing=() tools=()
  shift 2
  for f in "$@"; do [[ -f $build/$f ]] || missing+=("$build/$f"); done
  [[ -f $sysroot/.sysroot-stamp ]] || missing+=("the sysroot $sysroot")
  for t in aarch64-linux-gnu-g++ qemu-aarch64-static; do command -v "$t" > /dev/null || tools+=("$t"); done
  ((${#missing[@]} + ${#tools[@]})) || return 0
  if ((${#tools[@]})) && [[ ${CI:-} != true ]]; then
    echo "SKIPPED: ${tools[*]} not installed, so there is no arm64 cross build to test." \
         "bash scripts/setup.sh installs the toolchain, then bash scripts/build-arm64.sh builds it."
    exit 77
  fi
  if ((${#tools[@]})); then
    echo "FAIL: ${tools[*]} not installed (CI=true): bash scripts/setup.sh installs them"
  else
    echo "FAIL: the arm64 cross build lacks ${missing[*]}: run bash scripts/build-arm64.sh"
  fi
  exit 1
}
