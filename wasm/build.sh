#!/usr/bin/env bash
# Builds tandem's WebAssembly targets with Debian's Emscripten (em++ -msimd128) into OUT
# (default build/wasm) and assembles the browser edge's page in OUT/web: the page, the edge
# (tandem_edge.js), the sample models' binary specs (the CNN and the ViT) and a Fashion-MNIST subset.
# Needs the native release build (for `tandem pack-spec`). Usage: bash wasm/build.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/wasm}
tandem=$root/build/release/tools/tandem
if ! command -v em++ >/dev/null 2>&1; then
  echo "wasm/build.sh: em++ is missing: bash scripts/setup.sh installs Debian's emscripten" >&2
  exit 1
fi
[[ -x $tandem ]] || { echo "wasm/build.sh: build the native release first (bash scripts/setup.sh)" >&2; exit 1; }
export NODE_PATH=/usr/share/nodejs  # Debian's emscripten finds acorn there
cmake -S "$root/wasm" -B "$out" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$root/toolchains/emscripten.cmake" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$out" -j 2

web=$out/web
mkdir -p "$web"
cp "$root"/wasm/web/* "$web/"
cp "$out/tandem_edge.js" "$web/"
"$tandem" pack-spec --model "$root/samples/fashion-mnist/model.json" --out "$web/model.tdms" >/dev/null
"$tandem" pack-spec --model "$root/samples/fashion-vit/model.json" --out "$web/fashion-vit.tdms" >/dev/null
# The bundled subset: the first 2048 training and 500 test images (raw 8-bit pixels, labels).
data=/usr/share/datasets/fashion-mnist
/usr/bin/python3 - "$data" "$web" <<'PY'
import gzip, sys
data, web = sys.argv[1], sys.argv[2]
for prefix, count, name in (("train", 2048, "train"), ("t10k", 500, "test")):
    with gzip.open(f"{data}/{prefix}-images-idx3-ubyte.gz") as f:
        open(f"{web}/{name}-images.u8", "wb").write(f.read(16 + count * 784)[16:])
    with gzip.open(f"{data}/{prefix}-labels-idx1-ubyte.gz") as f:
        open(f"{web}/{name}-labels.u8", "wb").write(f.read(8 + count)[8:])
PY
echo "wasm/build.sh: page in $web (serve it with tandem-cloud serve --web $web)"
