#!/usr/bin/env bash
# Fails when an #include runs against the layering (ARCHITECTURE.md): core over nothing of
# ours; backends, ports, data, cli and collective over core; pipeline over core and collective;
# the apps (edge, cloud) over those and never each other; tools/wasm/tests/bench over anything.
# Prints every offending line.
# Usage: check_includes.sh SOURCE_DIR
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"

# folder -> the top-level folders its files may include from (besides their own)
declare -A allowed=(
  [core]="schema"
  [backends]="core schema"
  [ports]="core schema"
  [data]="core schema"
  [collective]="core schema"
  [pipeline]="core schema collective"
  [cli]="core schema"
  [edge]="core schema pipeline backends ports data cli"
  [cloud]="core schema pipeline collective backends ports data cli"
)
bad=0
checked=0
for layer in "${!allowed[@]}"; do
  [[ -d $layer ]] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    target=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<< "${rest#*:}")
    top=${target%%/*}
    [[ $target == */* ]] || continue  # a same-folder or system header
    ok=0
    for a in $layer ${allowed[$layer]}; do [[ $top == "$a" ]] && ok=1; done
    checked=$((checked + 1))
    if ((!ok)); then
      echo "$file:$line: $layer/ may not include \"$target\" (allowed: $layer ${allowed[$layer]})"
      bad=$((bad + 1))
    fi
  done < <(grep -rnE '^\s*#\s*include "' --include='*.h' --include='*.cpp' "$layer" || true)
done
if ((bad)); then
  echo "FAILED: $bad include(s) against the layering of ARCHITECTURE.md"
  exit 1
fi
echo "layering holds: $checked project includes checked in core, collective, pipeline, backends, ports, data, cli, edge, cloud"
