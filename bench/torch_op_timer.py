"""What bench/pytorch_layer_norm.py and bench/pytorch_attention.py share: an op's forward and
backward timed apart, medians after a warm-up, printed as bench/op_vs_pytorch.sh reads them."""
import json
import statistics
import time


def time_op(bench, shape, forward, backward, reset, reps):
    """forward() -> output; backward(output); reset() clears the gradients. Prints a JSON line."""
    fwd, bwd = [], []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        backward(out)
        t2 = time.perf_counter()
        reset()
        if i:  # the first is a warm-up
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    f, b = statistics.median(fwd) * 1e3, statistics.median(bwd) * 1e3
    print(json.dumps({"bench": bench, "backend": "pytorch", "shape": shape, "forward_ms": round(f, 4),
                      "backward_ms": round(b, 4), "total_ms": round(f + b, 4)}))
