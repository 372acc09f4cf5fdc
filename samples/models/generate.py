#!/usr/bin/python3
"""Writes the model zoo's spec files (tandem's JSON model spec) into this folder:
VGG5, VGG11, VGG16, ResNet18 and MobileNetV2, each for CIFAR-size 32x32x3 inputs and for
28x28x1 Fashion-MNIST, 10 classes. Standard library only; rerun after changing a definition.

usage: /usr/bin/python3 samples/models/generate.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

VGG = {  # channels per conv, "M" a 2x2 max pool (the CIFAR variants of the VGG configurations)
    "vgg5": [64, "M", 128, "M", 256, "M"],
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class Spec:
    def __init__(self, name, shape):
        self.name, self.nodes, self.last, self.count = name, [], "image", 0
        self.shape = shape  # (h, w, c) of self.last
        self.inputs = [{"name": "image", "shape": list(shape)}]

    def add(self, op, inputs=None, name=None, **attrs):
        self.count += 1
        name = name or f"{op}{self.count}"
        node = {"name": name, "op": op, "inputs": inputs or [self.last]}
        node.update(attrs)
        self.nodes.append(node)
        self.last = name
        return name

    def conv(self, out, kernel=3, stride=1, padding=1, inputs=None, bias=True, groups=1):
        attrs = {"out_channels": out, "kernel": [kernel], "stride": [stride], "padding": [padding], "bias": bias}
        if groups != 1:
            attrs["groups"] = groups
        name = self.add("conv2d", inputs, conv2d=attrs)
        h, w, _ = self.shape
        self.shape = ((h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1, out)
        return name

    def write(self, cut, output=None):
        spec = {"name": self.name, "inputs": self.inputs, "nodes": self.nodes, "output": output or self.last,
                "loss": "softmax_cross_entropy", "cut": cut}
        with open(os.path.join(HERE, self.name + ".json"), "w") as f:
            json.dump(spec, f, indent=1)
            f.write("\n")


def vgg(name, config, shape):
    s = Spec(name, shape)
    cut = None
    for item in config:
        if item == "M":
            if s.shape[0] < 2:
                continue  # 28x28 inputs run out of pixels before the last pools
            s.add("max_pool2d", pool={"kernel": [2]})
            s.shape = (s.shape[0] // 2, s.shape[1] // 2, s.shape[2])
            cut = cut or s.last  # the edge keeps the first block
        else:
            s.conv(item)
            s.add("relu")
    s.add("flatten")
    s.add("linear", linear={"out_features": 256})
    s.add("relu")
    s.add("linear", linear={"out_features": 10})
    s.write(cut)


def resnet18(name, shape):
    s = Spec(name, shape)
    s.conv(64, bias=False)
    s.add("batch_norm")
    stem = s.add("relu")
    cut = stem
    channels = 64
    for stage, out in enumerate([64, 128, 256, 512]):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            entry, entry_shape = s.last, s.shape
            s.conv(out, stride=stride, bias=False)
            s.add("batch_norm")
            s.add("relu")
            s.conv(out, bias=False)
            main = s.add("batch_norm")
            if stride != 1 or channels != out:  # projection shortcut: 1x1 conv, stride, batch norm
                saved = s.shape
                s.shape = entry_shape
                s.conv(out, kernel=1, stride=stride, padding=0, inputs=[entry], bias=False)
                shortcut = s.add("batch_norm")
                s.shape = saved
            else:
                shortcut = entry
            s.add("add", inputs=[main, shortcut])
            s.add("relu")
            channels = out
        if stage == 0:
            cut = s.last  # the edge keeps the stem and the first stage
    s.add("global_avg_pool")
    s.add("linear", linear={"out_features": 10})
    s.write(cut)


# MobileNetV2's inverted residual stages (expansion t, channels c, blocks n, first stride s),
# with the CIFAR adaptation: stride 1 in the stem and in the 24-channel stage.
MOBILENET_V2 = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]


def mobilenet_v2(name, shape):
    s = Spec(name, shape)
    s.conv(32, bias=False)
    s.add("batch_norm")
    s.add("relu6")
    channels, cut = 32, None
    for t, c, n, first_stride in MOBILENET_V2:
        for block in range(n):
            stride = first_stride if block == 0 else 1
            entry = s.last
            hidden = channels * t
            if t != 1:  # 1x1 expansion
                s.conv(hidden, kernel=1, padding=0, bias=False)
                s.add("batch_norm")
                s.add("relu6")
            s.conv(hidden, stride=stride, bias=False, groups=hidden)  # 3x3 depthwise
            s.add("batch_norm")
            s.add("relu6")
            s.conv(c, kernel=1, padding=0, bias=False)  # 1x1 linear projection
            main = s.add("batch_norm")
            if stride == 1 and channels == c:
                s.add("add", inputs=[entry, main])
            channels = c
        cut = cut or s.last  # the edge keeps the stem and the first inverted residual block
    s.conv(1280, kernel=1, padding=0, bias=False)
    s.add("batch_norm")
    s.add("relu6")
    s.add("global_avg_pool")
    s.add("dropout", dropout={"p": 0.2})
    s.add("linear", linear={"out_features": 10})
    s.write(cut)


for size, shape in (("32", (32, 32, 3)), ("28", (28, 28, 1))):
    for name, config in VGG.items():
        vgg(f"{name}-{size}", config, shape)
    resnet18(f"resnet18-{size}", shape)
    mobilenet_v2(f"mobilenetv2-{size}", shape)
