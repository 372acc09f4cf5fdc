#!/usr/bin/python3
"""Loads a safetensors file written by `tandem export` into the PyTorch model that a tandem
spec describes (torch names and NCHW layouts, load_state_dict(strict=True)), runs it on the
first N Fashion-MNIST test images and compares with tandem's own logits and predictions.

usage: torch_check.py SPEC WEIGHTS TANDEM_LOGITS TANDEM_PREDICTIONS N
Exit 0: same predictions (ties within 1e-4 excepted) and logits within 1e-3; 1: differ;
77: no torch in this Python (the test skips, saying so).
"""
import gzip
import json
import re
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"SKIP: /usr/bin/python3 has no torch/numpy ({e}); install python3-torch python3-numpy")
    sys.exit(77)


def load_spec(path):
    text = open(path).read()
    text = re.sub(r'^\s*//.*$', '', text, flags=re.M)  # FlatBuffers JSON: comment lines,
    text = re.sub(r'([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:', r'\1"\2":', text)  # bare keys
    text = re.sub(r',(\s*[}\]])', r'\1', text)  # and trailing commas
    return json.loads(text)


def pair(v, default):
    v = v if v else [default]
    return (v[0], v[1] if len(v) > 1 else v[0])


class SpecModel(torch.nn.Module):
    """The spec's DAG as torch modules named like the nodes, so state_dict keys match tandem's."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        shapes = {i["name"]: (i["shape"][2], i["shape"][0], i["shape"][1]) for i in spec["inputs"]}  # C, H, W
        self.order = []
        for node in spec["nodes"]:
            name, op, ins = node["name"], node["op"], node["inputs"]
            s = shapes[ins[0]]
            if op == "conv2d":
                a = node["conv2d"]
                k, st, p, d = pair(a.get("kernel"), 1), pair(a.get("stride"), 1), pair(a.get("padding"), 0), \
                    pair(a.get("dilation"), 1)
                groups = a.get("groups", 1)
                setattr(self, name, torch.nn.Conv2d(s[0], a["out_channels"], k, st, p, d, groups=groups,
                                                    bias=a.get("bias", True)))
                out = (a["out_channels"],) + tuple((s[1 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // st[i] + 1
                                                   for i in range(2))
            elif op in ("max_pool2d", "avg_pool2d"):
                a = node.get("pool", {})
                k = pair(a.get("kernel"), 1)
                st, p = pair(a.get("stride") or a.get("kernel"), 1), pair(a.get("padding"), 0)
                node["_pool"] = (k, st, p)
                out = (s[0],) + tuple((s[1 + i] + 2 * p[i] - k[i]) // st[i] + 1 for i in range(2))
            elif op == "linear":
                a = node["linear"]
                setattr(self, name, torch.nn.Linear(s[0], a["out_features"], bias=a.get("bias", True)))
                out = (a["out_features"],)
            elif op == "batch_norm":
                a = node.get("batch_norm", {})
                bn = torch.nn.BatchNorm2d if len(s) == 3 else torch.nn.BatchNorm1d
                setattr(self, name, bn(s[0], eps=a.get("eps", 1e-5), momentum=a.get("momentum", 0.1)))
                out = s
            elif op == "layer_norm":
                if len(s) != 1:
                    raise SystemExit("torch_check.py: layer_norm is checked on feature vectors only")
                setattr(self, name, torch.nn.LayerNorm(s[0], eps=node.get("layer_norm", {}).get("eps", 1e-5)))
                out = s
            elif op == "flatten":
                out = (int(np.prod(s)),)
            elif op == "global_avg_pool":
                out = (s[0],)
            elif op == "concat":
                out = (sum(shapes[i][0] for i in ins),) + tuple(s[1:])
            elif op in ("relu", "relu6", "hardswish", "hardsigmoid", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "dropout", "softmax",
                        "add"):
                out = s
            else:
                raise SystemExit(f"torch_check.py: op '{op}' has no torch counterpart here")
            shapes[name] = out
            self.order.append(node)
        self.shapes = shapes  # per node, (C, H, W) or (features,)
        self.output = spec.get("output") or spec["nodes"][-1]["name"]

    def forward(self, image):
        values = {self.spec["inputs"][0]["name"]: image}
        for node in self.order:
            name, op = node["name"], node["op"]
            x = [values[i] for i in node["inputs"]]
            if op in ("conv2d", "linear", "batch_norm", "layer_norm"):
                y = getattr(self, name)(x[0])
            elif op == "max_pool2d":
                k, st, p = node["_pool"]
                y = F.max_pool2d(x[0], k, st, p)
            elif op == "avg_pool2d":
                k, st, p = node["_pool"]
                y = F.avg_pool2d(x[0], k, st, p, count_include_pad=True)
            elif op == "flatten":
                y = torch.flatten(x[0], 1)
            elif op == "global_avg_pool":
                y = x[0].mean(dim=(2, 3))
            elif op == "concat":
                y = torch.cat(x, dim=1)
            elif op == "add":
                y = x[0] + x[1]
            elif op == "softmax":
                y = F.softmax(x[0], dim=1)
            elif op == "dropout":
                y = x[0]  # evaluation
            else:
                y = {"relu": F.relu, "relu6": F.relu6, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "gelu": F.gelu, "silu": F.silu,
                     "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
                     "sigmoid": torch.sigmoid, "tanh": torch.tanh}[op](x[0])
            values[name] = y
        return values[self.output]


def load_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64}[e["dtype"]]
        arr = np.frombuffer(raw[8 + n + b:8 + n + end], dtype=dtype).reshape(e["shape"]).copy()
        out[name] = torch.from_numpy(arr)
    return out


def fashion_mnist_test(count):
    root = "/usr/share/datasets/fashion-mnist/"
    with gzip.open(root + "t10k-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:count]
    return torch.from_numpy(images.astype(np.float32) / 255.0)


def main():
    spec_path, weights, logits_path, preds_path, count = sys.argv[1:6]
    count = int(count)
    torch.set_num_threads(1)
    model = SpecModel(load_spec(spec_path))
    model.load_state_dict(load_safetensors(weights), strict=True)  # every name and shape must match
    model.eval()
    with torch.no_grad():
        ours = model(fashion_mnist_test(count)).numpy()
    theirs = np.fromfile(logits_path, dtype=np.float32).reshape(ours.shape)
    preds = np.array([int(line) for line in open(preds_path)])
    diff = float(np.abs(ours - theirs).max())
    scale = max(1.0, float(np.abs(theirs).max()))
    top2 = np.sort(ours, axis=1)[:, -2:]
    differ = (ours.argmax(1) != preds) & (top2[:, 1] - top2[:, 0] > 1e-4)
    print(f"torch vs tandem on {count} test images: max |logit difference| {diff:.2e} (scale {scale:.1f}), "
          f"{int(differ.sum())} predictions differ beyond ties, agreement {float((ours.argmax(1) == preds).mean()):.4f}")
    sys.exit(0 if diff <= 1e-3 * scale and not differ.any() else 1)


if __name__ == "__main__":
    main()
