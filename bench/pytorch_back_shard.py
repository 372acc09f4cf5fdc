#!/usr/bin/python3
"""PyTorch eager's side of bench/gpu/back_shard.sh: a spec's back shard after a cut, built as
tests/interop/torch_check.py builds a spec's layers (the CNN ops), or for spam-bert its split
peer's Back (bench/pytorch_spam_bert.py: layers 2 and 3, the pooler, the classifier; a mask
of all tokens), trained on random activations of the cut's shape with random labels, K
micro-batches a step (the gradient of the batch mean), SGD with momentum 0.9, on DEVICE (cpu:
one thread, or cuda). Prints one JSON line, as bench_back_shard does. On cuda, convolutions
run in full f32 as tandem's do (cuDNN FMA math), unless TORCH_CUDNN_TF32=1 gives PyTorch its
default (cudnn.allow_tf32: TF32 tensor cores for convolutions; matmuls are f32 either way).

usage: pytorch_back_shard.py SPEC CUT DEVICE BATCH MICROBATCHES STEPS WARMUP
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests", "interop"), HERE]
from torch_check import SpecModel, load_spec  # noqa: E402


def back_spec(spec, cut, cut_shape):
    """The nodes after the cut (all but the cut and what it reads), fed by the cut's activations."""
    by_name = {n["name"]: n for n in spec["nodes"]}
    front, todo = set(), [cut]
    while todo:
        name = todo.pop()
        if name in by_name and name not in front:
            front.add(name)
            todo.extend(by_name[name]["inputs"])
    c, h, w = cut_shape
    return {"inputs": [{"name": cut, "shape": [h, w, c]}],
            "nodes": [n for n in spec["nodes"] if n["name"] not in front],
            "output": spec.get("output")}


def main():
    path, cut, device = sys.argv[1], sys.argv[2], sys.argv[3]
    tf32 = os.environ.get("TORCH_CUDNN_TF32", "0") == "1"
    torch.backends.cudnn.allow_tf32 = tf32
    batch, k, steps, warmup = (int(v) for v in sys.argv[4:8])
    torch.manual_seed(7)
    if device == "cpu":
        torch.set_num_threads(1)
    spec = load_spec(path)
    if spec["name"] == "spam-bert":
        import pytorch_spam_bert as bert
        back = bert.Back().to(device).train()
        x = torch.rand((batch, bert.TOKENS, bert.HIDDEN), device=device) * 2 - 1
        mask = torch.ones((batch, bert.TOKENS), device=device)
        model, classes = (lambda xs, rows: back(xs, mask[rows])), bert.CLASSES
        params = back.parameters()
    else:
        cut_shape = SpecModel(load_spec(path)).shapes[cut]
        if len(cut_shape) != 3:
            raise SystemExit(f"pytorch_back_shard.py: the cut '{cut}' is not an image tensor (C, H, W)")
        layers = SpecModel(back_spec(spec, cut, cut_shape)).to(device).train()
        x = torch.rand((batch,) + tuple(cut_shape), device=device) * 2 - 1
        model, classes = (lambda xs, rows: layers(xs)), layers.shapes[layers.output][0]
        params = layers.parameters()
    labels = torch.randint(0, classes, (batch,), device=device)
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    micro = -(-batch // k)

    def step():
        opt.zero_grad(set_to_none=False)
        for begin in range(0, batch, micro):
            rows = slice(begin, begin + micro)
            (F.cross_entropy(model(x[rows], rows), labels[rows], reduction="sum") / batch).backward()
        opt.step()

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        s0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - s0)
    total = time.perf_counter() - t0
    times.sort()
    print(json.dumps({"bench": "back_shard", "peer": "pytorch", "model": spec["name"], "cut": cut, "device": device,
                      "batch": batch, "microbatches": k, "steps": steps, "cudnn_tf32": tf32,
                      "samples_per_s": round(batch * steps / total, 1),
                      "step_ms_median": round(times[steps // 2] * 1e3, 3)}))


if __name__ == "__main__":
    main()
