#!/usr/bin/python3
"""Writes the model zoo's spec files (tandem's JSON model spec) into this folder:
VGG5, VGG11, VGG16 and ResNet18, each for CIFAR-size 32x32x3 inputs and for 28x28x1
Fashion-MNIST, 10 classes. Standard library only; rerun after changing a definition.
MobileNetV2 needs depthwise convolution, which tandem does not have yet.

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

    def conv(self, out, kernel=3, stride=1, padding=1, inputs=None, bias=True):
        name = self.add("conv2d", inputs, conv2d={"out_channels": out, "kernel": [kernel], "stride": [stride],
                                                  "padding": [padding], "bias": bias})
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


for size, shape in (("32", (32, 32, 3)), ("28", (28, 28, 1))):
    for name, config in VGG.items():
        vgg(f"{name}-{size}", config, shape)
    resnet18(f"resnet18-{size}", shape)
