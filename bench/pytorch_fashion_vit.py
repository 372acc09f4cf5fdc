"""samples/fashion-vit's vision transformer in torch.nn (Hugging Face's ViT layout: patch
convolution, [CLS] and position embeddings, pre-LayerNorm layers, the classifier on [CLS]),
trained on Fashion-MNIST as bench/fashion_vit.sh trains tandem's: Adam, the same batch, epochs
and learning rate, one thread, each epoch's samples in a seeded random order. Prints a JSON
line with the test accuracy and samples/s.
Usage: pytorch_fashion_vit.py EPOCHS BATCH LR [LIMIT]"""
import gzip
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HIDDEN, HEADS, MLP, LAYERS, PATCH, CLASSES = 64, 4, 128, 4, 7, 10
ROOT = "/usr/share/datasets/fashion-mnist/"


def idx(name, offset, shape):
    with gzip.open(ROOT + name) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset).reshape(shape)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layernorm_before = torch.nn.LayerNorm(HIDDEN, eps=1e-12)
        self.query, self.key, self.value = (torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.out = torch.nn.Linear(HIDDEN, HIDDEN)
        self.layernorm_after = torch.nn.LayerNorm(HIDDEN, eps=1e-12)
        self.intermediate = torch.nn.Linear(HIDDEN, MLP)
        self.output = torch.nn.Linear(MLP, HIDDEN)

    def forward(self, x):
        b, t, _ = x.shape
        dh = HIDDEN // HEADS
        h = self.layernorm_before(x)
        split = lambda v: v.view(b, t, HEADS, dh).permute(0, 2, 1, 3)
        p = torch.softmax(split(self.query(h)) @ split(self.key(h)).transpose(-1, -2) / math.sqrt(dh), -1)
        x = x + self.out((p @ split(self.value(h))).permute(0, 2, 1, 3).reshape(b, t, HIDDEN))
        return x + self.output(F.gelu(self.intermediate(self.layernorm_after(x))))


class ViT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Conv2d(1, HIDDEN, PATCH, PATCH)
        tokens = (28 // PATCH) ** 2
        self.cls_token = torch.nn.Parameter(torch.randn(1, 1, HIDDEN) * 0.02)
        self.position_embeddings = torch.nn.Parameter(torch.randn(1, tokens + 1, HIDDEN) * 0.02)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.layernorm = torch.nn.LayerNorm(HIDDEN, eps=1e-12)
        self.classifier = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, images):
        x = self.projection(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.position_embeddings
        for layer in self.layers:
            x = layer(x)
        return self.classifier(self.layernorm(x)[:, 0])


def main():
    epochs, batch, lr = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    limit = int(sys.argv[4]) if len(sys.argv) > 4 else 60000
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x = torch.from_numpy(idx("train-images-idx3-ubyte.gz", 16, (60000, 1, 28, 28))[:limit].astype(np.float32) / 255.0)
    y = torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8, (60000,))[:limit].astype(np.int64))
    tx = torch.from_numpy(idx("t10k-images-idx3-ubyte.gz", 16, (10000, 1, 28, 28)).astype(np.float32) / 255.0)
    ty = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz", 8, (10000,)).astype(np.int64))
    model = ViT()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    start = time.perf_counter()
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        model.train()
        for i in range(0, len(x), batch):
            idx_ = order[i:i + batch]
            opt.zero_grad()
            F.cross_entropy(model(x[idx_]), y[idx_]).backward()
            opt.step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        correct = sum((model(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum().item() for i in range(0, 10000, 1000))
    print(json.dumps({"bench": "fashion_vit", "framework": "pytorch", "epochs": epochs, "test_accuracy": correct / 10000,
                      "samples_per_s": round(epochs * len(x) / seconds, 1)}))


if __name__ == "__main__":
    main()
