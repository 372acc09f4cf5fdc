#!/usr/bin/python3
"""A small BERT built with torch.nn under Hugging Face's BertForSequenceClassification names,
saved as a real Hugging Face checkpoint is: BF16 weights, a position table longer than the
model reads (64 rows for 16 tokens), a token-type table, the embeddings' LayerNorm under the
old names (gamma, beta), and tensors tandem has no use for (position_ids, an MLM head's bias).
tandem must load it (--init-from, tandem evaluate) and give torch's logits within 1e-4.

usage: bert_check.py spec OUT_JSON                             (the same model as a tandem spec)
       bert_check.py write WEIGHTS DATA_DIR TORCH_LOGITS       (the checkpoint and torch's logits
                                                                on DATA_DIR/test.safetensors's ids
                                                                and mask, every token segment A)
       bert_check.py load EXPORTED DATA_DIR TORCH_LOGITS       (tandem export's file into the same
                                                                BERT with 16 positions, strictly:
                                                                every name and shape; its logits)
77: no torch in this Python (the test skips, saying so).
"""
import json
import sys

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SKIP: /usr/bin/python3 has no torch ({e}); install python3-torch")
    sys.exit(77)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hf_encoder import Module, additive_mask, encoder_layer, layer_norm, read_safetensors, run_layer  # noqa: E402

HIDDEN, HEADS, LAYERS, INTER, VOCAB, TOKENS, TABLE, TYPES, CLASSES = 32, 4, 2, 64, 32, 16, 64, 2, 4


class Bert(torch.nn.Module):
    def __init__(self, table=TABLE):
        super().__init__()
        self.bert = Module()
        e = self.bert.embeddings = Module()
        e.word_embeddings = torch.nn.Embedding(VOCAB, HIDDEN)
        e.position_embeddings = torch.nn.Embedding(table, HIDDEN)
        e.token_type_embeddings = torch.nn.Embedding(TYPES, HIDDEN)
        e.LayerNorm = layer_norm(HIDDEN)
        self.bert.encoder = Module()
        self.bert.encoder.layer = torch.nn.ModuleList(encoder_layer(HIDDEN, INTER) for _ in range(LAYERS))
        self.bert.pooler = Module()
        self.bert.pooler.dense = torch.nn.Linear(HIDDEN, HIDDEN)
        self.classifier = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, ids, mask):
        e = self.bert.embeddings
        t = ids.shape[1]
        x = e.word_embeddings(ids) + e.position_embeddings(torch.arange(t))[None] + e.token_type_embeddings(torch.zeros_like(ids))
        x = e.LayerNorm(x)
        additive = additive_mask(mask)
        for layer in self.bert.encoder.layer:
            x = run_layer(layer, x, additive, HEADS)
        return self.classifier(torch.tanh(self.bert.pooler.dense(x[:, 0])))


def spec():
    nodes = []

    def n(name, op, inputs, extra=""):
        nodes.append(f'{{ name: "{name}", op: "{op}", inputs: {json.dumps(inputs)}{", " + extra if extra else ""} }}')
    n("bert.embeddings.word_embeddings", "embedding", ["ids"], f"embedding: {{ count: {VOCAB}, features: {HIDDEN} }}")
    n("bert.embeddings.position_embeddings", "position_embedding", ["bert.embeddings.word_embeddings"], f"embedding: {{ count: {TOKENS} }}")
    n("bert.embeddings.LayerNorm", "layer_norm", ["bert.embeddings.position_embeddings"], "layer_norm: { eps: 1e-12 }")
    x = "bert.embeddings.LayerNorm"
    for i in range(LAYERS):
        p = f"bert.encoder.layer.{i}"
        for w in ("query", "key", "value"):
            n(f"{p}.attention.self.{w}", "linear", [x], f"linear: {{ out_features: {HIDDEN} }}")
        n(f"{p}.attention.self", "attention", [f"{p}.attention.self.query", f"{p}.attention.self.key", f"{p}.attention.self.value", "mask"],
          f"attention: {{ heads: {HEADS} }}")
        n(f"{p}.attention.output.dense", "linear", [f"{p}.attention.self"], f"linear: {{ out_features: {HIDDEN} }}")
        n(f"{p}.attention.output.residual", "add", [x, f"{p}.attention.output.dense"])
        n(f"{p}.attention.output.LayerNorm", "layer_norm", [f"{p}.attention.output.residual"], "layer_norm: { eps: 1e-12 }")
        n(f"{p}.intermediate.dense", "linear", [f"{p}.attention.output.LayerNorm"], f"linear: {{ out_features: {INTER} }}")
        n(f"{p}.intermediate.act", "gelu", [f"{p}.intermediate.dense"])
        n(f"{p}.output.dense", "linear", [f"{p}.intermediate.act"], f"linear: {{ out_features: {HIDDEN} }}")
        n(f"{p}.output.residual", "add", [f"{p}.attention.output.LayerNorm", f"{p}.output.dense"])
        n(f"{p}.output.LayerNorm", "layer_norm", [f"{p}.output.residual"], "layer_norm: { eps: 1e-12 }")
        x = f"{p}.output.LayerNorm"
    n("bert.pooler.first", "token_pool", [x])
    n("bert.pooler.dense", "linear", ["bert.pooler.first"], f"linear: {{ out_features: {HIDDEN} }}")
    n("bert.pooler.activation", "tanh", ["bert.pooler.dense"])
    n("classifier", "linear", ["bert.pooler.activation"], f"linear: {{ out_features: {CLASSES} }}")
    return ("{\n  name: \"tiny-bert\",\n"
            f"  inputs: [ {{ name: \"ids\", shape: [{TOKENS}], dtype: \"int32\" }}, {{ name: \"mask\", shape: [{TOKENS}], mask: true }} ],\n"
            "  nodes: [\n    " + ",\n    ".join(nodes) + "\n  ],\n"
            "  output: \"classifier\", loss: \"softmax_cross_entropy\", cut: \"bert.encoder.layer.0.output.LayerNorm\"\n}\n")


def write_checkpoint(path, model):
    import struct
    header, blobs, offset = {}, [], 0
    tensors = []
    for name, t in model.state_dict().items():
        name = name.replace("embeddings.LayerNorm.weight", "embeddings.LayerNorm.gamma")
        name = name.replace("embeddings.LayerNorm.bias", "embeddings.LayerNorm.beta")
        tensors.append((name, "BF16", list(t.shape), t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()))
    tensors.append(("bert.embeddings.position_ids", "I64", [1, TABLE], torch.arange(TABLE, dtype=torch.int64)[None].numpy().tobytes()))
    tensors.append(("cls.predictions.bias", "F32", [VOCAB], torch.zeros(VOCAB).numpy().tobytes()))
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "spec":
        open(sys.argv[2], "w").write(spec())
        return 0
    weights, data, logits_path = sys.argv[2:5]
    if sys.argv[1] == "load":
        model = Bert(table=TOKENS).eval()
        model.load_state_dict(read_safetensors(weights), strict=True)
        test = read_safetensors(data + "/test.safetensors")
        with torch.no_grad():
            logits = model(test["ids"].long(), test["mask"])
        open(logits_path, "wb").write(logits.numpy().astype("<f4").tobytes())
        print(f"torch: loaded tandem's export strictly ({len(model.state_dict())} tensors), logits of {logits.shape[0]} pages")
        return 0
    torch.manual_seed(17)
    model = Bert().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.normal_(0.0, 0.2)
            else:  # not all ones and zeros: a swapped gamma and beta would show
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
        for p in model.parameters():  # what the BF16 file holds, so both sides compute on it
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    write_checkpoint(weights, model)
    test = read_safetensors(data + "/test.safetensors")
    with torch.no_grad():
        logits = model(test["ids"].long(), test["mask"])
    open(logits_path, "wb").write(logits.numpy().astype("<f4").tobytes())
    print(f"torch: a BF16 checkpoint of {len(model.state_dict())} tensors under Hugging Face names (and 2 extra), "
          f"logits of {logits.shape[0]} pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
