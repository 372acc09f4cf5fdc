#!/usr/bin/python3
"""PyTorch's side of bench/pipeline_vs_pytorch.sh: the same stages as bench_pipeline (a spec cut
at CUTS, each stage built as tests/interop/torch_check.py builds a spec's layers), one process
a stage (one thread each) joined by torch.distributed's Gloo send and receive on loopback, as
a pipeline across machines is written with torch.distributed. GPipe order: every micro-batch's
forward, then every backward, the gradient of the batch mean, SGD with momentum 0.9. Random
images and labels. Prints one JSON line: samples/s over the timed steps, the median step time
and the bubble (the share of stage-time spent waiting in a receive).

usage: pytorch_pipeline.py SPEC CUTS BATCH MICROBATCHES STEPS WARMUP PORT
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests", "interop")]
from torch_check import SpecModel, load_spec  # noqa: E402


def ancestors(spec, cut):
    """The cut and every node it reads, transitively."""
    by_name = {n["name"]: n for n in spec["nodes"]}
    seen, todo = set(), [cut]
    while todo:
        name = todo.pop()
        if name in by_name and name not in seen:
            seen.add(name)
            todo.extend(by_name[name]["inputs"])
    return seen


def stage_specs(spec, cuts):
    """One spec a stage: the nodes after the previous cut up to this one, fed by its output."""
    shapes = SpecModel(load_spec_copy(spec)).shapes
    specs, before = [], set()
    bounds = cuts + [spec.get("output") or spec["nodes"][-1]["name"]]
    for i, end in enumerate(bounds):
        upto = ancestors(spec, end)
        nodes = [n for n in spec["nodes"] if n["name"] in upto and n["name"] not in before]
        if i == 0:
            inputs = spec["inputs"]
        else:
            c, h, w = shapes[cuts[i - 1]]
            inputs = [{"name": cuts[i - 1], "shape": [h, w, c]}]
        specs.append({"inputs": inputs, "nodes": nodes, "output": end})
        before |= upto
    return specs


def load_spec_copy(spec):
    return json.loads(json.dumps(spec))


def run(rank, world, path, cuts, batch, k, steps, warmup, port, queue):
    torch.set_num_threads(1)
    torch.manual_seed(7)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    spec = load_spec(path)
    specs = stage_specs(spec, cuts)
    model = SpecModel(specs[rank]).train()
    whole_shapes = SpecModel(load_spec_copy(spec)).shapes
    in_shape = None if rank == 0 else whole_shapes[cuts[rank - 1]]
    out_shape = whole_shapes[cuts[rank]] if rank < world - 1 else None
    h, w, c = spec["inputs"][0]["shape"]
    images = torch.rand((batch, c, h, w)) * 2 - 1
    classes = SpecModel(load_spec_copy(spec)).shapes[spec.get("output") or spec["nodes"][-1]["name"]][0]
    labels = torch.randint(0, classes, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    micro = -(-batch // k)
    rows = [slice(b, min(b + micro, batch)) for b in range(0, batch, micro)]
    idle = [0.0]

    def recv(shape, src):
        t = torch.empty(shape)
        t0 = time.perf_counter()
        dist.recv(t, src)
        idle[0] += time.perf_counter() - t0
        return t

    def step():
        kept = []
        for r in rows:
            n = r.stop - r.start
            if rank == 0:
                x = images[r]
            else:
                x = recv((n,) + tuple(in_shape), rank - 1).requires_grad_()
            y = model(x)
            if rank == world - 1:
                kept.append((x, F.cross_entropy(y, labels[r], reduction="sum") / batch))
            else:
                dist.send(y.detach().contiguous(), rank + 1)
                kept.append((x, y))
        for (x, y), r in zip(kept, rows):
            n = r.stop - r.start
            if rank == world - 1:
                y.backward()
            else:
                y.backward(recv((n,) + tuple(out_shape), rank + 1))
            if rank > 0:
                dist.send(x.grad.contiguous(), rank - 1)
        opt.step()
        opt.zero_grad(set_to_none=False)

    for _ in range(warmup):
        step()
    dist.barrier()
    idle[0] = 0.0
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        s0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - s0)
    dist.barrier()
    wall = time.perf_counter() - t0
    totals = torch.tensor([idle[0], wall])
    dist.all_reduce(totals)
    if rank == 0:
        queue.put({"runner": "pytorch-pipeline", "model": spec["name"], "stages": world, "schedule": "gpipe",
                   "batch": batch, "microbatches": k, "steps": steps,
                   "samples_per_s": round(batch * steps / wall, 1), "median_step_s": round(statistics.median(times), 4),
                   "bubble": round(float(totals[0]) / float(totals[1]), 3)})
    dist.destroy_process_group()


def main():
    path, cuts = sys.argv[1], sys.argv[2].split(",")
    batch, k, steps, warmup, port = (int(v) for v in sys.argv[3:8])
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(run, args=(len(cuts) + 1, path, cuts, batch, k, steps, warmup, port, queue), nprocs=len(cuts) + 1,
             join=True)
    print(json.dumps(queue.get(timeout=10)))


if __name__ == "__main__":
    main()
