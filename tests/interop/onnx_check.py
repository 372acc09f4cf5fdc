#!/usr/bin/python3
"""PyTorch's side of the ONNX import tests (tests/e2e/onnx_import.sh).

usage: onnx_check.py export MODEL OUT_DIR N [OPSET]
           torchvision's MODEL (resnet18, mobilenet_v2, ...; 10 classes) with random weights and
           random batch-norm statistics, exported in training mode (at OPSET, default 14) to
           OUT_DIR/model.onnx;
           OUT_DIR/data/test.safetensors and train.safetensors: N random 32x32 images in
           tandem's layout (NHWC) and labels; OUT_DIR/torch.f32: torch's logits in eval mode;
           OUT_DIR/torch.pt: the state dict the file was exported from. MODEL tabular14 and
           tabular17: records of 12 features; bert: a BERT-style text classifier (bert() below),
           bert0 the same without dropout and with a token-type table (2 types, one segment; train
           and weights take it), bert2 with that table and token_type_ids an input (two segments);
           layoutlm: a LayoutLM-style classifier of pages of words and boxes (layoutlm() below);
           convnext: a two-stage torchvision ConvNeXt (make() below); pools: Pools below;
           vit: a small VisionTransformer (make() below); encoder: a text classifier of
           nn.TransformerEncoderLayers (TextEncoder below); views and arith: general reshapes,
           transposes and reductions (Views below), and arithmetic (Arith below)
       onnx_check.py refused OUT_DIR
           a model of ops tandem does not take (Unsupported below) to OUT_DIR/model.onnx
       onnx_check.py train MODEL OUT_DIR EPOCHS BATCH K LR SEED
           from OUT_DIR/torch.pt, what tandem-edge --limit BATCH --batch BATCH --microbatches K
           --epochs EPOCHS --lr LR --momentum 0 --seed SEED does: each epoch one step on the
           training set's first BATCH samples in tandem's order for that epoch
           (data/epoch_order.h), K micro-batches each through the model in training mode (batch
           norm's statistics per micro-batch), gradients summed with the loss the whole batch's
           mean, plain SGD; the state dict to OUT_DIR/torch-trained.pt
       onnx_check.py weights MODEL EXPORTED.safetensors OUT_DIR TOL
           tandem export's file loaded strictly into torchvision's MODEL equals
           OUT_DIR/torch-trained.pt within TOL, and training moved a parameter by 10 TOL at least
       onnx_check.py compare TORCH_LOGITS TANDEM_LOGITS TOL   (exit 1 beyond TOL)
77: no torch or torchvision in this Python (the test skips, saying so).
"""
import sys
import warnings

if len(sys.argv) == 5 and sys.argv[1] == "compare":  # numpy alone: quick, run once a backend
    import numpy as np
    a, b, tol = np.fromfile(sys.argv[2], dtype=np.float32), np.fromfile(sys.argv[3], dtype=np.float32), float(sys.argv[4])
    if a.shape != b.shape:
        print(f"FAIL: {a.size} values against {b.size}")
        sys.exit(1)
    diff, scale = float(np.abs(a - b).max()), float(np.abs(a).max())
    print(f"max |torch - tandem| = {diff:.3g} over {a.size} logits (largest |logit| {scale:.3g})")
    sys.exit(0 if diff <= tol else 1)

try:
    import torch
    import torchvision
except ImportError as e:  # pragma: no cover
    print(f"SKIP: /usr/bin/python3 has no torch/torchvision ({e}); install python3-torch python3-torchvision")
    sys.exit(77)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hf_encoder import BertForSequenceClassification, LayoutLMForSequenceClassification, read_safetensors, write_safetensors  # noqa: E402

M64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64, whose output the C++ standard fixes (core/random.h's Rng)."""

    def __init__(self, seed):
        self.mt = [seed & M64]
        for i in range(1, 312):
            self.mt.append((6364136223846793005 * (self.mt[-1] ^ (self.mt[-1] >> 62)) + i) & M64)
        self.i = 312

    def next(self):
        if self.i >= 312:
            mt = self.mt
            for k in range(312):
                x = (mt[k] & 0xFFFFFFFF80000000) | (mt[(k + 1) % 312] & 0x7FFFFFFF)
                mt[k] = mt[(k + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.i = 0
        x = self.mt[self.i]
        self.i += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        return (x ^ (x >> 43)) & M64


def epoch_order(n, seed, epoch):
    """data/epoch_order.h: the order tandem's edge reads an epoch's samples in."""
    order = list(range(n))
    rng = MT19937_64(seed ^ 0x5eed ^ ((epoch * 0x9e3779b97f4a7c15) & M64))
    for i in range(n - 1, 0, -1):
        limit = M64 - M64 % (i + 1)
        x = rng.next()
        while x >= limit:
            x = rng.next()
        j = x % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def randomize(model, gen):
    """Weights as torchvision initialises them, batch norms given statistics and affine
    parameters far from their start, so evaluation exercises every tensor."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.2)
            m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=gen) * 0.1)
        elif isinstance(m, torch.nn.Linear):  # logits of order 1, not 0.01 (MobileNet's init)
            m.weight.data.copy_(torch.randn(m.weight.shape, generator=gen) / m.in_features ** 0.5)
        elif isinstance(m, torch.nn.LayerNorm):
            m.weight.data.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
        elif isinstance(m, torch.nn.MultiheadAttention):  # its biases start at zero
            m.in_proj_bias.data.copy_(torch.randn(m.in_proj_bias.shape, generator=gen) * 0.1)
        elif isinstance(m, torchvision.models.convnext.CNBlock):  # its layer scale starts at 1e-6
            m.layer_scale.data.copy_(torch.rand(m.layer_scale.shape, generator=gen) + 0.5)
        elif isinstance(m, torchvision.models.VisionTransformer):  # the class token starts at zero
            m.class_token.data.copy_(torch.randn(m.class_token.shape, generator=gen) * 0.5)
            m.encoder.pos_embedding.data.copy_(torch.randn(m.encoder.pos_embedding.shape, generator=gen) * 0.5)


class Unsupported(torch.nn.Module):
    """Three branches, each through an op tandem does not take (a max pool whose ceil_mode adds
    a window, a LeakyReLU, a permute of an image), added and classified: import names all three
    at once."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(3, stride=2, ceil_mode=True)  # 16 windows over 32 where floor gives 15
        self.branch = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 2, stride=2), torch.nn.LeakyReLU())
        self.fc = torch.nn.Linear(4 * 16 * 16, 10)

    def forward(self, x):
        x = self.stem(x)
        y = x[:, :, ::2, ::2].permute(0, 1, 3, 2)
        return self.fc(torch.flatten(self.pool(x) + self.branch(x) + y, 1))


class Views(torch.nn.Module):
    """Reshapes, transposes and reductions no pattern takes, as general ops: ShuffleNet's
    channel split (x.chunk) and shuffle (view, transpose, view), the image seen as tokens
    (permute, reshape) through a linear, then tokens and features swapped and flattened
    (transpose, reshape); beside them the image's mean over its channels, its sum over rows
    and columns, and each token's sum kept as [N, T, 1]."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.branch = torch.nn.Conv2d(4, 4, 1)
        self.mix = torch.nn.Linear(8, 6)
        self.fc = torch.nn.Linear(6 * 64 + 64 + 8 + 64, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        a, b = x.chunk(2, dim=1)
        x = torch.cat((a, self.branch(b)), dim=1)
        n, c, h, w = x.size()
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        t = torch.tanh(self.mix(x.permute(0, 2, 3, 1).reshape(n, h * w, c)))
        means, sums, token_sums = x.mean(1), x.sum(dim=(2, 3)), t.sum(-1, keepdim=True)
        return self.fc(torch.cat((t.transpose(1, 2).reshape(n, -1), means.reshape(n, -1), sums, token_sums.reshape(n, -1)), 1))


class Arith(torch.nn.Module):
    """Arithmetic no pattern takes, as general binary and matmul ops: an image times a gate of
    its own over the channels ([N, 1, H, W] broadcast) and divided by 2 + tanh of its sums
    over rows and columns ([N, C, 1, 1]); its pixels as tokens through attention written by
    hand (q @ k^T / 4, softmax, @ v); the context times a gate over the tokens ([N, 1, F]
    broadcast), 1 - it, times 2 / (1.5 + sigmoid(it)) and a trained layer scale (gamma), plus
    the tokens; a linear of it, its last
    token (x[:, -1]), the image's third row (x[:, :, 2]), its channels' maxima (amax, and a
    global max pool of -x) and the context's minima over the tokens (amin)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.q = torch.nn.Linear(8, 8)
        self.k = torch.nn.Linear(8, 8)
        self.v = torch.nn.Linear(8, 8)
        self.fc = torch.nn.Linear(64 * 8 + 8 + 64 + 3 * 8, 10)
        self.gamma = torch.nn.Parameter(torch.rand(8) + 0.5)  # a layer scale

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = x * torch.sigmoid(x.sum(1, keepdim=True))
        x = x / (2.0 + torch.tanh(x.sum((2, 3), keepdim=True)))
        t = x.reshape(x.size(0), 8, 64).transpose(1, 2)
        q, k, v = self.q(t), self.k(t), self.v(t)
        c = torch.softmax(q @ k.transpose(1, 2) / 4.0, -1) @ v
        c = 1.0 - c * torch.sigmoid(c.sum(1, keepdim=True))
        c = c * (2.0 / (1.5 + torch.sigmoid(c))) * self.gamma + t
        peaks = torch.cat((x.amax((2, 3)), torch.nn.functional.adaptive_max_pool2d(-x, 1).flatten(1), c.amin(1)), 1)
        return self.fc(torch.cat((c.flatten(1), c[:, -1], x[:, :, 2].flatten(1), peaks), 1))


class Gates(torch.nn.Module):
    """Comparisons, selections and repeats no pattern takes, as general ops: a leaky gate
    written with torch.where (x > 0), the image's pixels as tokens with a linear of their mean
    repeated over them (unsqueeze, expand), attention written by hand whose scores below a
    threshold are masked_fill'ed with -inf (the diagonal never is), values that are exactly
    zero replaced (masked_fill(c == 0, 1)), and the channels at most their mean kept ((m <=
    mean).float(), m * (m > 0.5) | ~(m < 0): logic on comparisons)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.mix = torch.nn.Linear(8, 8)
        self.fc = torch.nn.Linear(64 * 8 + 8 + 8, 10)

    def forward(self, x):
        x = self.conv(x)
        x = torch.where(x > 0, x, 0.1 * x)
        t = x.flatten(2).transpose(1, 2)
        m = t.mean(1)
        t = t + self.mix(m).unsqueeze(1).expand(-1, 64, -1)
        s = t @ t.transpose(1, 2) / 4.0
        c = torch.softmax(s.masked_fill(s < -0.25, float("-inf")), -1) @ t
        c = c.masked_fill(c == 0, 1.0)
        kept = m * (m <= m.mean(1, keepdim=True)).float()
        logic = m * ((m > 0.5) | ~(m < 0.0)).float()
        return self.fc(torch.cat((c.flatten(1), kept, logic), 1))


class Pools(torch.nn.Module):
    """Pads and average pools as torch writes them: nn.AvgPool2d (Pad of zeros, AveragePool),
    one with padding (count_include_pad), F.pad's zeros before a convolution, DenseNet's
    torch.cat of one tensor."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.pool = torch.nn.AvgPool2d(2, stride=2)
        self.pool_1 = torch.nn.AvgPool2d(3, stride=1, padding=1)
        self.conv_1 = torch.nn.Conv2d(8, 8, 3)
        self.fc = torch.nn.Linear(8 * 7 * 7, 10)

    def forward(self, x):
        x = self.pool_1(self.pool(torch.relu(self.conv(x))))
        x = torch.cat([self.conv_1(torch.nn.functional.pad(x, (1, 1, 1, 1)))], 1)
        return self.fc(torch.flatten(x, 1))


class TextEncoder(torch.nn.Module):
    """A text classifier as torch.nn builds one: token embeddings, 2 nn.TransformerEncoderLayers
    (batch_first, GELU, no dropout) reading a bool key padding mask (True = padding), the
    tokens' mean, a linear: 12 tokens of 16, 3 classes. (No nested tensors: torch's eval fast
    path would zero the padding's outputs, which the mean reads.)"""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = torch.nn.Linear(16, 3)

    def forward(self, ids, pad):
        return self.fc(self.encoder(self.embed(ids), src_key_padding_mask=pad).mean(1))


class CausalEncoder(TextEncoder):
    """The text classifier reading its tokens left to right: nn.Transformer's causal mask
    (generate_square_subsequent_mask, an attn_mask of -inf above the diagonal) beside the bool
    key padding mask, the last kept token's features through the linear (x[:, -1] would be
    padding's; the mean keeps it simple: the tokens' mean)."""

    def forward(self, ids, pad):
        causal = torch.nn.Transformer.generate_square_subsequent_mask(ids.size(1))
        return self.fc(self.encoder(self.embed(ids), mask=causal, src_key_padding_mask=pad).mean(1))


class Gpt(torch.nn.Module):
    """A GPT as nanoGPT writes it, one block: token and position embeddings (torch.arange),
    LayerNorm, causal self-attention by hand (c_attn's q, k, v split, heads by view and
    transpose, 1 / sqrt(head size) from the keys' shape, masked_fill of a tril buffer sliced
    to the tokens), an MLP with GELU, the tokens' mean, logits: 12 tokens of 16, 3 classes."""

    def __init__(self, vocab=50, tokens=12, features=16, heads=2):
        super().__init__()
        self.heads = heads
        self.wte = torch.nn.Embedding(vocab, features)
        self.wpe = torch.nn.Embedding(tokens, features)
        self.ln_1 = torch.nn.LayerNorm(features)
        self.c_attn = torch.nn.Linear(features, 3 * features)
        self.c_proj = torch.nn.Linear(features, features)
        self.ln_2 = torch.nn.LayerNorm(features)
        self.c_fc = torch.nn.Linear(features, 4 * features)
        self.mlp_proj = torch.nn.Linear(4 * features, features)
        self.ln_f = torch.nn.LayerNorm(features)
        self.head = torch.nn.Linear(features, 3)
        self.register_buffer("bias", torch.tril(torch.ones(tokens, tokens)).view(1, 1, tokens, tokens))

    def forward(self, ids):
        b, t = ids.size()
        x = self.wte(ids) + self.wpe(torch.arange(0, t, dtype=torch.long))
        h = self.ln_1(x)
        c = h.size(-1)
        q, k, v = self.c_attn(h).split(c, dim=2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))  # traced: Shape, Cast, Pow, Reciprocal
        att = torch.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))
        x = x + self.mlp_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(x))))
        return self.head(self.ln_f(x).mean(1))  # every token's (the last one's would not see the mask in one block)


def make(name):
    """torchvision's model NAME for 10 classes; vit: a small VisionTransformer (32x32 images,
    patches of 8, 2 layers, hidden 16, 2 heads; nn.MultiheadAttention's packed in-projection)."""
    if name == "views":
        return Views()
    if name == "arith":
        return Arith()
    if name == "pools":
        return Pools()
    if name == "gates":
        return Gates()
    if name == "convnext":  # two stages of one block: the stem's and downsampling's LayerNorm2d, the blocks' layer scale
        from torchvision.models.convnext import CNBlockConfig, ConvNeXt
        return ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], stochastic_depth_prob=0.0, num_classes=10)
    if name == "bert0":  # with Hugging Face's token-type table (2 types, one segment)
        return bert_model(0.0, types=2)
    if name == "encoder":
        return TextEncoder()
    if name == "causal":
        return CausalEncoder()
    if name == "gpt":
        return Gpt()
    if name == "layoutlm":
        return layoutlm_model()
    if name == "vit":
        return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                                    mlp_dim=32, num_classes=10)
    return getattr(torchvision.models, name)(num_classes=10)


def tabular(opset):
    """A model for tabular records (12 features, 3 classes) as torch.nn builds it: Linear,
    LayerNorm, GELU, Dropout, Linear, GELU's tanh form, Linear. Opset 14 decomposes LayerNorm
    and both GELUs; opset 17 keeps LayerNormalization."""
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(32, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 3))


OPSET = 14  # export's default; `export MODEL DIR N OPSET` sets it


def export(model, path, x=None, names=("image",), opset=None):
    x = torch.randn(2, 3, 32, 32) if x is None else x
    opset = OPSET if opset is None else opset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Tracing in training mode runs a forward that moves the batch norms' statistics, and
        # the file holds them as they are after it: so does `model`.
        torch.onnx.export(model, x, path, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=opset, input_names=list(names),
                          output_names=["logits"], dynamic_axes={name: {0: "batch"} for name in names})


def bert_model(p=0.1, types=0):
    """hf_encoder.py's BERT-style classifier: 2 layers, hidden 32, 4 heads, 16 tokens, 3 classes,
    dropout p on the hidden states, a token-type table of `types` rows (one segment) or none."""
    return BertForSequenceClassification(vocab=100, tokens=16, hidden=32, layers=2, heads=4, inter=64, classes=3, p=p,
                                         types=types)


def layoutlm_model():
    """hf_encoder.py's LayoutLM classifier: 2 layers, hidden 32, 4 heads, 16 tokens, boxes in a
    24-coordinate page, 3 classes, no dropout; its token-type table's row 0 at every token."""
    return LayoutLMForSequenceClassification(vocab=100, tokens=16, coords=24, hidden=32, layers=2, heads=4, inter=64, classes=3)


def layoutlm(gen, n):
    """The LayoutLM classifier; N random pages of 4 to 16 words, padded, each word's box
    [x0, y0, x1, y1] inside the page (x1 >= x0, y1 >= y0)."""
    model = layoutlm_model()
    with torch.no_grad():
        randomize(model, gen)
    ids = torch.randint(0, 100, (n, 16), generator=gen)
    lengths = torch.randint(4, 17, (n, 1), generator=gen)
    mask = (torch.arange(16)[None, :] < lengths).long()
    x0, y0 = torch.randint(0, 16, (n, 16), generator=gen), torch.randint(0, 16, (n, 16), generator=gen)
    boxes = torch.stack((x0, y0, x0 + torch.randint(0, 8, (n, 16), generator=gen), y0 + torch.randint(0, 8, (n, 16), generator=gen)), -1)
    return model, ids, mask, boxes


def bert(gen, n, p=0.1, types=0):
    """A BERT-style classifier under Hugging Face's module names (bert_model()); N random texts
    of 4 to 16 tokens, padded."""
    model = bert_model(p, types)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.data.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.data.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
    ids = torch.randint(0, 100, (n, 16), generator=gen)
    lengths = torch.randint(4, 17, (n, 1), generator=gen)
    mask = (torch.arange(16)[None, :] < lengths).long()
    return model, ids, mask


def main():
    cmd = sys.argv[1]
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if cmd == "export":
        name, out, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        global OPSET
        OPSET = int(sys.argv[5]) if len(sys.argv) > 5 else OPSET
        import os
        os.makedirs(f"{out}/data", exist_ok=True)
        if name.startswith("tabular"):  # tabular14, tabular17: the opset
            model = tabular(int(name[len("tabular"):]))
            images = torch.randn(n, 12, generator=gen)
            labels = torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32)
            with torch.no_grad():
                for m in model.modules():
                    if isinstance(m, torch.nn.LayerNorm):
                        m.weight.data.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                        m.bias.data.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
            export(model, f"{out}/model.onnx", torch.randn(2, 12), ["record"], int(name[len("tabular"):]))
            inputs = {"record": images}
        elif name in ("encoder", "causal"):
            model = make(name)
            with torch.no_grad():
                randomize(model, gen)
            ids = torch.randint(0, 50, (n, 12), generator=gen)
            pad = torch.arange(12)[None, :] >= torch.randint(3, 13, (n, 1), generator=gen)  # 3 to 12 tokens kept
            export(model, f"{out}/model.onnx", (ids[:2], pad[:2]), ["ids", "pad"])
            labels = torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32)
            inputs = {"ids": ids, "pad": pad}  # pad saved as BOOL, as torch's safetensors would
            images = (ids, pad)
        elif name == "gpt":
            model = make(name)
            with torch.no_grad():
                randomize(model, gen)
            ids = torch.randint(0, 50, (n, 12), generator=gen)
            export(model, f"{out}/model.onnx", (ids[:2],), ["ids"])
            labels = torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32)
            inputs = {"ids": ids}
            images = (ids,)
        elif name == "layoutlm":
            model, ids, mask, boxes = layoutlm(gen, n)
            export(model, f"{out}/model.onnx", (ids[:2], mask[:2], boxes[:2]), ["input_ids", "attention_mask", "bbox"])
            labels = torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32)
            inputs = {"input_ids": ids, "attention_mask": mask, "bbox": boxes}
            images = (ids, mask, boxes)
        elif name in ("bert", "bert0"):  # bert0: no dropout, to train as torch does
            model, ids, mask = bert(gen, n, 0.1 if name == "bert" else 0.0, 0 if name == "bert" else 2)
            export(model, f"{out}/model.onnx", (ids[:2], mask[:2]), ["input_ids", "attention_mask"])
            labels = torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32)
            inputs = {"input_ids": ids, "attention_mask": mask}
            images = (ids, mask)
        elif name == "bert2":  # two segments: token_type_ids an input (the second from a random token on)
            model, ids, mask = bert(gen, n, 0.1, 2)
            types = (torch.arange(16)[None, :] >= torch.randint(1, 16, (n, 1), generator=gen)).long()
            export(model, f"{out}/model.onnx", (ids[:2], mask[:2], types[:2]), ["input_ids", "attention_mask", "token_type_ids"])
            labels = torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32)
            inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            images = (ids, mask, types)
        else:
            model = make(name)
            with torch.no_grad():
                randomize(model, gen)
            export(model, f"{out}/model.onnx")
            images = torch.randn(n, 3, 32, 32, generator=gen)
            labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int32)
            inputs = {"image": images.permute(0, 2, 3, 1).contiguous()}  # tandem's NHWC
        torch.save(model.state_dict(), f"{out}/torch.pt")
        for split in ("train", "test"):
            write_safetensors(f"{out}/data/{split}.safetensors", dict(inputs, labels=labels))
        # write_safetensors writes F32; the labels are read back as I32 below.
        fix_labels(f"{out}/data/test.safetensors")
        fix_labels(f"{out}/data/train.safetensors")
        model.eval()
        with torch.no_grad():
            model(*(images if isinstance(images, tuple) else (images,))).numpy().astype("float32").tofile(f"{out}/torch.f32")
    elif cmd == "train":
        name, out = sys.argv[2], sys.argv[3]
        epochs, batch, k, lr, seed = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8])
        model = make(name)
        model.load_state_dict(torch.load(f"{out}/torch.pt"))
        data = read_safetensors(f"{out}/data/train.safetensors")
        if name == "bert0":  # ids and mask, as tandem reads them (floats holding integers)
            inputs = (data["input_ids"][:batch].long(), data["attention_mask"][:batch].long())
        elif name in ("encoder", "causal"):
            inputs = (data["ids"][:batch].long(), data["pad"][:batch].bool())
        elif name == "gpt":
            inputs = (data["ids"][:batch].long(),)
        elif name == "layoutlm":
            inputs = tuple(data[k][:batch].long() for k in ("input_ids", "attention_mask", "bbox"))
        else:
            inputs = (data["image"][:batch].permute(0, 3, 1, 2).contiguous(),)  # tandem's NHWC -> torch's NCHW
        labels = data["labels"][:batch].long()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
        model.train()
        for epoch in range(epochs):
            order = torch.tensor(epoch_order(batch, seed, epoch + 1))  # the edge counts epochs from 1
            opt.zero_grad()
            for mb in order.chunk(k):
                loss = torch.nn.functional.cross_entropy(model(*(x[mb] for x in inputs)), labels[mb], reduction="sum") / batch
                loss.backward()
            opt.step()
        torch.save(model.state_dict(), f"{out}/torch-trained.pt")
    elif cmd == "weights":
        name, exported, out, tol = sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
        model = make(name)
        state = read_safetensors(exported)
        # A buffer import read as a constant (nanoGPT's causal `bias`) is not in tandem's export: torch's own, given back.
        buffers, saved = dict(model.named_buffers()), model.state_dict()  # (persistent buffers only are saved)
        constants = [k for k in buffers if k in saved and k not in state and not k.endswith("num_batches_tracked") and "running_" not in k]
        state.update({k: buffers[k] for k in constants})
        model.load_state_dict(state, strict=True)
        tandem, want, start = model.state_dict(), torch.load(f"{out}/torch-trained.pt"), torch.load(f"{out}/torch.pt")
        worst, moved = ("", 0.0), 0.0
        for key, value in want.items():
            if key.endswith("num_batches_tracked"):  # torch counts micro-batches, tandem steps
                continue
            d = float((tandem[key].float() - value.float()).abs().max())
            worst = max(worst, (key, d), key=lambda kv: kv[1])
            if key.endswith(".weight") or key.endswith(".bias"):  # trained, not running statistics
                moved = max(moved, float((value.float() - start[key].float()).abs().max()))
        print(f"tandem's trained weights against torch's: max difference {worst[1]:.3g} ({worst[0]}); "
              f"training moved the parameters by up to {moved:.3g}")
        sys.exit(0 if worst[1] <= tol and moved > 10 * tol else 1)
    elif cmd == "refused":
        export(Unsupported(), f"{sys.argv[2]}/model.onnx")
    else:
        sys.exit(f"unknown command {cmd}")


def fix_labels(path):
    """Rewrites the F32 'labels' of a safetensors file as I32 (what tandem's data sets hold)."""
    import json
    import struct
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = bytearray(blob[8 + n:])
    entry = header["labels"]
    a, b = entry["data_offsets"]
    values = struct.unpack(f"<{(b - a) // 4}f", data[a:b])
    data[a:b] = struct.pack(f"<{len(values)}i", *[int(v) for v in values])
    entry["dtype"] = "I32"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))


if __name__ == "__main__":
    main()
