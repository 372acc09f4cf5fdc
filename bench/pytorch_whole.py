#!/usr/bin/python3
"""The Fashion-MNIST sample model (samples/fashion-mnist/model.json) trained whole in PyTorch,
as tandem's main job trains it split (scripts/run.sh): one epoch of the 60,000 training images
in shuffled batches of 64, SGD lr 0.05 momentum 0.9, inputs scaled to [0, 1], then accuracy on
the 10,000 test images; once per seed, one thread. The peer figure for the main job's accuracy.

usage: pytorch_whole.py [EPOCHS] SEED...   (default: 1 epoch, seeds 1 2 3 4 5)
Prints a line per seed, the range, and one JSON line.
"""
import gzip
import json
import sys
import time

import numpy as np
import torch
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"


def load(kind):
    with gzip.open(f"{DATA}/{kind}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{DATA}/{kind}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(images.astype(np.float32) / 255.0), torch.from_numpy(labels.astype(np.int64))


def model():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def run(seed, epochs, train, test):
    torch.manual_seed(seed)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    images, labels = train
    start = time.time()
    for _ in range(epochs):
        order = torch.randperm(len(labels))
        for i in range(0, len(labels), 64):
            idx = order[i:i + 64]
            opt.zero_grad()
            loss_fn(net(images[idx]), labels[idx]).backward()
            opt.step()
    seconds = time.time() - start
    with torch.no_grad():
        correct = sum(int((net(test[0][i:i + 1000]).argmax(1) == test[1][i:i + 1000]).sum())
                      for i in range(0, len(test[1]), 1000))
    return correct / len(test[1]), seconds


def main():
    args = [int(a) for a in sys.argv[1:]]
    epochs = args[0] if args else 1
    seeds = args[1:] or [1, 2, 3, 4, 5]
    torch.set_num_threads(1)
    train, test = load("train"), load("t10k")
    accuracies = []
    for seed in seeds:
        accuracy, seconds = run(seed, epochs, train, test)
        accuracies.append(accuracy)
        print(f"seed {seed}: test accuracy {accuracy * 100:.2f}% after {epochs} epoch(s), {seconds:.1f} s of training",
              flush=True)
    print(f"PyTorch {torch.__version__}, {len(seeds)} seeds: {min(accuracies) * 100:.2f}% to {max(accuracies) * 100:.2f}%,"
          f" median {sorted(accuracies)[len(accuracies) // 2] * 100:.2f}%")
    print(json.dumps({"bench": "pytorch_whole", "torch": torch.__version__, "epochs": epochs, "seeds": seeds,
                      "test_accuracy": accuracies}))


if __name__ == "__main__":
    main()
