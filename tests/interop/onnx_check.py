#!/usr/bin/python3
"""PyTorch's side of the ONNX import tests (tests/e2e/onnx_import.sh).

usage: onnx_check.py export MODEL OUT_DIR N
           torchvision's MODEL (resnet18, mobilenet_v2, ...; 10 classes) with random weights and
           random batch-norm statistics, exported in training mode to OUT_DIR/model.onnx;
           OUT_DIR/data/test.safetensors and train.safetensors: N random 32x32 images in
           tandem's layout (NHWC) and labels; OUT_DIR/torch.f32: torch's logits in eval mode;
           OUT_DIR/torch.pt: the state dict the file was exported from
       onnx_check.py refused OUT_DIR
           mobilenet_v3_small (its squeeze-excitation: HardSigmoid and Mul) to OUT_DIR/model.onnx
       onnx_check.py compare TORCH_LOGITS TANDEM_LOGITS TOL   (exit 1 beyond TOL)
77: no torch or torchvision in this Python (the test skips, saying so).
"""
import sys
import warnings

try:
    import torch
    import torchvision
except ImportError as e:  # pragma: no cover
    print(f"SKIP: /usr/bin/python3 has no torch/torchvision ({e}); install python3-torch python3-torchvision")
    sys.exit(77)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hf_encoder import write_safetensors  # noqa: E402


def randomize(model, gen):
    """Weights as torchvision initialises them, batch norms given statistics and affine
    parameters far from their start, so evaluation exercises every tensor."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.2)
            m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=gen) * 0.1)
        elif isinstance(m, torch.nn.Linear):  # logits of order 1, not 0.01 (MobileNet's init)
            m.weight.data.copy_(torch.randn(m.weight.shape, generator=gen) / m.in_features ** 0.5)


def export(model, path):
    x = torch.randn(2, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Tracing in training mode runs a forward that moves the batch norms' statistics, and
        # the file holds them as they are after it: so does `model`.
        torch.onnx.export(model, x, path, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=14, input_names=["image"],
                          output_names=["logits"], dynamic_axes={"image": {0: "batch"}})


def main():
    cmd = sys.argv[1]
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if cmd == "export":
        name, out, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        model = getattr(torchvision.models, name)(num_classes=10)
        with torch.no_grad():
            randomize(model, gen)
        export(model, f"{out}/model.onnx")
        torch.save(model.state_dict(), f"{out}/torch.pt")
        images = torch.randn(n, 3, 32, 32, generator=gen)
        labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int32)
        import os
        os.makedirs(f"{out}/data", exist_ok=True)
        nhwc = images.permute(0, 2, 3, 1).contiguous()
        for split in ("train", "test"):
            write_safetensors(f"{out}/data/{split}.safetensors", {"image": nhwc, "labels": labels})
        # write_safetensors writes F32; the labels are read back as I32 below.
        fix_labels(f"{out}/data/test.safetensors")
        fix_labels(f"{out}/data/train.safetensors")
        model.eval()
        with torch.no_grad():
            model(images).numpy().astype("float32").tofile(f"{out}/torch.f32")
    elif cmd == "refused":
        export(torchvision.models.mobilenet_v3_small(num_classes=10), f"{sys.argv[2]}/model.onnx")
    elif cmd == "compare":
        import numpy as np
        a, b, tol = np.fromfile(sys.argv[2], dtype=np.float32), np.fromfile(sys.argv[3], dtype=np.float32), float(sys.argv[4])
        if a.shape != b.shape:
            print(f"FAIL: {a.size} values against {b.size}")
            sys.exit(1)
        diff = float(np.abs(a - b).max())
        scale = float(np.abs(a).max())
        print(f"max |torch - tandem| = {diff:.3g} over {a.size} logits (largest |logit| {scale:.3g})")
        sys.exit(0 if diff <= tol else 1)
    else:
        sys.exit(f"unknown command {cmd}")


def fix_labels(path):
    """Rewrites the F32 'labels' of a safetensors file as I32 (what tandem's data sets hold)."""
    import json
    import struct
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = bytearray(blob[8 + n:])
    entry = header["labels"]
    a, b = entry["data_offsets"]
    values = struct.unpack(f"<{(b - a) // 4}f", data[a:b])
    data[a:b] = struct.pack(f"<{len(values)}i", *[int(v) for v in values])
    entry["dtype"] = "I32"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))


if __name__ == "__main__":
    main()
