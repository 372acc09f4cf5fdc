#!/usr/bin/env bash
# A PyTorch model split-trained over TLS: exports torchvision's ResNet18 (export.py), imports
# it (`tandem import`, cut after module layer1), starts a cloud and an edge on loopback with
# mutual TLS, both starting from the imported weights (--init-from), trains on Fashion-MNIST,
# merges both sides' checkpoints into one state dict (`tandem export`) and loads it into the
# PyTorch model with load_state_dict(strict=True). Everything goes to OUT (default
# samples/pytorch-onnx/out). Extra arguments go to tandem-edge train (default: --limit 1024
# --test-limit 512, one epoch).
# Usage: bash samples/pytorch-onnx/run.sh [OUT] [tandem-edge train options...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/out}
shift || true
bin=${TANDEM_BUILD:-$root/build/release}
[[ -x $bin/tools/tandem ]] || bash "$root/scripts/setup.sh" release > /dev/null
mkdir -p "$out"

/usr/bin/python3 "$here/export.py" "$out/resnet18.onnx"
"$bin/tools/tandem" import "$out/resnet18.onnx" --out "$out/imported" --cut layer1

"$bin/cloud/tandem-cloud" pki init --state-dir "$out/cloud-state" > /dev/null
"$bin/cloud/tandem-cloud" pki issue --state-dir "$out/cloud-state" --client hospital --out "$out/hospital" > /dev/null
"$bin/cloud/tandem-cloud" serve --listen 127.0.0.1:0 --state-dir "$out/cloud-state" --model "$out/imported/model.json" \
  --init-from "$out/imported/weights.safetensors" > "$out/cloud.log" 2>&1 &
cloud=$!
trap 'kill $cloud 2>/dev/null; wait $cloud 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do grep -q 'listening on' "$out/cloud.log" && break; sleep 0.1; done
port=$(grep -o 'wss://127.0.0.1:[0-9]*' "$out/cloud.log" | cut -d: -f3)
[[ -n $port ]] || { echo "tandem-cloud did not start:"; cat "$out/cloud.log"; exit 1; }
rm -rf "$out/checkpoints"
"$bin/edge/tandem-edge" train --cloud "wss://localhost:$port" --identity "$out/hospital" \
  --model "$out/imported/model.json" --init-from "$out/imported/weights.safetensors" --epochs 1 --batch 64 \
  --microbatches 4 --checkpoint-dir "$out/checkpoints" --checkpoint-every 0 --limit 1024 --test-limit 512 "$@"
kill "$cloud"
rc=0
wait "$cloud" || rc=$?
trap - EXIT
[[ $rc == 0 ]] || { echo "tandem-cloud exited with status $rc"; exit 1; }

# The newest checkpoint of each side, merged into one state dict with PyTorch's names.
edge_ckpt=$(ls "$out"/checkpoints/edge-*.tdmc | sort | tail -1)
step=${edge_ckpt##*/edge-}
"$bin/tools/tandem" export --model "$out/imported/model.json" --edge-ckpt "$edge_ckpt" --identity "$out/hospital" \
  --cloud-ckpt "$out/cloud-state/checkpoints/hospital/cloud-$step" --out "$out/trained.safetensors"
/usr/bin/python3 - "$out/trained.safetensors" <<'PY'
import json, struct, sys
import numpy as np
import torch
import torchvision
blob = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
state = {}
for name, h in json.loads(blob[8:8 + n]).items():
    if name != "__metadata__":
        a, b = h["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64}[h["dtype"]]
        state[name] = torch.from_numpy(np.frombuffer(blob[8 + n + a:8 + n + b], dtype=dtype).reshape(h["shape"]).copy())
model = torchvision.models.resnet18(num_classes=10)
model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1, bias=False)
model.maxpool = torch.nn.Identity()
model.load_state_dict(state, strict=True)
print(f"{sys.argv[1]}: {len(state)} tensors, loaded into torchvision's resnet18 with strict=True")
PY
