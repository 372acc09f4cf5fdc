"""PyTorch's attention as Hugging Face's BertSelfAttention computes it in eager mode (torch
1.13 has no fused scaled_dot_product_attention): [B, T, D] viewed as heads, Q K^T / sqrt(dh)
plus the additive key padding mask, softmax, times V, back to [B, T, D]; forward + backward
(query, key and value gradients), one thread, on the shapes of bench/attention.cpp: median
milliseconds as JSON lines (bench/attention.sh)."""
import math
import sys

import torch

from torch_op_timer import time_op

torch.set_num_threads(1)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 21


def attention(q, k, v, additive_mask, heads):
    b, t, d = q.shape
    dh = d // heads
    split = lambda x: x.view(b, t, heads, dh).permute(0, 2, 1, 3)
    scores = torch.matmul(split(q), split(k).transpose(-1, -2)) / math.sqrt(dh) + additive_mask
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, split(v)).permute(0, 2, 1, 3).contiguous().view(b, t, d)


for batch, tokens, heads, dh in ((8, 128, 4, 64), (4, 128, 12, 64)):
    d = heads * dh
    q, k, v = [(torch.rand(batch, tokens, d) * 2 - 1).requires_grad_(True) for _ in range(3)]
    dout = torch.rand(batch, tokens, d) * 2 - 1
    keep = torch.tensor([[1.0 if t < tokens - 12 * b else 0.0 for t in range(tokens)] for b in range(batch)])
    additive = ((1.0 - keep) * torch.finfo(torch.float32).min)[:, None, None, :]  # as BERT's extended mask

    def reset():
        q.grad = k.grad = v.grad = None

    time_op("attention", f"{batch}x{tokens} h{heads}x{dh}", lambda: attention(q, k, v, additive, heads),
            lambda out: out.backward(dout), reset, reps)
