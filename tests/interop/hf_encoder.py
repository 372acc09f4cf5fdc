"""Hugging Face's BERT encoder in torch.nn, as the interop tests and the spam-bert benchmark
build it (Debian's torch has no transformers library): a layer under BertLayer's module names
(attention.self.query/key/value, attention.output.dense and LayerNorm, intermediate.dense,
output.dense and LayerNorm; post-LayerNorm, erf GELU), the additive key padding mask, and
safetensors read and written with the standard library and torch."""
import json
import math
import struct

import torch
import torch.nn.functional as F


class Module(torch.nn.Module):
    """A named container, as HF's nesting (bert.encoder.layer.0.attention.self...) needs."""


def layer_norm(hidden):
    return torch.nn.LayerNorm(hidden, eps=1e-12)


def encoder_layer(hidden, inter):
    layer = Module()
    layer.attention = Module()
    layer.attention.self = Module()
    for w in ("query", "key", "value"):
        setattr(layer.attention.self, w, torch.nn.Linear(hidden, hidden))
    layer.attention.output = Module()
    layer.attention.output.dense = torch.nn.Linear(hidden, hidden)
    layer.attention.output.LayerNorm = layer_norm(hidden)
    layer.intermediate = Module()
    layer.intermediate.dense = torch.nn.Linear(hidden, inter)
    layer.output = Module()
    layer.output.dense = torch.nn.Linear(inter, hidden)
    layer.output.LayerNorm = layer_norm(hidden)
    return layer


def additive_mask(mask):
    """[batch, tokens] of 1 (keep) and 0 (padding) -> what the attention scores get added."""
    return ((1.0 - mask.float()) * torch.finfo(torch.float32).min)[:, None, None, :]


def run_layer(layer, x, additive, heads):
    b, t, hidden = x.shape
    dh = hidden // heads
    a = layer.attention.self
    split = lambda v: v.view(b, t, heads, dh).permute(0, 2, 1, 3)
    scores = split(a.query(x)) @ split(a.key(x)).transpose(-1, -2) / math.sqrt(dh) + additive
    ctx = (torch.softmax(scores, -1) @ split(a.value(x))).permute(0, 2, 1, 3).reshape(b, t, hidden)
    x = layer.attention.output.LayerNorm(x + layer.attention.output.dense(ctx))
    return layer.output.LayerNorm(x + layer.output.dense(F.gelu(layer.intermediate.dense(x))))


def read_safetensors(path):
    """Every tensor of a safetensors file (F32, I32, I64, U8) as a torch tensor."""
    import numpy as np
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        dtype = {"I32": np.int32, "U8": np.uint8, "F32": np.float32, "I64": np.int64}[h["dtype"]]
        out[name] = torch.from_numpy(np.frombuffer(blob[8 + n + a:8 + n + b], dtype=dtype).reshape(h["shape"]).copy())
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
