"""torch.nn.LayerNorm forward + backward (input and parameter gradients), one thread, on the
shapes of bench/layer_norm.cpp: median milliseconds as JSON lines (bench/op_vs_pytorch.sh layer_norm)."""
import sys

import torch

from torch_op_timer import time_op

torch.set_num_threads(1)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 21
for rows, features in ((64 * 128, 256), (16 * 128, 768)):
    ln = torch.nn.LayerNorm(features, eps=1e-12)
    x = torch.rand(rows, features) * 2 - 1
    x.requires_grad_(True)
    dy = torch.rand(rows, features) * 2 - 1

    def reset():
        x.grad = None
        ln.zero_grad()

    time_op("layer_norm", f"{rows}x{features}", lambda: ln(x), lambda y: y.backward(dy), reset, reps)
