#!/usr/bin/env bash
# The three programs' command lines as a newcomer meets them: --help on every command (found
# by walking each program's own help, and checked against the commands each must have),
# --version with the commit this build came from, a suggestion for a mistyped option or
# command (exit 2), and errors that say what to do at the first steps one can get wrong: an
# identity folder missing or incomplete, a cloud that is not running, a spec that does not
# parse, a data folder without the model's inputs.
# Usage: command_line.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
declare -A bin=([tandem]=$build/tools/tandem [tandem-edge]=$build/edge/tandem-edge [tandem-cloud]=$build/cloud/tandem-cloud)

# help_walk PROGRAM WORDS...: checks `PROGRAM WORDS... --help`, then walks its subcommands.
walked=()
help_walk() {
  local program=$1; shift
  local out
  out=$("${bin[$program]}" "$@" --help) || fail "'$program $* --help' exited with $?"
  grep -q "^Usage: $program${*:+ $*} \[OPTIONS\]" <<< "$out" || fail "'$program $* --help' prints no usage: $out"
  walked+=("$program${*:+ $*}")
  local sub
  for sub in $(awk '/^Subcommands:/ { on = 1; next } on && NF { print $1 } on && !NF { on = 0 }' <<< "$out"); do
    help_walk "$program" "$@" "$sub"
  done
}
for program in tandem tandem-edge tandem-cloud; do help_walk "$program"; done
for expected in "tandem-edge train" "tandem-cloud serve" "tandem-cloud pki init" "tandem-cloud pki issue" \
  "tandem-cloud pki token" "tandem-cloud pki revoke" "tandem-cloud pki list" "tandem train" "tandem profile" \
  "tandem plan" "tandem export" "tandem evaluate" "tandem audit verify" "tandem text vocab" "tandem text encode" \
  "tandem pack-spec" "tandem backends" "tandem gpu"; do
  # (grep reads the whole list: bash's printf writes a line at a time, so with `grep -q`, which
  # exits at the match, a loaded machine's printf met a closed pipe and pipefail failed the
  # check: the flake of stops 46 and 47)
  printf '%s\n' "${walked[@]}" | grep -x "$expected" > /dev/null || fail "--help never reached '$expected'"
done
# A command's help lists its options and --config.
help=$("${bin[tandem-edge]}" train --help)
grep -q -- "--checkpoint-dir DIR" <<< "$help" || fail "tandem-edge train --help lacks --checkpoint-dir"
grep -q -- "--config FILE" <<< "$help" || fail "tandem-edge train --help lacks --config"
echo "--help: ${#walked[@]} commands and programs"

# --version: the commit of the source this build came from.
commit=$(git -C "$src" rev-parse --short=12 HEAD 2> /dev/null || true)
for program in tandem tandem-edge tandem-cloud; do
  v=$("${bin[$program]}" --version) || fail "$program --version exited with $?"
  [[ $v =~ ^$program\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ ([0-9a-f]+) ]] || fail "$program --version: '$v'"
  [[ -z $commit || ${BASH_REMATCH[1]} == "$commit" ]] || fail "$program --version names ${BASH_REMATCH[1]}, the source is at $commit"
done
echo "--version: $v"

# expect_error STATUS TEXT COMMAND...: COMMAND exits with STATUS and its stderr holds TEXT.
expect_error() {
  local want=$1 text=$2; shift 2
  local status=0
  "$@" > "$work/out" 2> "$work/err" || status=$?
  ((status == want)) || fail "'$*' exited with $status, not $want: $(cat "$work/err")"
  grep -qF -- "$text" "$work/err" || fail "'$*' does not say '$text': $(cat "$work/err")"
}
expect_error 2 "unknown option --epoch; did you mean --epochs? ('tandem-edge train --help' lists the options)" \
  "${bin[tandem-edge]}" train --epoch 3
expect_error 2 "unknown option --listn; did you mean --listen?" "${bin[tandem-cloud]}" serve --listn 127.0.0.1:0
expect_error 2 "unknown option --uplink-mpbs; did you mean --uplink-mbps?" "${bin[tandem]}" plan --uplink-mpbs 5
expect_error 2 "unknown command 'isue'; did you mean issue?" "${bin[tandem-cloud]}" pki isue
expect_error 2 "unknown command 'trian'; did you mean train?" "${bin[tandem]}" trian
printf 'epochs = 1\nmicrobatchs = 4\n' > "$work/typo.toml"
expect_error 1 "--config $work/typo.toml: unknown key 'microbatchs'; did you mean microbatches?" \
  "${bin[tandem-edge]}" train --config "$work/typo.toml"
echo "mistyped options, commands and config keys: suggested"

# The first steps a newcomer can get wrong.
model=$src/samples/fashion-mnist/model.json
edge=("${bin[tandem-edge]}" train --cloud wss://localhost:1 --model "$model" --limit 64 --test-limit 64 --connect-retries 0)
expect_error 1 "--identity $work/nowhere: no such folder. An edge's identity folder holds client.crt, client.key and ca.crt: on the cloud, \`tandem-cloud pki issue --state-dir STATE --client NAME --out $work/nowhere\` makes one" \
  "${edge[@]}" --identity "$work/nowhere"
"${bin[tandem-cloud]}" pki init --state-dir "$work/state" > /dev/null
"${bin[tandem-cloud]}" pki issue --state-dir "$work/state" --client ward-1 --out "$work/id" > /dev/null
mkdir "$work/half" && cp "$work/id/ca.crt" "$work/half/"
expect_error 1 "$work/half/client.crt, $work/half/client.key are missing: issue an identity with" \
  "${edge[@]}" --identity "$work/half"
expect_error 1 "cannot connect to wss://localhost:1: nothing listens there (connection refused): start the cloud" \
  "${edge[@]}" --identity "$work/id"
printf '{ "name": "broken", "inputs": [ { "name": "image" }\n' > "$work/broken.json"
expect_error 1 "$work/broken.json does not parse at line 2, column 0: " "${edge[@]}" --identity "$work/id" --model "$work/broken.json"
expect_error 1 "A spec is JSON in the form of schema/model.fbs" "${bin[tandem]}" train --model "$work/broken.json"
mkdir "$work/data"
expect_error 1 "$work/data/train.safetensors does not exist: a data folder holds train.safetensors and test.safetensors, each with 'labels' and 'image'" \
  "${edge[@]}" --identity "$work/id" --data "$work/data"
# A data set with the labels but not the model's input.
python3 - "$work/data/train.safetensors" << 'EOF'
import json, struct, sys
data = struct.pack("<4i", 0, 1, 2, 3)
header = json.dumps({"labels": {"dtype": "I32", "shape": [4], "data_offsets": [0, len(data)]}}).encode()
header += b" " * (-len(header) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + data)
EOF
expect_error 1 "$work/data/train.safetensors has no tensor 'image': the model reads 'labels' and 'image'" \
  "${edge[@]}" --identity "$work/id" --data "$work/data"
echo "PASS: --help on every command, --version with the commit, suggestions, and errors that say what to do"
