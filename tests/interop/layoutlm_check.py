#!/usr/bin/python3
"""The forms-layoutlm encoder built with torch.nn under Hugging Face's LayoutLM module names
(Debian's torch has no transformers library): seeded random weights saved as safetensors with
HF's tensor names, and the model's logits on a data set's test pages, for tandem to match.

usage: layoutlm_check.py write WEIGHTS DATA_DIR TORCH_LOGITS   (weights and torch's logits)
       layoutlm_check.py train WEIGHTS DATA_DIR SAMPLES STEPS LR TORCH_LOGITS
           (from WEIGHTS, STEPS steps of plain SGD at LR, each on the training split's first
           SAMPLES pages, the loss their mean; then the test pages' logits)
       layoutlm_check.py compare TORCH_LOGITS TANDEM_LOGITS      (exit 1 beyond 1e-4)
77: no torch in this Python (the test skips, saying so).
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"SKIP: /usr/bin/python3 has no torch ({e}); install python3-torch")
    sys.exit(77)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hf_encoder import Module, additive_mask, encoder_layer, layer_norm, read_safetensors, run_layer, write_safetensors  # noqa: E402

HIDDEN, HEADS, LAYERS, INTER, VOCAB, POSITIONS, COORDS, CLASSES = 32, 4, 2, 64, 32, 16, 33, 4


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layoutlm = Module()
        e = self.layoutlm.embeddings = Module()
        e.word_embeddings = torch.nn.Embedding(VOCAB, HIDDEN)
        e.position_embeddings = torch.nn.Embedding(POSITIONS, HIDDEN)
        for axis in "xyhw":
            setattr(e, f"{axis}_position_embeddings", torch.nn.Embedding(COORDS, HIDDEN))
        e.LayerNorm = layer_norm(HIDDEN)
        self.layoutlm.encoder = Module()
        self.layoutlm.encoder.layer = torch.nn.ModuleList(encoder_layer(HIDDEN, INTER) for _ in range(LAYERS))
        self.layoutlm.pooler = Module()
        self.layoutlm.pooler.dense = torch.nn.Linear(HIDDEN, HIDDEN)
        self.classifier = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, ids, mask, boxes):
        e = self.layoutlm.embeddings
        t = ids.shape[1]
        x = e.word_embeddings(ids) + e.position_embeddings(torch.arange(t))[None]
        x = (x + e.x_position_embeddings(boxes[..., 0]) + e.y_position_embeddings(boxes[..., 1])
             + e.x_position_embeddings(boxes[..., 2]) + e.y_position_embeddings(boxes[..., 3])
             + e.h_position_embeddings(boxes[..., 3] - boxes[..., 1])
             + e.w_position_embeddings(boxes[..., 2] - boxes[..., 0]))
        x = e.LayerNorm(x)
        additive = additive_mask(mask)
        for layer in self.layoutlm.encoder.layer:
            x = run_layer(layer, x, additive, HEADS)
        pooled = torch.tanh(self.layoutlm.pooler.dense(x[:, 0]))
        return self.classifier(pooled)


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "write":
        weights, data, logits_path = sys.argv[2:5]
        torch.manual_seed(16)
        model = Model().eval()
        with torch.no_grad():  # BERT's initialisation scale, so the logits are not all alike
            for name, p in model.named_parameters():
                if not name.endswith("LayerNorm.weight") and not name.endswith("LayerNorm.bias"):
                    p.normal_(0.0, 0.2)
        write_safetensors(weights, model.state_dict())
        test = read_safetensors(data + "/test.safetensors")
        with torch.no_grad():
            logits = model(test["ids"].long(), test["mask"], test["boxes"].long())
        open(logits_path, "wb").write(logits.numpy().astype("<f4").tobytes())
        print(f"torch: {len(model.state_dict())} tensors under Hugging Face names, logits of {logits.shape[0]} pages")
        return 0
    if sys.argv[1] == "train":
        weights, data, samples, steps, lr, logits_path = sys.argv[2:8]
        model = Model()
        model.load_state_dict(read_safetensors(weights))
        model.train()  # no dropout in this model: train and eval compute the same
        train = read_safetensors(data + "/train.safetensors")
        n = int(samples)
        ids, mask, boxes, labels = (train[k][:n] for k in ("ids", "mask", "boxes", "labels"))
        opt = torch.optim.SGD(model.parameters(), lr=float(lr), momentum=0.0)
        for _ in range(int(steps)):
            opt.zero_grad()
            F.cross_entropy(model(ids.long(), mask, boxes.long()), labels.long()).backward()
            opt.step()
        test = read_safetensors(data + "/test.safetensors")
        with torch.no_grad():
            logits = model(test["ids"].long(), test["mask"], test["boxes"].long())
        open(logits_path, "wb").write(logits.numpy().astype("<f4").tobytes())
        print(f"torch: {steps} SGD steps on {n} pages, logits of {logits.shape[0]} pages")
        return 0
    want = torch.frombuffer(bytearray(open(sys.argv[2], "rb").read()), dtype=torch.float32)
    got = torch.frombuffer(bytearray(open(sys.argv[3], "rb").read()), dtype=torch.float32)
    if want.shape != got.shape:
        print(f"FAIL: torch wrote {want.numel()} logits, tandem {got.numel()}")
        return 1
    worst = (want - got).abs().max().item()
    print(f"logits of torch and tandem: {want.numel()} values, max difference {worst:.3g} (bar 1e-4)")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
