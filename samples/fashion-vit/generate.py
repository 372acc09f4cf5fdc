#!/usr/bin/env python3
"""Writes model.json: a small vision transformer for Fashion-MNIST (28x28x1) with Hugging
Face's ViT module names (pre-LayerNorm encoder layers): 7x7 patches (16 tokens and [CLS]),
hidden 64, 4 heads, MLP 128, 4 layers. The default cut is after layer 0: the edge (or the
browser) runs the patch embedding and the first layer.
Usage: python3 samples/fashion-vit/generate.py"""
import os

HIDDEN, HEADS, MLP, LAYERS, PATCH, CLASSES = 64, 4, 128, 4, 7, 10
nodes = []


def node(name, op, inputs, **attrs):
    a = "".join(f", {k}: {v}" for k, v in attrs.items())
    quoted = ", ".join(f'"{i}"' for i in inputs)
    nodes.append(f'    {{ name: "{name}", op: "{op}", inputs: [{quoted}]{a} }}')


node("vit.embeddings.patch_embeddings.projection", "conv2d", ["image"],
     conv2d=f"{{ out_channels: {HIDDEN}, kernel: [{PATCH}], stride: [{PATCH}] }}")
node("vit.embeddings.patch_embeddings.tokens", "tokens", ["vit.embeddings.patch_embeddings.projection"])
node("vit.embeddings", "class_token", ["vit.embeddings.patch_embeddings.tokens"])
prev = "vit.embeddings"
for i in range(LAYERS):
    p = f"vit.encoder.layer.{i}"
    node(f"{p}.layernorm_before", "layer_norm", [prev], layer_norm="{ eps: 1e-12 }")
    for w in ("query", "key", "value"):
        node(f"{p}.attention.attention.{w}", "linear", [f"{p}.layernorm_before"], linear=f"{{ out_features: {HIDDEN} }}")
    node(f"{p}.attention.attention", "attention",
         [f"{p}.attention.attention.query", f"{p}.attention.attention.key", f"{p}.attention.attention.value"],
         attention=f"{{ heads: {HEADS} }}")
    node(f"{p}.attention.output.dense", "linear", [f"{p}.attention.attention"], linear=f"{{ out_features: {HIDDEN} }}")
    node(f"{p}.attention.residual", "add", [prev, f"{p}.attention.output.dense"])
    node(f"{p}.layernorm_after", "layer_norm", [f"{p}.attention.residual"], layer_norm="{ eps: 1e-12 }")
    node(f"{p}.intermediate.dense", "linear", [f"{p}.layernorm_after"], linear=f"{{ out_features: {MLP} }}")
    node(f"{p}.intermediate.act", "gelu", [f"{p}.intermediate.dense"])
    node(f"{p}.output.dense", "linear", [f"{p}.intermediate.act"], linear=f"{{ out_features: {HIDDEN} }}")
    node(f"{p}.output.residual", "add", [f"{p}.attention.residual", f"{p}.output.dense"])
    prev = f"{p}.output.residual"
node("vit.layernorm", "layer_norm", [prev], layer_norm="{ eps: 1e-12 }")
node("vit.pool", "token_pool", ["vit.layernorm"])
node("classifier", "linear", ["vit.pool"], linear=f"{{ out_features: {CLASSES} }}")

body = ",\n".join(nodes)
spec = f"""// fashion-vit: a small vision transformer on Fashion-MNIST, written by generate.py. Hugging
// Face's ViT names: patch embedding (a {PATCH}x{PATCH} stride-{PATCH} convolution seen as 16 tokens), [CLS]
// and position embeddings, {LAYERS} pre-LayerNorm layers (hidden {HIDDEN}, {HEADS} heads, MLP {MLP}), the final
// LayerNorm, the classifier on [CLS]. The default cut is after layer 0.
{{
  name: "fashion-vit",
  inputs: [ {{ name: "image", shape: [28, 28, 1] }} ],
  nodes: [
{body}
  ],
  output: "classifier",
  loss: "softmax_cross_entropy",
  cut: "vit.encoder.layer.0.output.residual"
}}
"""
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.json"), "w") as f:
    f.write(spec)
