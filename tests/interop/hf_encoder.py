"""Hugging Face's BERT encoder in torch.nn, as the interop tests and the spam-bert benchmark
build it (Debian's torch has no transformers library): a layer under BertLayer's module names
(attention.self.query/key/value, attention.output.dense and LayerNorm, intermediate.dense,
output.dense and LayerNorm; post-LayerNorm, erf GELU), the additive key padding mask, and
safetensors read and written with the standard library and torch."""
import json
import math
import struct

import torch
import torch.nn.functional as F


class Module(torch.nn.Module):
    """A named container, as HF's nesting (bert.encoder.layer.0.attention.self...) needs."""


def layer_norm(hidden):
    return torch.nn.LayerNorm(hidden, eps=1e-12)


def encoder_layer(hidden, inter):
    layer = Module()
    layer.attention = Module()
    layer.attention.self = Module()
    for w in ("query", "key", "value"):
        setattr(layer.attention.self, w, torch.nn.Linear(hidden, hidden))
    layer.attention.output = Module()
    layer.attention.output.dense = torch.nn.Linear(hidden, hidden)
    layer.attention.output.LayerNorm = layer_norm(hidden)
    layer.intermediate = Module()
    layer.intermediate.dense = torch.nn.Linear(hidden, inter)
    layer.output = Module()
    layer.output.dense = torch.nn.Linear(inter, hidden)
    layer.output.LayerNorm = layer_norm(hidden)
    return layer


def additive_mask(mask):
    """[batch, tokens] of 1 (keep) and 0 (padding) -> what the attention scores get added."""
    return ((1.0 - mask.float()) * torch.finfo(torch.float32).min)[:, None, None, :]


def run_layer(layer, x, additive, heads):
    b, t, hidden = x.shape
    dh = hidden // heads
    a = layer.attention.self
    split = lambda v: v.view(b, t, heads, dh).permute(0, 2, 1, 3)
    scores = split(a.query(x)) @ split(a.key(x)).transpose(-1, -2) / math.sqrt(dh) + additive
    ctx = (torch.softmax(scores, -1) @ split(a.value(x))).permute(0, 2, 1, 3).reshape(b, t, hidden)
    x = layer.attention.output.LayerNorm(x + layer.attention.output.dense(ctx))
    return layer.output.LayerNorm(x + layer.output.dense(F.gelu(layer.intermediate.dense(x))))


def read_safetensors(path):
    """Every tensor of a safetensors file (F32, I32, I64, U8, BOOL) as a torch tensor."""
    import numpy as np
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        dtype = {"I32": np.int32, "U8": np.uint8, "F32": np.float32, "I64": np.int64, "BOOL": np.bool_}[h["dtype"]]
        out[name] = torch.from_numpy(np.frombuffer(blob[8 + n + a:8 + n + b], dtype=dtype).reshape(h["shape"]).copy())
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        # a bool tensor (torch's key_padding_mask) as safetensors writes one: BOOL, a byte each
        boolean = t.dtype == torch.bool
        data = (t.to(torch.uint8) if boolean else t.detach().contiguous().float()).numpy().tobytes()
        header[name] = {"dtype": "BOOL" if boolean else "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class BertForSequenceClassification(torch.nn.Module):
    """Hugging Face's BertForSequenceClassification as modules whose forward does the work
    (what torch.onnx.export's scope names follow: bert.encoder.layer.0.attention.self/MatMul),
    one segment (`types` 0: no token-type table; else a table of `types` rows and, as
    transformers does, a non-persistent buffer of token_type_ids all 0 expanded over the batch),
    the position ids a non-persistent buffer as in transformers 4.31 on, dropout `p` on the
    hidden states (none on attention probabilities: tandem's attention has none).
    forward(input_ids, attention_mask[, token_type_ids]) -> logits."""

    def __init__(self, vocab, tokens, hidden, layers, heads, inter, classes, p=0.1, types=0):
        super().__init__()
        self.bert = _Bert(vocab, tokens, hidden, layers, heads, inter, p, types)
        self.dropout = torch.nn.Dropout(p)
        self.classifier = torch.nn.Linear(hidden, classes)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return self.classifier(self.dropout(self.bert(input_ids, attention_mask, token_type_ids)))


class _Bert(torch.nn.Module):
    def __init__(self, vocab, tokens, hidden, layers, heads, inter, p, types=0):
        super().__init__()
        self.embeddings = _Embeddings(vocab, tokens, hidden, p, types)
        self.encoder = _Encoder(hidden, layers, heads, inter, p)
        self.pooler = _Pooler(hidden)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        additive = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
        return self.pooler(self.encoder(self.embeddings(input_ids, token_type_ids), additive))


class _Encoder(torch.nn.Module):
    def __init__(self, hidden, layers, heads, inter, p):
        super().__init__()
        self.layer = torch.nn.ModuleList([_Layer(hidden, heads, inter, p) for _ in range(layers)])

    def forward(self, x, additive):
        for layer in self.layer:
            x = layer(x, additive)
        return x


class _Embeddings(torch.nn.Module):
    def __init__(self, vocab, tokens, hidden, p, types=0):
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(vocab, hidden)
        self.position_embeddings = torch.nn.Embedding(tokens, hidden)
        if types:
            self.token_type_embeddings = torch.nn.Embedding(types, hidden)
            self.register_buffer("token_type_ids", torch.zeros((1, tokens), dtype=torch.long), persistent=False)
        self.LayerNorm = layer_norm(hidden)
        self.dropout = torch.nn.Dropout(p)
        self.register_buffer("position_ids", torch.arange(tokens).expand((1, -1)), persistent=False)

    def forward(self, ids, token_type_ids=None):
        positions = self.position_ids[:, :ids.size(1)]
        x = self.word_embeddings(ids)
        if token_type_ids is None and hasattr(self, "token_type_embeddings"):  # BertEmbeddings' buffer of zeros
            token_type_ids = self.token_type_ids[:, :ids.size(1)].expand(ids.size(0), ids.size(1))
        if token_type_ids is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x + self.position_embeddings(positions)))


class _SelfAttention(torch.nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_size = heads, hidden // heads
        self.query, self.key, self.value = (torch.nn.Linear(hidden, hidden) for _ in range(3))

    def split(self, x):
        return x.view(x.size()[:-1] + (self.heads, self.head_size)).permute(0, 2, 1, 3)

    def forward(self, x, additive):
        scores = self.split(self.query(x)) @ self.split(self.key(x)).transpose(-1, -2)
        scores = scores / math.sqrt(self.head_size) + additive
        context = (torch.softmax(scores, -1) @ self.split(self.value(x))).permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (self.heads * self.head_size,))


class _Output(torch.nn.Module):  # BertSelfOutput and BertOutput: dense, dropout, residual, LayerNorm
    def __init__(self, inner, hidden, p):
        super().__init__()
        self.dense = torch.nn.Linear(inner, hidden)
        self.LayerNorm = layer_norm(hidden)
        self.dropout = torch.nn.Dropout(p)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class _Layer(torch.nn.Module):
    def __init__(self, hidden, heads, inter, p):
        super().__init__()
        self.attention = _Attention(hidden, heads, p)
        self.intermediate = _Intermediate(hidden, inter)
        self.output = _Output(inter, hidden, p)

    def forward(self, x, additive):
        a = self.attention(x, additive)
        return self.output(self.intermediate(a), a)


class _Attention(torch.nn.Module):
    def __init__(self, hidden, heads, p):
        super().__init__()
        self.self = _SelfAttention(hidden, heads)
        self.output = _Output(hidden, hidden, p)

    def forward(self, x, additive):
        return self.output(self.self(x, additive), x)


class _Intermediate(torch.nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.dense = torch.nn.Linear(hidden, inter)
        self.intermediate_act_fn = torch.nn.GELU()

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class _Pooler(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.dense = torch.nn.Linear(hidden, hidden)
        self.activation = torch.nn.Tanh()

    def forward(self, x):
        return self.activation(self.dense(x[:, 0]))


class LayoutLMForSequenceClassification(torch.nn.Module):
    """Hugging Face's LayoutLMForSequenceClassification as modules whose forward does the work:
    BERT's encoder and pooler under `layoutlm.`, its embeddings adding, as transformers writes
    them, the words, the positions (a buffer of position ids), each token's box [x0, y0, x1, y1]
    through the x and y tables (x0 and x1 share the x table, y0 and y1 the y table), its height
    and width through the h and w tables, and the token-type table's row 0 (token_type_ids left
    to zeros). forward(input_ids, attention_mask, bbox) -> logits."""

    def __init__(self, vocab, tokens, coords, hidden, layers, heads, inter, classes, p=0.0):
        super().__init__()
        self.layoutlm = _LayoutLM(vocab, tokens, coords, hidden, layers, heads, inter, p)
        self.dropout = torch.nn.Dropout(p)
        self.classifier = torch.nn.Linear(hidden, classes)

    def forward(self, input_ids, attention_mask, bbox):
        return self.classifier(self.dropout(self.layoutlm(input_ids, attention_mask, bbox)))


class _LayoutLM(torch.nn.Module):
    def __init__(self, vocab, tokens, coords, hidden, layers, heads, inter, p):
        super().__init__()
        self.embeddings = _LayoutEmbeddings(vocab, tokens, coords, hidden, p)
        self.encoder = _Encoder(hidden, layers, heads, inter, p)
        self.pooler = _Pooler(hidden)

    def forward(self, input_ids, attention_mask, bbox):
        additive = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
        return self.pooler(self.encoder(self.embeddings(input_ids, bbox), additive))


class _LayoutEmbeddings(torch.nn.Module):
    def __init__(self, vocab, tokens, coords, hidden, p):
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(vocab, hidden)
        self.position_embeddings = torch.nn.Embedding(tokens, hidden)
        self.x_position_embeddings = torch.nn.Embedding(coords, hidden)
        self.y_position_embeddings = torch.nn.Embedding(coords, hidden)
        self.h_position_embeddings = torch.nn.Embedding(coords, hidden)
        self.w_position_embeddings = torch.nn.Embedding(coords, hidden)
        self.token_type_embeddings = torch.nn.Embedding(2, hidden)
        self.LayerNorm = layer_norm(hidden)
        self.dropout = torch.nn.Dropout(p)
        self.register_buffer("position_ids", torch.arange(tokens).expand((1, -1)), persistent=False)

    def forward(self, input_ids, bbox):
        t = input_ids.size(1)
        words = self.word_embeddings(input_ids)
        positions = self.position_embeddings(self.position_ids[:, :t])
        left = self.x_position_embeddings(bbox[:, :, 0])
        upper = self.y_position_embeddings(bbox[:, :, 1])
        right = self.x_position_embeddings(bbox[:, :, 2])
        lower = self.y_position_embeddings(bbox[:, :, 3])
        h = self.h_position_embeddings(bbox[:, :, 3] - bbox[:, :, 1])
        w = self.w_position_embeddings(bbox[:, :, 2] - bbox[:, :, 0])
        types = self.token_type_embeddings(torch.zeros_like(input_ids))
        return self.dropout(self.LayerNorm(words + positions + left + upper + right + lower + h + w + types))
