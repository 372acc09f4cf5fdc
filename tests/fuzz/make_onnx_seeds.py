#!/usr/bin/python3
"""The onnx harness's seeds (tests/fuzz/corpus/onnx/): small models exported by torch 1.13
in training mode, as tandem import reads them: a CNN with batch norm and a squeeze-excitation
block, a BERT-style classifier (attention with its padding mask, embeddings, the pooler), a
small torchvision ViT (patches, the class token's Expand, nn.MultiheadAttention's packed
in-projection), an MLP over records (LayerNorm and both GELUs decomposed at opset 14,
LayerNormalization at 17), a ShuffleNet block (x.chunk's channel slices, the channel
shuffle's general reshape and transpose, a permute of an image), arithmetic no pattern
takes (broadcast gates, scalars, matmuls, gathers, maxima and minima) and a text encoder of
nn.TransformerEncoderLayer reading a bool key_padding_mask (Reshape, Expand, Where into the
merged scores; again with nn.Transformer's causal mask), nanoGPT's attention (split, a
tril buffer masked_fill'ed), comparisons, torch.where and expand
outside the patterns (Gates), a BERT with Hugging Face's token-type table (its buffer of zeros expanded) and
a LayoutLM (boxes through four tables, zeros_like(ids) token types).
usage: make_onnx_seeds.py OUT_DIR"""
import sys
import warnings

import torch
import torchvision

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/interop")
from hf_encoder import BertForSequenceClassification, LayoutLMForSequenceClassification  # noqa: E402


class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc1 = torch.nn.Conv2d(4, 2, 1)
        self.fc2 = torch.nn.Conv2d(2, 4, 1)
        self.head = torch.nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        gate = torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(torch.nn.functional.adaptive_avg_pool2d(x, 1)))))
        return self.head(torch.flatten(x * gate, 1))


class Shuffle(torch.nn.Module):
    """ShuffleNet V2's unit at its smallest: half the channels through a 1x1 convolution, joined
    back and shuffled (view, transpose, view); then the image permuted to [N, W, H, C] and
    flattened, a general tensor a linear reads."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 1)
        self.head = torch.nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        x = torch.cat((a, self.conv(b)), dim=1)
        n, c, h, w = x.size()
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, -1, h, w)
        return self.head(x.permute(0, 3, 2, 1).reshape(n, -1))


class Arith(torch.nn.Module):
    """Arithmetic no pattern takes, at its smallest: an image times a gate over its channels
    (broadcast) and less a scalar; its pixels as tokens through attention written by hand
    (matmul, softmax, matmul); the last token, the channels' maxima and the tokens' minima."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 1)
        self.head = torch.nn.Linear(2 * 3, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = x * torch.sigmoid(x.sum(1, keepdim=True)) - 0.5
        t = x.reshape(x.size(0), 2, 4).transpose(1, 2)
        c = torch.softmax(t @ t.transpose(1, 2) / 2.0, -1) @ t
        return self.head(torch.cat((c[:, -1], x.amax((2, 3)), -c.amin(1)), 1))


class PaddedEncoder(torch.nn.Module):
    """nn.TransformerEncoderLayer at its smallest, with a bool key_padding_mask (True = padding)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        layer = torch.nn.TransformerEncoderLayer(4, 2, 4, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, ids, pad):
        return self.head(self.encoder(self.embed(ids), src_key_padding_mask=pad).mean(1))


class Gates(torch.nn.Module):
    """Comparisons, selections and repeats at their smallest: torch.where(x > 0, x, 0.1 x), a
    linear of the pixels' mean repeated over them (unsqueeze, expand), scores masked_fill'ed with
    -inf below a threshold, logic on comparisons (|, ~, .float())."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 1)
        self.mix = torch.nn.Linear(2, 2)
        self.head = torch.nn.Linear(4 * 2 + 2, 3)

    def forward(self, x):
        x = self.conv(x)
        x = torch.where(x > 0, x, 0.1 * x)
        t = x.flatten(2).transpose(1, 2)
        m = t.mean(1)
        t = t + self.mix(m).unsqueeze(1).expand(-1, 4, -1)
        s = t @ t.transpose(1, 2)
        c = torch.softmax(s.masked_fill(s < -0.25, float("-inf")), -1) @ t
        return self.head(torch.cat((c.flatten(1), m * ((m > 0.5) | ~(m < 0.0)).float()), 1))


class CausalEncoder(PaddedEncoder):
    """The padded encoder reading left to right: nn.Transformer's causal mask (a Trilu of -inf)
    filled where the key padding mask holds."""

    def forward(self, ids, pad):
        causal = torch.nn.Transformer.generate_square_subsequent_mask(ids.size(1))
        return self.head(self.encoder(self.embed(ids), mask=causal, src_key_padding_mask=pad).mean(1))


class Gpt(torch.nn.Module):
    """nanoGPT's attention at its smallest: positions by torch.arange, q, k, v split, the scale
    from the keys' shape, a tril buffer sliced and masked_fill'ed with -inf."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 4)
        self.wpe = torch.nn.Embedding(4, 4)
        self.c_attn = torch.nn.Linear(4, 12)
        self.head = torch.nn.Linear(4, 2)
        self.register_buffer("bias", torch.tril(torch.ones(4, 4)).view(1, 1, 4, 4))

    def forward(self, ids):
        b, t = ids.size()
        x = self.wte(ids) + self.wpe(torch.arange(0, t, dtype=torch.long))
        q, k, v = self.c_attn(x).split(4, dim=2)
        q, k, v = (y.view(b, t, 2, 2).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        att = torch.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        return self.head((att @ v).transpose(1, 2).contiguous().view(b, t, 4).mean(1))


def export(model, x, names, path, opset=14):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          opset_version=opset, input_names=names, output_names=["logits"],
                          dynamic_axes={n: {0: "batch"} for n in names})


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    export(SmallCnn(), torch.randn(2, 2, 4, 4), ["image"], f"{out}/cnn-se")
    bert = BertForSequenceClassification(vocab=10, tokens=4, hidden=8, layers=1, heads=2, inter=8, classes=2)
    export(bert, (torch.randint(0, 10, (2, 4)), torch.ones(2, 4, dtype=torch.int64)), ["input_ids", "attention_mask"],
           f"{out}/bert")
    vit = torchvision.models.VisionTransformer(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=4,
                                               mlp_dim=4, num_classes=2)
    export(vit, torch.randn(2, 3, 8, 8), ["image"], f"{out}/vit")
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.GELU(), torch.nn.Dropout(0.1),
                              torch.nn.Linear(4, 4), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4, 2))
    export(mlp, torch.randn(2, 3), ["record"], f"{out}/mlp14")
    export(mlp, torch.randn(2, 3), ["record"], f"{out}/mlp17", opset=17)
    export(Shuffle(), torch.randn(2, 4, 2, 2), ["image"], f"{out}/shuffle")
    export(Arith(), torch.randn(2, 2, 2, 2), ["image"], f"{out}/arith")
    export(PaddedEncoder(), (torch.randint(0, 10, (2, 4)), torch.zeros(2, 4, dtype=torch.bool)), ["ids", "pad"],
           f"{out}/padded")
    typed = BertForSequenceClassification(vocab=10, tokens=4, hidden=8, layers=1, heads=2, inter=8, classes=2, types=2)
    export(typed, (torch.randint(0, 10, (2, 4)), torch.ones(2, 4, dtype=torch.int64)), ["input_ids", "attention_mask"],
           f"{out}/bert-types")
    layout = LayoutLMForSequenceClassification(vocab=10, tokens=4, coords=8, hidden=8, layers=1, heads=2, inter=8, classes=2)
    boxes = torch.tensor([[[0, 1, 2, 3]] * 4] * 2)
    export(layout, (torch.randint(0, 10, (2, 4)), torch.ones(2, 4, dtype=torch.int64), boxes),
           ["input_ids", "attention_mask", "bbox"], f"{out}/layoutlm")
    export(Gates(), torch.randn(2, 2, 2, 2), ["image"], f"{out}/gates")
    export(CausalEncoder(), (torch.randint(0, 10, (2, 4)), torch.zeros(2, 4, dtype=torch.bool)), ["ids", "pad"],
           f"{out}/causal")
    export(Gpt(), torch.randint(0, 10, (2, 4)), ["ids"], f"{out}/gpt")


if __name__ == "__main__":
    main()
