"""torch.nn.LayerNorm forward + backward (input and parameter gradients), one thread, on the
shapes of bench/layer_norm.cpp: median milliseconds as JSON lines (bench/op_vs_pytorch.sh layer_norm)."""
import json
import statistics
import sys
import time

import torch

torch.set_num_threads(1)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 21
for rows, features in ((64 * 128, 256), (16 * 128, 768)):
    ln = torch.nn.LayerNorm(features, eps=1e-12)
    x = torch.rand(rows, features) * 2 - 1
    x.requires_grad_(True)
    dy = torch.rand(rows, features) * 2 - 1
    fwd, bwd = [], []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        y = ln(x)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        x.grad = None
        ln.zero_grad()
        if i:  # the first is a warm-up
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    f, b = statistics.median(fwd) * 1e3, statistics.median(bwd) * 1e3
    print(json.dumps({"bench": "layer_norm", "backend": "pytorch", "shape": f"{rows}x{features}",
                      "forward_ms": round(f, 4), "backward_ms": round(b, 4), "total_ms": round(f + b, 4)}))
