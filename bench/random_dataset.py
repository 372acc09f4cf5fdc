"""Random images and labels in a spec's input shape, as a tandem data set folder
(train.safetensors and test.safetensors: the input tensor and "labels"), for benchmarks that
time training, not learning.

Usage: python3 bench/random_dataset.py SPEC OUT_DIR TRAIN_SAMPLES TEST_SAMPLES
"""
import json
import os
import struct
import sys

import torch


def write(path, image, classes, count, seed):
    g = torch.Generator().manual_seed(seed)
    tensors = {image["name"]: torch.rand([count] + image["shape"], generator=g),
               "labels": torch.randint(0, classes, [count], generator=g, dtype=torch.int32)}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        blob = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32" if t.dtype == torch.float32 else "I32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    spec, out, n, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with open(spec) as f:
        s = json.load(f)
    (image,) = s["inputs"]
    classes = next(node["linear"]["out_features"] for node in reversed(s["nodes"]) if node["op"] == "linear")
    os.makedirs(out)
    write(os.path.join(out, "train.safetensors"), image, classes, n, 1)
    write(os.path.join(out, "test.safetensors"), image, classes, n_test, 2)


if __name__ == "__main__":
    main()
