# PyTorch peer of bench_heads: N heads (Linear F->H, ReLU, Linear H->O on one input) trained
# one step (zero_grad, forward, backward to the input, SGD with momentum) as the loop of N
# nn.Sequential heads a PyTorch user writes, and batched (one Linear F->N*H, ReLU, one
# torch.baddbmm over the heads). One thread; medians of REPS steps; JSON lines and a table.
# Usage: /usr/bin/python3 bench/pytorch_heads.py [--shape F,H,O] [--batch B] [--reps R]
import argparse
import json
import statistics
import time

import torch


class BatchedHeads(torch.nn.Module):
    def __init__(self, n, f, h, o):
        super().__init__()
        self.n, self.h, self.o = n, h, o
        self.first = torch.nn.Linear(f, n * h)
        self.w2 = torch.nn.Parameter(torch.randn(n, h, o) / h**0.5)
        self.b2 = torch.nn.Parameter(torch.zeros(n, 1, o))

    def forward(self, x):
        a = torch.relu(self.first(x))  # [B, N*H]
        a = a.view(x.shape[0], self.n, self.h).transpose(0, 1).contiguous()  # [N, B, H]
        y = torch.baddbmm(self.b2, a, self.w2)  # [N, B, O]
        return y.transpose(0, 1).reshape(x.shape[0], self.n * self.o)


class LoopedHeads(torch.nn.Module):
    def __init__(self, n, f, h, o):
        super().__init__()
        self.heads = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(f, h), torch.nn.ReLU(), torch.nn.Linear(h, o)) for _ in range(n))

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=1)


def step_seconds(model, x, dy, reps):
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        sgd.zero_grad()
        x.grad = None
        model(x).backward(dy)
        sgd.step()
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="256,64,10")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--reps", type=int, default=11)
    a = p.parse_args()
    f, h, o = (int(v) for v in a.shape.split(","))
    torch.set_num_threads(1)
    torch.manual_seed(3)
    print(f"pytorch {torch.__version__} heads: batch {a.batch}, {f} -> {h} (ReLU) -> {o}; one training step, "
          f"median of {a.reps}, 1 thread")
    print(f"{'N':>5} {'batched ms':>12} {'loop ms':>12} {'ratio':>8}")
    for n in (1, 8, 128):
        x = torch.randn(a.batch, f, requires_grad=True)
        dy = torch.randn(a.batch, n * o)
        one = step_seconds(BatchedHeads(n, f, h, o), x, dy, a.reps)
        loop = step_seconds(LoopedHeads(n, f, h, o), x, dy, a.reps)
        print(f"{n:5d} {one * 1e3:12.3f} {loop * 1e3:12.3f} {loop / one:7.1f}x")
        print(json.dumps({"bench": "pytorch_heads", "heads": n, "batch": a.batch, "features": f, "hidden": h,
                          "out": o, "batched_s": round(one, 6), "loop_s": round(loop, 6)}))


if __name__ == "__main__":
    main()
