#!/usr/bin/python3
"""PyTorch split-learning baseline, as practitioners write it (PipeLearn-style sockets):
an edge process runs the front of the Fashion-MNIST sample model, a cloud process the back
and the loss; per batch the edge sends activations and labels over TCP on loopback, the
cloud answers with the activation gradients (conventional split learning, one batch in
flight). Same model, batch, cut and optimizer as tandem's sample; one thread per process.

usage: baseline.py cloud PORT | baseline.py edge PORT SAMPLES BATCH
The edge prints one JSON line: {"baseline":"pytorch-split","samples":N,"samples_per_s":X}.
"""
import gzip
import json
import socket
import struct
import sys
import time

import numpy as np
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(1)
DATA = "/usr/share/datasets/fashion-mnist"


def front():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))


def back():
    return nn.Sequential(nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def recv_exact(sock, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError
        got += k
    return bytes(buf)


def send_array(sock, array):
    data = array.tobytes()
    sock.sendall(struct.pack("<Q", len(data)) + data)


def recv_array(sock, dtype, shape):
    (n,) = struct.unpack("<Q", recv_exact(sock, 8))
    return np.frombuffer(recv_exact(sock, n), dtype=dtype).reshape(shape)


def accept_edge(port):
    """The cloud's side: one edge's connection on loopback PORT, Nagle off."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(1)
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def connect_cloud(port):
    """The edge's side: a connection to the cloud on loopback PORT, Nagle off."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def cloud(port):
    model = back()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    conn = accept_edge(port)
    try:
        while True:
            (batch,) = struct.unpack("<I", recv_exact(conn, 4))
            act = torch.from_numpy(recv_array(conn, np.float32, (batch, 64, 7, 7)).copy()).requires_grad_()
            labels = torch.from_numpy(recv_array(conn, np.int64, (batch,)).copy())
            opt.zero_grad()
            loss = loss_fn(model(act), labels)
            loss.backward()
            opt.step()
            send_array(conn, act.grad.numpy())
    except EOFError:
        pass


def load(samples):
    with gzip.open(f"{DATA}/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:samples]
    with gzip.open(f"{DATA}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:samples]
    return torch.from_numpy(images.astype(np.float32) / 255.0), torch.from_numpy(labels.astype(np.int64))


def edge(port, samples, batch):
    images, labels = load(samples)
    model = front()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sock = connect_cloud(port)
    order = torch.randperm(len(images))
    start = time.perf_counter()
    for begin in range(0, len(images), batch):
        idx = order[begin:begin + batch]
        opt.zero_grad()
        act = model(images[idx])
        sock.sendall(struct.pack("<I", len(idx)))
        send_array(sock, act.detach().numpy())
        send_array(sock, labels[idx].numpy())
        grad = torch.from_numpy(recv_array(sock, np.float32, tuple(act.shape)).copy())
        act.backward(grad)
        opt.step()
    seconds = time.perf_counter() - start
    sock.close()
    print(json.dumps({"baseline": "pytorch-split", "samples": len(images), "seconds": round(seconds, 3),
                      "samples_per_s": round(len(images) / seconds, 1)}))


if __name__ == "__main__":
    if sys.argv[1] == "cloud":
        cloud(int(sys.argv[2]))
    else:
        edge(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
