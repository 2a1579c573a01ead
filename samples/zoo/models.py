"""The zoo's networks in plain PyTorch (no torchvision: there is no CPU build of it here).

Architectures follow the reference designs (torchvision ResNet/MobileNetV2, ViT-Tiny/16,
BERT-base, also in Hugging Face's layout with an attention mask, GPT-2 small, EinNet's InfoGAN
generator with ConvTranspose layers, CSRNet's dilated back-end); weights are random
with a fixed seed, since the zoo measures speed and numerical agreement, not accuracy.
"""
from __future__ import annotations

import math

import torch
from torch import nn


# ---------------------------------------------------------------------------- ResNet
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.down = _downsample(cin, width, stride)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.down(x) if self.down is not None else x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        out = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.down = _downsample(cin, out, stride)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (self.down(x) if self.down is not None else x))


def _downsample(cin: int, cout: int, stride: int):
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    def __init__(self, block, layers: list[int], classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2 ** i
            for j in range(n):
                blocks.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet18() -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3])


# ---------------------------------------------------------------------------- MobileNetV2
class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                   nn.ReLU6(), nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


# ---------------------------------------------------------------------------- transformers
class Attention(nn.Module):
    """Multi-head self-attention written out (q/k/v projections, reshape, softmax), as exporters
    of real models produce it."""

    def __init__(self, dim: int, heads: int, causal: bool = False, max_len: int = 0):
        super().__init__()
        self.heads, self.dh = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.causal = causal
        if causal:
            self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.dh)
        if self.causal:
            att = att.masked_fill(~self.mask[:n, :n], float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
        return self.proj(y)


class Block(nn.Module):
    """Pre-LN (ViT, GPT-2) or post-LN (BERT) transformer layer."""

    def __init__(self, dim: int, heads: int, mlp: int, pre_ln: bool, gelu: str = "none", causal=False, max_len=0):
        super().__init__()
        self.attn = Attention(dim, heads, causal, max_len)
        self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-6 if pre_ln else 1e-12), nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, mlp), nn.Linear(mlp, dim)
        self.act = nn.GELU(approximate=gelu)
        self.pre_ln = pre_ln

    def forward(self, x):
        if self.pre_ln:
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.fc2(self.act(self.fc1(x))))


class ViT(nn.Module):
    def __init__(self, dim=192, depth=12, heads=3, mlp=768, patch=16, image=224, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp, pre_ln=True) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class Bert(nn.Module):
    def __init__(self, vocab=30522, dim=768, depth=12, heads=12, mlp=3072, seq=128):
        super().__init__()
        self.tok, self.pos, self.typ = nn.Embedding(vocab, dim), nn.Embedding(512, dim), nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.Sequential(*[Block(dim, heads, mlp, pre_ln=False) for _ in range(depth)])
        self.register_buffer("positions", torch.arange(seq).unsqueeze(0))

    def forward(self, input_ids):
        x = self.tok(input_ids) + self.pos(self.positions) + self.typ(torch.zeros_like(input_ids))
        return self.layers(self.ln(x))


class HFSelfAttention(nn.Module):
    """BERT self-attention as Hugging Face writes it (BertSelfAttention + BertSelfOutput): separate
    query/key/value projections, an additive attention mask, post-LN residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.dh = heads, dim // heads
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)

    def transpose_for_scores(self, x):
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.dh).permute(0, 2, 1, 3)

    def forward(self, x, ext_mask):
        b, n, d = x.shape
        q, k, v = (self.transpose_for_scores(f(x)) for f in (self.query, self.key, self.value))
        att = q @ k.transpose(-1, -2) / math.sqrt(self.dh) + ext_mask
        y = (att.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, n, d)
        return self.ln(self.out(y) + x)


class HFBlock(nn.Module):
    """BertLayer: attention, then the feed-forward (Linear, GELU (erf), Linear), residual, LayerNorm."""

    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.attn = HFSelfAttention(dim, heads)
        self.fc1, self.fc2 = nn.Linear(dim, mlp), nn.Linear(mlp, dim)
        self.act = nn.GELU()
        self.ln = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x, ext_mask):
        x = self.attn(x, ext_mask)
        return self.ln(x + self.fc2(self.act(self.fc1(x))))


class BertHF(nn.Module):
    """BERT with Hugging Face's layout: separate Q/K/V, and an attention mask (1 = attend, 0 = pad)
    turned into an additive bias the way HF does."""

    def __init__(self, vocab=30522, dim=768, depth=12, heads=12, mlp=3072, seq=128):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(512, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList([HFBlock(dim, heads, mlp) for _ in range(depth)])
        self.register_buffer("positions", torch.arange(seq).unsqueeze(0))

    def forward(self, input_ids, attention_mask):
        ext = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        x = self.ln(self.tok(input_ids) + self.pos(self.positions))
        for layer in self.layers:
            x = layer(x, ext)
        return x


class GPT2(nn.Module):
    def __init__(self, vocab=50257, dim=768, depth=12, heads=12, seq=128):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(1024, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, 4 * dim, pre_ln=True, gelu="tanh", causal=True,
                                            max_len=seq) for _ in range(depth)])
        self.ln = nn.LayerNorm(dim)
        self.register_buffer("positions", torch.arange(seq).unsqueeze(0))

    def forward(self, input_ids):
        x = self.ln(self.blocks(self.tok(input_ids) + self.pos(self.positions)))
        return x @ self.tok.weight.t()                     # tied LM head


# ---------------------------------------------------------------------------- InfoGAN generator
class InfoGAN(nn.Module):
    """EinNet's InfoGAN generator (its repository: a [1, 228, 1, 1] code through five
    ConvTranspose layers, channels 448, 256, 128, 64, 3, kernel 2 then 4 with stride 2 and pad 1),
    BatchNorm + ReLU between them and Tanh last: the case for the `derive` pass."""

    def __init__(self, code: int = 228):
        super().__init__()
        layers, ch = [nn.ConvTranspose2d(code, 448, 2, 1, 0), nn.ReLU()], 448
        for out in (256, 128, 64):
            layers += [nn.ConvTranspose2d(ch, out, 4, 2, 1), nn.BatchNorm2d(out), nn.ReLU()]
            ch = out
        layers += [nn.ConvTranspose2d(ch, 3, 4, 2, 1), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        for m in self.modules():              # non-trivial running statistics, as after training
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)

    def forward(self, z):
        return self.net(z)


# ---------------------------------------------------------------------------- CSRNet back-end
class CSRNetBlock(nn.Module):
    """CSRNet's back-end (3x3 convs with dilation 2 and ReLU, then a 1x1 conv to one density
    map), narrowed to `width` channels: the dilated-conv case of EinNet's evaluation."""

    def __init__(self, width: int = 64):
        super().__init__()
        layers, ch = [], width
        for out in (width, width, width // 2):
            layers += [nn.Conv2d(ch, out, 3, padding=2, dilation=2), nn.ReLU()]
            ch = out
        layers.append(nn.Conv2d(ch, 1, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


# ---------------------------------------------------------------------------- speech tagger
class SpeechRNN(nn.Module):
    """A frame tagger over log-mel features: a bidirectional GRU, an LSTM and a per-frame linear
    head (recurrent layers as speech-quality and VAD models use them; one loop kernel per
    direction in the package, also on GPU targets)."""

    def __init__(self, features: int = 40, hidden: int = 64, classes: int = 8):
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True, bidirectional=True)
        self.lstm = nn.LSTM(2 * hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.lstm(self.gru(x)[0])[0])


def init_transformer(m: nn.Module) -> nn.Module:
    """GPT-2/BERT-style init (normal, std 0.02) so activations stay in a realistic range."""
    for p in m.modules():
        if isinstance(p, (nn.Linear, nn.Embedding)):
            nn.init.normal_(p.weight, std=0.02)
        if isinstance(p, nn.Linear) and p.bias is not None:
            nn.init.zeros_(p.bias)
    return m
