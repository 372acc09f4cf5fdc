#!/usr/bin/env python3
"""Generates the forms-layoutlm data set: deterministic document pages of 16 tokens at most,
each token a word id with its box [x0, y0, x1, y1] on a 32x32 grid, in shuffled order (not
reading order, so only the boxes say where a word sits). Each page holds one key word:
"invoice" (id 2) or "referral" (id 3), anywhere; the rest are filler words (ids 4..31).
The class is the key word and whether it sits in the page's top or bottom half:
0 invoice/top, 1 invoice/bottom, 2 referral/top, 3 referral/bottom. A model that reads only
the words gets at most 50%: the 2-D position path must learn. Token 0 is [CLS] (id 1, box 0).
--rule x places the split between the page's left and right halves instead (a second task
on the same pages, for fine-tuning a model trained on the first).
Writes OUT/train.safetensors (4000 pages) and OUT/test.safetensors (1000): ids I32 [N, 16],
mask U8 [N, 16] (1 keep, 0 padding), boxes I32 [N, 16, 4], labels I32 [N]; tandem-edge
--data OUT reads them. Standard library only.
Usage: make_data.py OUT [TRAIN] [TEST] [--rule y|x]"""
import json
import os
import random
import struct
import sys

TOKENS, GRID = 16, 32


def page(rng, rule="y"):
    length = rng.randint(8, TOKENS)
    key = rng.choice((2, 3))
    words = [key] + [rng.randint(4, 31) for _ in range(length - 2)]
    boxes = []
    for _ in words:
        y0, x0 = rng.randrange(GRID), rng.randrange(GRID - 4)
        boxes.append([x0, y0, x0 + rng.randint(1, 4), min(y0 + 1, GRID)])
    order = list(range(len(words)))
    rng.shuffle(order)
    where = boxes[0][1] if rule == "y" else boxes[0][0]
    label = (key - 2) * 2 + (1 if where >= GRID // 2 else 0)
    ids = [1] + [words[i] for i in order]
    box = [[0, 0, 0, 0]] + [boxes[i] for i in order]
    pad = TOKENS - len(ids)
    return ids + [0] * pad, [1] * len(ids) + [0] * pad, box + [[0, 0, 0, 0]] * pad, label


def write(path, pages):
    n = len(pages)
    tensors = [
        ("ids", "I32", [n, TOKENS], struct.pack(f"<{n * TOKENS}i", *[v for p in pages for v in p[0]])),
        ("mask", "U8", [n, TOKENS], bytes(v for p in pages for v in p[1])),
        ("boxes", "I32", [n, TOKENS, 4], struct.pack(f"<{n * TOKENS * 4}i", *[v for p in pages for b in p[2] for v in b])),
        ("labels", "I32", [n], struct.pack(f"<{n}i", *[p[3] for p in pages])),
    ]
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, data in tensors:
            f.write(data)


def main():
    args = sys.argv[1:]
    rule = "y"
    if "--rule" in args:
        at = args.index("--rule")
        rule = args[at + 1]
        del args[at:at + 2]
    if rule not in ("y", "x"):
        sys.exit(f"make_data.py: --rule is y or x, got {rule}")
    out = args[0]
    train, test = (int(args[1]) if len(args) > 1 else 4000), (int(args[2]) if len(args) > 2 else 1000)
    os.makedirs(out, exist_ok=True)
    rng = random.Random(2026)
    write(os.path.join(out, "train.safetensors"), [page(rng, rule) for _ in range(train)])
    write(os.path.join(out, "test.safetensors"), [page(rng, rule) for _ in range(test)])
    print(f"forms-layoutlm: {train} training and {test} test pages in {out} (rule {rule})")


if __name__ == "__main__":
    main()
