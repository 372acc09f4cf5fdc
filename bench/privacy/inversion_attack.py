#!/usr/bin/python3
"""Model inversion by an honest-but-curious cloud (issue 18, attack (a)): it reconstructs the
edge's training images from the cut activations it receives.

The attacker is given the trained front shard's weights (in split-federated training the
cloud receives them every round; elsewhere this is the strongest attacker) and auxiliary data
of the same kind (the Fashion-MNIST test split). It trains a decoder on (front(aux), aux),
with the same clipping and noise the edge applies when the run used DP (the mechanism and its
parameters are public), and applies it to what the edge sent for training images it never
saw: the rows of SENT (tandem-edge --record-sent: the last epoch's activations as they left,
with the edge's own noise and wire codec, and each row's training-set index). Reports the
reconstructions' SSIM and MSE against the true images, beside a floor: the aux set's mean
image offered as every reconstruction.

usage: inversion_attack.py SPEC WEIGHTS CUT SENT [--dp-clip C --dp-noise SIGMA] [--aux N]
                           [--targets N] [--epochs E] [--label NAME]
Prints a JSON line; exit 77 (skip) without torch.
"""
import argparse
import gzip
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/interop"))
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch_check import SpecModel, load_safetensors, load_spec
except ImportError as e:  # pragma: no cover
    print(f"SKIP: /usr/bin/python3 has no torch/numpy ({e}); install python3-torch python3-numpy")
    sys.exit(77)

ROOT = "/usr/share/datasets/fashion-mnist/"


def images(name, count):
    with gzip.open(ROOT + name) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:count]
    return torch.from_numpy(x.astype(np.float32) / 255.0)


def safetensors_metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def ssim(a, b):
    """Mean SSIM of image pairs in [0, 1] (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5)."""
    g = torch.exp(-((torch.arange(11, dtype=torch.float32) - 5) ** 2) / (2 * 1.5 ** 2))
    w = (g[:, None] * g[None, :] / g.sum() ** 2)[None, None]
    mu_a, mu_b = F.conv2d(a, w), F.conv2d(b, w)
    var_a = F.conv2d(a * a, w) - mu_a ** 2
    var_b = F.conv2d(b * b, w) - mu_b ** 2
    cov = F.conv2d(a * b, w) - mu_a * mu_b
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return float(s.mean())


def released(z, clip, sigma, gen):
    """What leaves the edge: each sample clipped to L2 norm clip, plus N(0, (sigma clip)^2)."""
    if clip <= 0:
        return z
    flat = z.reshape(z.shape[0], -1)
    scale = torch.clamp(clip / (flat.norm(dim=1, keepdim=True) + 1e-12), max=1.0)
    flat = flat * scale + torch.randn(flat.shape, generator=gen) * (sigma * clip)
    return flat.reshape(z.shape)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("spec"), p.add_argument("weights"), p.add_argument("cut"), p.add_argument("sent")
    p.add_argument("--dp-clip", type=float, default=0.0)
    p.add_argument("--dp-noise", type=float, default=0.0)
    p.add_argument("--aux", type=int, default=10000)
    p.add_argument("--targets", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--label", default="")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)

    front = SpecModel(load_spec(a.spec))
    front.load_state_dict(load_safetensors(a.weights), strict=True)
    front.output = a.cut  # run the graph up to the cut: what the edge computes
    front.eval()
    sent = load_safetensors(a.sent)
    samples = sent["samples"].long()[:a.targets]
    z_target = sent["activations"].float()[:a.targets]
    sample_shape = json.loads(safetensors_metadata(a.sent)["sample_shape"])
    if len(samples) < a.targets:
        sys.exit(f"FAIL: {a.sent} holds {len(samples)} sent samples, fewer than --targets {a.targets}")
    aux = images("t10k-images-idx3-ubyte.gz", a.aux)
    target = images("train-images-idx3-ubyte.gz", int(samples.max()) + 1)[samples]
    with torch.no_grad():
        z_aux = front(aux)
    if len(sample_shape) == 3:  # tandem's channels-last rows in PyTorch's [C, H, W] order, as the decoder learns them
        h, w, c = sample_shape
        if list(z_aux.shape[1:]) != [c, h, w]:
            sys.exit(f"FAIL: the sent rows are {sample_shape} (channels last), the front's cut {list(z_aux.shape[1:])}")
        z_target = z_target.reshape(-1, h, w, c).permute(0, 3, 1, 2)
    z_aux, z_target = z_aux.reshape(a.aux, -1), z_target.reshape(len(samples), -1)
    width = z_aux.shape[1]
    if z_target.shape[1] != width:
        sys.exit(f"FAIL: the sent rows hold {z_target.shape[1]} values, the front's cut {width}")
    decoder = torch.nn.Sequential(torch.nn.Linear(width, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                  torch.nn.ReLU(), torch.nn.Linear(512, 784), torch.nn.Sigmoid())
    opt = torch.optim.Adam(decoder.parameters(), lr=1e-3)
    for _ in range(a.epochs):
        order = torch.randperm(a.aux)
        for i in range(0, a.aux, 128):
            idx = order[i:i + 128]
            z = released(z_aux[idx], a.dp_clip, a.dp_noise, gen)  # fresh noise each pass, as the edge draws it
            loss = F.mse_loss(decoder(z).reshape(-1, 1, 28, 28), aux[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        guess = decoder(z_target).reshape(-1, 1, 28, 28)
        mean_image = aux.mean(0, keepdim=True).expand_as(target)
    result = {"bench": "inversion", "label": a.label, "cut": a.cut, "cut_values": width, "dp_clip": a.dp_clip,
              "dp_noise": a.dp_noise, "targets": a.targets, "aux": a.aux,
              "ssim": round(ssim(guess, target), 4), "mse": round(float(F.mse_loss(guess, target)), 5),
              "mean_image_ssim": round(ssim(mean_image, target), 4),
              "mean_image_mse": round(float(F.mse_loss(mean_image, target)), 5)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
