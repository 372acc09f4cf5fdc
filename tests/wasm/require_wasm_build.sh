# Sourced by the wasm and browser tests: checks that wasm/build.sh has run (into $wasm).
# Without it: skipped (exit 77) with the reason, except in CI (CI=true), where it fails.
require_wasm_build() {
  if [[ -f $wasm/web/tandem_edge.js && -f $wasm/tandem_kernel_check.js ]]; then return 0; fi
  echo "the WebAssembly build is missing in $wasm: run bash wasm/build.sh (scripts/test.sh does)"
  if [[ ${CI:-} == true ]]; then exit 1; fi
  echo "SKIPPED"
  exit 77
}
