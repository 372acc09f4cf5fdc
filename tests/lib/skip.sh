# Sourced by the test scripts. skip_or_fail WHY: a test that needs something this machine
# lacks exits 77 (ctest: skipped) with the reason; with CI=true it fails instead, because CI
# runs where scripts/setup.sh installed everything such a test needs.
skip_or_fail() {
  if [[ ${CI:-} == true ]]; then
    echo "FAIL: $1 (CI=true: scripts/setup.sh installs what every test needs, so none may skip)"
    exit 1
  fi
  echo "SKIP: $1"
  exit 77
}
