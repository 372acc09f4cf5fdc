#!/usr/bin/python3
"""samples/spam-bert's model in torch.nn (Hugging Face's BERT module names and computation:
post-LayerNorm layers, erf GELU, the pooler's tanh on [CLS]; torch's default initialisation,
as tandem's), on the data samples/spam-bert/prepare.sh wrote (the same SentencePiece ids and
masks). Two peers for bench/spam_bert.sh, one thread a process:

  whole DATA EPOCHS BATCH LR [LIMIT]   trains the whole model with AdamW as tandem does
                                        (weight decay 0.01), each epoch in a seeded random
                                        order; prints a JSON line: test accuracy, samples/s
  cloud PORT LR                         the split baseline's cloud: layers 2 and 3, the pooler,
                                        the classifier and the loss
  edge PORT DATA SAMPLES BATCH LR       the split baseline's edge (embeddings, layers 0 and 1):
                                        per batch it sends the activations, the mask and the
                                        labels over loopback TCP and waits for the gradient
                                        (conventional split learning, one batch in flight);
                                        prints a JSON line with samples/s
"""
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "../tests/interop"), os.path.join(HERE, "pytorch_split")]
from hf_encoder import Module, additive_mask, encoder_layer, layer_norm, read_safetensors, run_layer  # noqa: E402
from baseline import accept_edge, connect_cloud, recv_array, recv_exact, send_array  # noqa: E402  (the split baseline's)

VOCAB, HIDDEN, HEADS, LAYERS, INTER, TOKENS, CLASSES, CUT = 8000, 256, 4, 4, 1024, 128, 2, 2



class Front(torch.nn.Module):
    """The embeddings and the first CUT layers (the edge's shard)."""

    def __init__(self):
        super().__init__()
        self.embeddings = Module()
        self.embeddings.word_embeddings = torch.nn.Embedding(VOCAB, HIDDEN)
        self.embeddings.position_embeddings = torch.nn.Embedding(TOKENS, HIDDEN)
        self.embeddings.LayerNorm = layer_norm(HIDDEN)
        self.layers = torch.nn.ModuleList(encoder_layer(HIDDEN, INTER) for _ in range(CUT))

    def forward(self, ids, mask):
        e = self.embeddings
        x = e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(torch.arange(ids.shape[1]))[None])
        additive = additive_mask(mask)
        for layer in self.layers:
            x = run_layer(layer, x, additive, HEADS)
        return x


class Back(torch.nn.Module):
    """The last layers, the pooler and the classifier (the cloud's shard)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(encoder_layer(HIDDEN, INTER) for _ in range(LAYERS - CUT))
        self.pooler = torch.nn.Linear(HIDDEN, HIDDEN)
        self.classifier = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, mask):
        additive = additive_mask(mask)
        for layer in self.layers:
            x = run_layer(layer, x, additive, HEADS)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def load(data, split, limit=0):
    t = read_safetensors(f"{data}/{split}.safetensors")
    ids, mask, labels = t["input_ids"].long(), t["attention_mask"], t["labels"].long()
    if limit:
        ids, mask, labels = ids[:limit], mask[:limit], labels[:limit]
    return ids, mask, labels


def adamw(params, lr):
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def whole(data, epochs, batch, lr, limit):
    torch.manual_seed(1)
    front, back = Front(), Back()
    opt = adamw(list(front.parameters()) + list(back.parameters()), lr)
    ids, mask, labels = load(data, "train", limit)
    test_ids, test_mask, test_labels = load(data, "test")
    start = time.perf_counter()
    seen = 0
    for epoch in range(epochs):
        front.train(), back.train()
        order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(epoch + 1))
        for begin in range(0, len(ids), batch):
            idx = order[begin:begin + batch]
            opt.zero_grad()
            loss = F.cross_entropy(back(front(ids[idx], mask[idx]), mask[idx]), labels[idx])
            loss.backward()
            opt.step()
            seen += len(idx)
    seconds = time.perf_counter() - start
    front.eval(), back.eval()
    correct = 0
    with torch.no_grad():
        for begin in range(0, len(test_ids), 256):
            s = slice(begin, begin + 256)
            correct += (back(front(test_ids[s], test_mask[s]), test_mask[s]).argmax(1) == test_labels[s]).sum().item()
    print(json.dumps({"peer": "pytorch-whole", "epochs": epochs, "samples": seen,
                      "samples_per_s": round(seen / seconds, 1), "test_accuracy": correct / len(test_ids)}))



def cloud(port, lr):
    torch.manual_seed(2)
    model = Back()
    opt = adamw(model.parameters(), lr)
    conn = accept_edge(port)
    try:
        while True:
            (batch,) = struct.unpack("<I", recv_exact(conn, 4))
            act = torch.from_numpy(recv_array(conn, np.float32, (batch, TOKENS, HIDDEN)).copy()).requires_grad_()
            mask = torch.from_numpy(recv_array(conn, np.uint8, (batch, TOKENS)).copy())
            labels = torch.from_numpy(recv_array(conn, np.int64, (batch,)).copy())
            opt.zero_grad()
            F.cross_entropy(model(act, mask), labels).backward()
            opt.step()
            send_array(conn, act.grad.numpy())
    except EOFError:
        pass


def edge(port, data, samples, batch, lr):
    torch.manual_seed(1)
    ids, mask, labels = load(data, "train", samples)
    model = Front()
    opt = adamw(model.parameters(), lr)
    sock = connect_cloud(port)
    order = torch.randperm(len(ids))
    start = time.perf_counter()
    for begin in range(0, len(ids), batch):
        idx = order[begin:begin + batch]
        opt.zero_grad()
        act = model(ids[idx], mask[idx])
        sock.sendall(struct.pack("<I", len(idx)))
        send_array(sock, np.ascontiguousarray(act.detach().numpy()))
        send_array(sock, mask[idx].numpy())
        send_array(sock, labels[idx].numpy())
        act.backward(torch.from_numpy(recv_array(sock, np.float32, tuple(act.shape)).copy()))
        opt.step()
    seconds = time.perf_counter() - start
    sock.close()
    print(json.dumps({"baseline": "pytorch-split", "samples": len(ids), "seconds": round(seconds, 3),
                      "samples_per_s": round(len(ids) / seconds, 1)}))


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "whole":
        whole(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]) if len(sys.argv) > 6 else 0)
    elif mode == "cloud":
        cloud(int(sys.argv[2]), float(sys.argv[3]))
    elif mode == "edge":
        edge(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    else:
        print(__doc__)
        sys.exit(2)
