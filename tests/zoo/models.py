"""The zoo's models: small, plain ``torch.nn`` models of many families, each returning its loss.

Every builder runs with the default dtype its entry states (float64 unless
said otherwise) and seed 0; see ``registry`` for what a builder returns.
Sizes are tiny on purpose: the point is the graph's structure (every node
kind a real model of that family makes), not its size.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from zoo.registry import model


def _rand(*shape, requires_grad=False):
    return torch.randn(*shape, requires_grad=requires_grad)


# --------------------------------------------------------------------------------------------- vision

@model("cnn_classifier", "vision")
def cnn_classifier():
    """LeNet-style CNN: conv, batch norm, max pool, dropout (eval), linear, cross-entropy."""
    m = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                      nn.Dropout(0.2), nn.Linear(24, 5))
    return F.cross_entropy(m(_rand(3, 1, 10, 10)), torch.tensor([0, 3, 4])), m


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.down(x))


@model("resnet_block", "vision")
def resnet_block():
    """ResNet basic block with a strided 1x1 downsample shortcut, global pool, linear head."""
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), BasicBlock(4, 8, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 3))
    return F.cross_entropy(m(_rand(2, 3, 8, 8)), torch.tensor([1, 2])), m


class InvertedResidual(nn.Module):
    def __init__(self, c, expand):
        super().__init__()
        h = c * expand
        self.body = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
                                  nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
                                  nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.body(x)


@model("mobilenet_v2", "vision")
def mobilenet_v2():
    """MobileNetV2 inverted residual: expand 1x1, depthwise 3x3, project, ReLU6, residual."""
    m = nn.Sequential(nn.Conv2d(3, 4, 3, 2, 1), nn.BatchNorm2d(4), nn.ReLU6(), InvertedResidual(4, 3),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    return F.cross_entropy(m(_rand(2, 3, 8, 8)), torch.tensor([0, 1])), m


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU())
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        # 4 (skip) + 4 (up) + 1 (a constant channel: coordinates, not learned)
        self.dec = nn.Sequential(nn.Conv2d(9, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), nn.Conv2d(4, 1, 1))

    def forward(self, x):
        s = self.enc1(x)
        h = self.enc2(F.max_pool2d(s, 2))
        u = self.up(h)
        coord = torch.linspace(-1, 1, x.shape[-1]).expand(x.shape[0], 1, x.shape[-2], x.shape[-1])
        return self.dec(torch.cat([s, u, coord], dim=1))


@model("unet", "vision")
def unet():
    """U-Net: encoder, max pool, transposed-conv decoder, skip concat with a constant channel, BCE."""
    m = UNet()
    x = _rand(2, 2, 8, 8)
    target = (torch.rand(2, 1, 8, 8) > 0.5).to(x.dtype)
    return F.binary_cross_entropy_with_logits(m(x), target), m


class ViT(nn.Module):
    def __init__(self, d=8, patch=4, img=8, classes=3):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        n = (img // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        self.enc = nn.TransformerEncoderLayer(d, 2, 16, dropout=0.0, batch_first=True, norm_first=True,
                                              activation="gelu")
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(self.enc(t))[:, 0])


@model("vit", "vision")
def vit():
    """ViT: patch embedding (strided conv), class token, position embedding, pre-norm encoder layer."""
    m = ViT()
    return F.cross_entropy(m(_rand(2, 3, 8, 8)), torch.tensor([2, 0]), label_smoothing=0.1), m


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        h = self.norm(self.dw(x).permute(0, 2, 3, 1))
        h = self.gamma * self.pw2(F.gelu(self.pw1(h)))
        return x + h.permute(0, 3, 1, 2)


@model("convnext_block", "vision")
def convnext_block():
    """ConvNeXt block: depthwise 7x7, channels-last LayerNorm, inverted MLP, layer scale."""
    m = ConvNeXtBlock(4)
    return m(_rand(2, 4, 6, 6)).pow(2).mean(), m


@model("squeeze_excite", "vision")
def squeeze_excite():
    """EfficientNet-style MBConv with squeeze-and-excitation, SiLU, hard-sigmoid gate, drop-path off."""
    c = 6

    class SE(nn.Module):
        def __init__(self):
            super().__init__()
            self.f1, self.f2 = nn.Conv2d(c, 2, 1), nn.Conv2d(2, c, 1)

        def forward(self, x):
            return x * torch.sigmoid(self.f2(F.silu(self.f1(x.mean((2, 3), keepdim=True)))))
    m = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.SiLU(),
                      nn.Conv2d(c, c, 3, padding=1, groups=c), SE(), nn.Conv2d(c, 2, 1))
    return F.mse_loss(m(_rand(2, 3, 6, 6)), torch.zeros(2, 2, 6, 6)), m


@model("densenet_block", "vision")
def densenet_block():
    """DenseNet: every layer sees the concatenation of all earlier feature maps, then a transition."""
    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                nn.Sequential(nn.BatchNorm2d(2 + 2 * i), nn.ReLU(), nn.Conv2d(2 + 2 * i, 2, 3, padding=1))
                for i in range(3))
            self.trans = nn.Sequential(nn.BatchNorm2d(8), nn.Conv2d(8, 4, 1), nn.AvgPool2d(2))

        def forward(self, x):
            feats = [x]
            for layer in self.layers:
                feats.append(layer(torch.cat(feats, 1)))
            return self.trans(torch.cat(feats, 1))
    m = Dense()
    return m(_rand(2, 2, 6, 6)).abs().sum(), m


@model("style_transfer", "vision")
def style_transfer():
    """Style-transfer net: reflection pad, instance norm, nearest upsampling, a Gram-matrix style loss."""
    m = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4, affine=True), nn.ReLU(),
                      nn.Upsample(scale_factor=2), nn.Conv2d(4, 3, 3, padding=1), nn.Tanh())
    y = m(_rand(1, 3, 5, 5)).flatten(2)
    gram = y @ y.transpose(1, 2) / y.shape[-1]
    return (gram - torch.eye(3)).pow(2).sum() + 0.1 * y.pow(2).mean(), m


@model("detection_head", "vision")
def detection_head():
    """FPN-style detector head: lateral 1x1 convs, bilinear top-down upsampling, focal + smooth-L1 losses."""
    lat1, lat2 = nn.Conv2d(4, 4, 1), nn.Conv2d(6, 4, 1)
    head = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), nn.Conv2d(4, 5, 1))
    c1, c2 = _rand(2, 4, 8, 8), _rand(2, 6, 4, 4)
    p = lat1(c1) + F.interpolate(lat2(c2), scale_factor=2, mode="bilinear", align_corners=False)
    out = head(p)
    cls, box = out[:, :3], out[:, 3:]
    t = (torch.rand(2, 3, 8, 8) > 0.8).to(out.dtype)
    focal = torchvision_free_focal(cls, t)
    return focal + F.smooth_l1_loss(box, torch.zeros_like(box), beta=0.1), lat1, lat2, head


def torchvision_free_focal(logits, t, alpha=0.25, gamma=2.0):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, t, reduction="none")
    pt = p * t + (1 - p) * (1 - t)
    return ((alpha * t + (1 - alpha) * (1 - t)) * ce * (1 - pt) ** gamma).sum() / 4


# ------------------------------------------------------------------------------------------- language

@model("lstm_classifier", "language")
def lstm_classifier():
    """Embedding (padding index), 2-layer LSTM, last hidden state, linear, cross-entropy."""
    emb, rnn, fc = nn.Embedding(20, 6, padding_idx=0), nn.LSTM(6, 8, num_layers=2, batch_first=True), nn.Linear(8, 3)
    tokens = torch.tensor([[1, 5, 7, 0], [3, 3, 9, 2]])
    _, (h, _) = rnn(emb(tokens))
    return F.cross_entropy(fc(h[-1]), torch.tensor([0, 2])), emb, rnn, fc


@model("gru_seq2seq", "language")
def gru_seq2seq():
    """GRU encoder-decoder with teacher forcing and Luong dot attention over the encoder states."""
    emb, enc, dec = nn.Embedding(12, 6), nn.GRU(6, 8, batch_first=True), nn.GRUCell(6 + 8, 8)
    out = nn.Linear(16, 12)
    src, tgt = torch.tensor([[1, 4, 6, 2]]), torch.tensor([[3, 5, 7]])
    states, h = enc(emb(src))
    h, ctx, loss = h[0], torch.zeros(1, 8), 0
    for t in range(tgt.shape[1] - 1):
        h = dec(torch.cat([emb(tgt[:, t]), ctx], -1), h)
        att = torch.softmax((states @ h.unsqueeze(-1)).squeeze(-1), -1)
        ctx = (att.unsqueeze(-1) * states).sum(1)
        loss = loss + F.cross_entropy(out(torch.cat([h, ctx], -1)), tgt[:, t + 1])
    return loss, emb, enc, dec, out


@model("bilstm_tagger", "language")
def bilstm_tagger():
    """Bidirectional LSTM tagger over packed variable-length sequences, log-softmax, masked NLL."""
    emb, rnn, fc = nn.Embedding(10, 4), nn.LSTM(4, 5, batch_first=True, bidirectional=True), nn.Linear(10, 3)
    tokens, lengths = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]), torch.tensor([4, 2])
    packed = nn.utils.rnn.pack_padded_sequence(emb(tokens), lengths, batch_first=True)
    out, _ = rnn(packed)
    out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
    logp = fc(out).log_softmax(-1)
    tags = torch.tensor([[0, 1, 2, 1], [2, 0, -100, -100]])
    return F.nll_loss(logp.reshape(-1, 3), tags.reshape(-1), ignore_index=-100), emb, rnn, fc


@model("char_cnn", "language")
def char_cnn():
    """Character CNN text classifier: embedding, Conv1d of several widths, max over time, highway-free head."""
    emb = nn.Embedding(16, 4)
    convs = nn.ModuleList(nn.Conv1d(4, 3, k) for k in (2, 3))
    fc = nn.Linear(6, 2)
    x = emb(torch.tensor([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]])).transpose(1, 2)
    feats = torch.cat([F.relu(c(x)).max(dim=2).values for c in convs], 1)
    return F.cross_entropy(fc(feats), torch.tensor([0, 1])), emb, convs, fc


@model("transformer_encoder", "language")
def transformer_encoder():
    """nn.TransformerEncoder (2 post-norm layers, ReLU) with a key padding mask, mean-pooled classifier."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    fc = nn.Linear(8, 2)
    pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    h = enc(_rand(2, 4, 8), src_key_padding_mask=pad)
    return F.cross_entropy(fc(h.mean(1)), torch.tensor([1, 0])), enc, fc


@model("transformer_decoder", "language")
def transformer_decoder():
    """nn.TransformerDecoderLayer: causal self-attention, cross-attention to a memory, feed-forward."""
    dec = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    mem = _rand(2, 5, 8, requires_grad=True)
    mask = nn.Transformer.generate_square_subsequent_mask(3)
    out = dec(_rand(2, 3, 8), mem, tgt_mask=mask, tgt_is_causal=True)
    return out.pow(2).mean(), dec, {"memory": mem}


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.h = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, d))


class GPT(nn.Module):
    def __init__(self, vocab=16, d=8, seq=5):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), CausalSelfAttention(d, 2, seq), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # weight tying

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.head(self.lnf(x))


@model("gpt_block", "language")
def gpt_block():
    """GPT-2 block: causal masked attention, tanh GELU MLP, tied input/output embedding, next-token loss."""
    m = GPT()
    idx = torch.tensor([[1, 4, 9, 2, 7], [3, 3, 0, 15, 8]])
    logits = m(idx)
    return F.cross_entropy(logits[:, :-1].reshape(-1, 16), idx[:, 1:].reshape(-1)), m


@model("gpt_sdpa", "language")
def gpt_sdpa():
    """Causal attention through F.scaled_dot_product_attention(is_causal=True) (the math kernel on CPU)."""
    qkv, proj = nn.Linear(8, 24), nn.Linear(8, 8)
    x = _rand(2, 4, 8)
    q, k, v = (z.view(2, 4, 2, 4).transpose(1, 2) for z in qkv(x).split(8, -1))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return proj(y.transpose(1, 2).reshape(2, 4, 8)).pow(2).sum(), qkv, proj


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d=8, heads=2, hidden=12):
        super().__init__()
        self.h = heads
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up, self.down = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False), \
            nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.h
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2) / hd))
        ang = torch.outer(torch.arange(t, dtype=inv.dtype), inv)
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        h = self.n1(x)
        q, k, v = (f(h).view(b, t, self.h, hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@model("llama_block", "language")
def llama_block():
    """LLaMA block: RMSNorm, rotary position embedding (rotate-half), causal SDPA, SwiGLU MLP."""
    m = LlamaBlock()
    return m(_rand(2, 4, 8)).pow(2).mean(), m


class MoE(nn.Module):
    def __init__(self, d=6, experts=4, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, 8) * 0.3)
        self.w2 = nn.Parameter(torch.randn(experts, 8, d) * 0.3)

    def forward(self, x):
        logits = self.router(x)
        weights, idx = torch.topk(logits.softmax(-1), self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for slot in range(self.k):
            e = idx[:, slot]
            h = F.gelu(torch.bmm(x.unsqueeze(1), self.w1[e]))
            y = torch.bmm(h, self.w2[e]).squeeze(1) * weights[:, slot:slot + 1]
            out = out.index_add(0, torch.arange(x.shape[0]), y)
        # load-balancing auxiliary loss: fraction of tokens per expert times mean router probability
        probs = logits.softmax(-1)
        counts = torch.zeros(probs.shape[1]).scatter_add(0, idx.reshape(-1), torch.ones(idx.numel()))
        aux = (counts / idx.numel() * probs.mean(0)).sum() * probs.shape[1]
        return out, aux


@model("moe_routing", "language")
def moe_routing():
    """Mixture of experts: softmax router, top-k, expert weights gathered by index, index_add combine,
    load-balancing loss with scatter_add."""
    m = MoE()
    x = _rand(5, 6, requires_grad=True)
    out, aux = m(x)
    return out.pow(2).sum() + 0.01 * aux, m, {"x": x}


@model("multihead_attention", "language")
def multihead_attention():
    """nn.MultiheadAttention cross-attention (different key/value sizes), attention weights averaged."""
    mha = nn.MultiheadAttention(8, 2, kdim=6, vdim=5, batch_first=True)
    q, k, v = _rand(2, 3, 8, requires_grad=True), _rand(2, 4, 6), _rand(2, 4, 5)
    out, w = mha(q, k, v, need_weights=True)
    return out.sum() + w.pow(2).sum(), mha, {"q": q}


# --------------------------------------------------------------------------------------------- speech

@model("speech_ctc", "speech")
def speech_ctc():
    """wav2vec-style conv feature encoder (GroupNorm, GELU), linear to characters, CTC loss."""
    enc = nn.Sequential(nn.Conv1d(1, 6, 10, 5), nn.GroupNorm(6, 6), nn.GELU(), nn.Conv1d(6, 6, 3, 2), nn.GELU())
    fc = nn.Linear(6, 5)
    wav = _rand(2, 1, 80, requires_grad=True)
    logp = fc(enc(wav).transpose(1, 2)).log_softmax(-1).transpose(0, 1)
    t = logp.shape[0]
    return F.ctc_loss(logp, torch.tensor([[1, 2, 2], [3, 4, 0]]), (t, t - 1), (3, 2), zero_infinity=True), \
        enc, fc, {"wav": wav}


@model("spectrogram", "speech")
def spectrogram():
    """Log-magnitude STFT spectrogram (Hann window) of a learned front end, 2-D conv, GRU classifier."""
    front = nn.Conv1d(1, 1, 5, padding=2)
    conv, rnn, fc = nn.Conv2d(1, 2, 3, padding=1), nn.GRU(2 * 9, 4, batch_first=True), nn.Linear(4, 2)
    wav = front(_rand(2, 1, 64)).squeeze(1)
    spec = torch.stft(wav, n_fft=16, hop_length=8, window=torch.hann_window(16), return_complex=True)
    mag = torch.log(spec.abs() ** 2 + 1e-6).unsqueeze(1)          # (b, 1, freq, time)
    h = F.relu(conv(mag)).permute(0, 3, 1, 2).flatten(2)          # (b, time, 2 * freq)
    _, hn = rnn(h)
    return F.cross_entropy(fc(hn[0]), torch.tensor([1, 0])), front, conv, rnn, fc


@model("wavenet", "speech")
def wavenet():
    """WaveNet: causal dilated convolutions (left padding), gated tanh * sigmoid units, residual and skip sums."""
    class Layer(nn.Module):
        def __init__(self, dil):
            super().__init__()
            self.dil = dil
            self.conv, self.res, self.skip = nn.Conv1d(4, 8, 2, dilation=dil), nn.Conv1d(4, 4, 1), nn.Conv1d(4, 4, 1)

        def forward(self, x):
            a, b = self.conv(F.pad(x, (self.dil, 0))).chunk(2, 1)
            z = torch.tanh(a) * torch.sigmoid(b)
            return x + self.res(z), self.skip(z)
    inp, layers, out = nn.Conv1d(1, 4, 1), nn.ModuleList(Layer(d) for d in (1, 2, 4)), nn.Conv1d(4, 3, 1)
    x = inp(_rand(1, 1, 12))
    skips = 0
    for layer in layers:
        x, s = layer(x)
        skips = skips + s
    logits = out(F.relu(skips))
    return F.cross_entropy(logits, torch.randint(0, 3, (1, 12))), inp, layers, out


# ------------------------------------------------------------------------------------------------- RL

@model("ppo_actor_critic", "rl")
def ppo_actor_critic():
    """PPO: shared torso, categorical policy and value heads, clipped surrogate, value loss, entropy bonus."""
    torso, pi, v = nn.Sequential(nn.Linear(4, 16), nn.Tanh()), nn.Linear(16, 3), nn.Linear(16, 1)
    obs = _rand(6, 4)
    h = torso(obs)
    dist = torch.distributions.Categorical(logits=pi(h))
    actions = torch.tensor([0, 1, 2, 1, 0, 2])
    old_logp = dist.log_prob(actions).detach() + 0.05 * torch.randn(6)
    ratio = (dist.log_prob(actions) - old_logp).exp()
    adv = torch.randn(6)
    surrogate = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
    value = F.mse_loss(v(h).squeeze(-1), torch.randn(6))
    return surrogate + 0.5 * value - 0.01 * dist.entropy().mean(), torso, pi, v


@model("dqn", "rl")
def dqn():
    """DQN: Q-values gathered at the taken actions, a target network's max (detached), Huber loss."""
    q, target = nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Linear(12, 3)), \
        nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Linear(12, 3))
    obs, nxt = _rand(5, 4), _rand(5, 4)
    a = torch.tensor([[0], [2], [1], [1], [0]])
    qa = q(obs).gather(1, a).squeeze(1)
    with torch.no_grad():
        y = torch.randn(5) + 0.99 * target(nxt).max(1).values
    return F.smooth_l1_loss(qa, y), q


@model("sac_policy", "rl")
def sac_policy():
    """SAC: Gaussian policy with rsample, tanh squashing and its log-det correction, twin Q critics."""
    pol = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4))
    q1, q2 = nn.Linear(5, 1), nn.Linear(5, 1)
    obs = _rand(4, 3)
    mu, log_std = pol(obs).chunk(2, -1)
    std = log_std.clamp(-5, 2).exp()
    u = torch.distributions.Normal(mu, std).rsample()
    a = torch.tanh(u)
    logp = torch.distributions.Normal(mu, std).log_prob(u).sum(-1) - torch.log(1 - a.pow(2) + 1e-6).sum(-1)
    sa = torch.cat([obs, a], -1)
    return (0.2 * logp - torch.min(q1(sa), q2(sa)).squeeze(-1)).mean(), pol, q1, q2


# ------------------------------------------------------------------------------------------ generative

@model("vae", "generative")
def vae():
    """VAE: encoder to mean and log-variance, reparameterisation, Bernoulli decoder, KL term."""
    enc, dec = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6)), \
        nn.Sequential(nn.Linear(3, 12), nn.ReLU(), nn.Linear(12, 8))
    x = torch.rand(4, 8)
    mu, logvar = enc(x).chunk(2, -1)
    z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
    recon = F.binary_cross_entropy_with_logits(dec(z), x, reduction="sum")
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (recon + kl) / 4, enc, dec


@model("wgan_gp", "generative")
def wgan_gp():
    """WGAN-GP: generator and critic, gradient penalty through autograd.grad(create_graph=True)."""
    gen = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 6), nn.Tanh())
    critic = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    real, fake = _rand(3, 6), gen(_rand(3, 4))
    a = torch.rand(3, 1)
    interp = a * real + (1 - a) * fake
    g = torch.autograd.grad(critic(interp).sum(), interp, create_graph=True)[0]
    gp = ((g.norm(2, dim=1) - 1) ** 2).mean()
    return critic(fake).mean() - critic(real).mean() + 10 * gp, gen, critic


@model("dcgan", "generative")
def dcgan():
    """DCGAN: transposed-conv generator with batch norm, conv discriminator, non-saturating BCE."""
    g = nn.Sequential(nn.ConvTranspose2d(4, 6, 4, 1, 0, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                      nn.ConvTranspose2d(6, 1, 4, 2, 1, bias=False), nn.Tanh())
    d = nn.Sequential(nn.Conv2d(1, 4, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(4, 1, 4, 1, 0), nn.Flatten())
    return F.binary_cross_entropy_with_logits(d(g(_rand(2, 4, 1, 1))), torch.ones(2, 1)), g, d


@model("realnvp", "generative")
def realnvp():
    """RealNVP affine coupling flow: masked scale/shift nets, tanh-bounded scales, log-determinant."""
    class Coupling(nn.Module):
        def __init__(self, mask):
            super().__init__()
            self.register_buffer("mask", mask)
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))

        def forward(self, x):
            s, t = self.net(x * self.mask).chunk(2, -1)
            s = torch.tanh(s) * (1 - self.mask)
            return x * self.mask + (1 - self.mask) * (x * s.exp() + t), s.sum(-1)
    layers = nn.ModuleList(Coupling(torch.tensor([1.0, 0, 1, 0]) if i % 2 == 0 else torch.tensor([0.0, 1, 0, 1]))
                           for i in range(2))
    x, logdet = _rand(5, 4), 0
    for layer in layers:
        x, ld = layer(x)
        logdet = logdet + ld
    prior = -0.5 * (x ** 2).sum(-1) - 2 * math.log(2 * math.pi)
    return -(prior + logdet).mean(), layers


@model("diffusion_unet", "generative")
def diffusion_unet():
    """Diffusion denoiser: sinusoidal time embedding, MLP, GroupNorm + SiLU residual conv block, noise MSE."""
    tmlp = nn.Sequential(nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 4))
    conv1, conv2, norm1, norm2 = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(4, 2, 3, padding=1), \
        nn.GroupNorm(2, 2), nn.GroupNorm(2, 4)
    x0, noise = _rand(2, 2, 6, 6), _rand(2, 2, 6, 6)
    t = torch.tensor([3.0, 40.0])
    abar = torch.cos(t / 100 * math.pi / 2) ** 2
    xt = abar.sqrt().view(-1, 1, 1, 1) * x0 + (1 - abar).sqrt().view(-1, 1, 1, 1) * noise
    freqs = torch.exp(-math.log(1000) * torch.arange(4) / 4)
    temb = tmlp(torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], -1))
    h = conv1(F.silu(norm1(xt))) + temb[:, :, None, None]
    eps = xt + conv2(F.silu(norm2(h)))
    return F.mse_loss(eps, noise), tmlp, conv1, conv2, norm1, norm2


# ---------------------------------------------------------------------------------------------- graphs

@model("gcn", "graph")
def gcn():
    """GCN: symmetric-normalised message passing with index_add over an edge list, two layers, node CE."""
    src = torch.tensor([0, 1, 1, 2, 3, 4, 4, 0])
    dst = torch.tensor([1, 0, 2, 1, 4, 3, 0, 4])
    n = 5
    deg = torch.zeros(n).index_add(0, dst, torch.ones(len(dst))) + 1
    norm = (deg[src] * deg[dst]).rsqrt()
    l1, l2 = nn.Linear(3, 6), nn.Linear(6, 2)

    def prop(h):
        msg = h[src] * norm[:, None]
        return torch.zeros_like(h).index_add(0, dst, msg) + h / deg[:, None]
    x = _rand(n, 3)
    out = prop(l2(F.relu(prop(l1(x)))))
    return F.cross_entropy(out, torch.tensor([0, 1, 1, 0, 1])), l1, l2


@model("gat", "graph")
def gat():
    """GAT: attention logits per edge, a softmax over each node's incoming edges (scatter_reduce amax,
    scatter_add), weighted messages aggregated with scatter_add."""
    src = torch.tensor([0, 1, 2, 3, 1, 2, 3, 0, 0])
    dst = torch.tensor([1, 2, 3, 0, 0, 1, 2, 3, 0])
    n = 4
    lin = nn.Linear(3, 4, bias=False)
    a_src, a_dst = nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(4))
    h = lin(_rand(n, 3))
    e = F.leaky_relu((h[src] * a_src).sum(-1) + (h[dst] * a_dst).sum(-1), 0.2)
    emax = torch.full((n,), -1e9).scatter_reduce(0, dst, e, reduce="amax", include_self=True)
    w = (e - emax[dst]).exp()
    denom = torch.zeros(n).scatter_add(0, dst, w)
    alpha = w / denom[dst]
    out = torch.zeros(n, 4).scatter_add(0, dst[:, None].expand(-1, 4), alpha[:, None] * h[src])
    return F.elu(out).pow(2).sum(), lin, {"a_src": a_src, "a_dst": a_dst}


# ------------------------------------------------------------------------------------------ and more

@model("dlrm", "recommendation")
def dlrm():
    """DLRM: EmbeddingBag (sum) sparse features, bottom MLP, pairwise dot interactions (bmm, triu), top MLP."""
    bags = nn.ModuleList(nn.EmbeddingBag(10, 4, mode="sum") for _ in range(2))
    bottom, top = nn.Sequential(nn.Linear(3, 4), nn.ReLU()), nn.Sequential(nn.Linear(4 + 3, 4), nn.ReLU(),
                                                                            nn.Linear(4, 1))
    dense = _rand(2, 3)
    idx, off = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2])
    feats = torch.stack([bottom(dense)] + [b(idx, off) for b in bags], 1)        # (b, 3, 4)
    inter = torch.bmm(feats, feats.transpose(1, 2))
    iu = torch.triu_indices(3, 3, offset=1)
    z = torch.cat([feats[:, 0], inter[:, iu[0], iu[1]]], 1)
    return F.binary_cross_entropy_with_logits(top(z).squeeze(1), torch.tensor([1.0, 0.0])), bags, bottom, top


@model("pointnet", "3d")
def pointnet():
    """PointNet: shared per-point MLP (Conv1d 1x1), symmetric max pooling over points, classifier."""
    feat = nn.Sequential(nn.Conv1d(3, 8, 1), nn.BatchNorm1d(8), nn.ReLU(), nn.Conv1d(8, 16, 1))
    head = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    pts = _rand(2, 3, 10)
    g = feat(pts).max(dim=2)[0]
    return F.cross_entropy(head(g), torch.tensor([3, 1])), feat, head


@model("siamese_contrastive", "metric")
def siamese_contrastive():
    """SimCLR-style contrastive learning: shared encoder, L2-normalised projections, InfoNCE, plus a triplet loss."""
    enc = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    a, b = _rand(4, 6), _rand(4, 6)
    za, zb = F.normalize(enc(a), dim=1), F.normalize(enc(b), dim=1)
    logits = za @ zb.t() / 0.5
    nce = F.cross_entropy(logits, torch.arange(4))
    trip = F.triplet_margin_loss(za, zb, zb.roll(1, 0), margin=0.5)
    return nce + trip + F.cosine_embedding_loss(za, zb, torch.ones(4)), enc


@model("mixture_density", "probabilistic")
def mixture_density():
    """Mixture density network: mixture weights (log-softmax), means, scales; logsumexp negative log-likelihood."""
    net = nn.Sequential(nn.Linear(2, 10), nn.Tanh(), nn.Linear(10, 9))
    x, y = _rand(6, 2), _rand(6, 1)
    logit, mu, log_s = net(x).split(3, -1)
    comp = -0.5 * ((y - mu) / log_s.exp()) ** 2 - log_s - 0.5 * math.log(2 * math.pi)
    return -torch.logsumexp(F.log_softmax(logit, -1) + comp, -1).mean(), net


@model("neural_ode", "scientific")
def neural_ode():
    """Neural ODE integrated with fixed-step RK4: one MLP evaluated many times (shared weights, long chains)."""
    f = nn.Sequential(nn.Linear(3, 8), nn.Softplus(), nn.Linear(8, 3))
    y, h = _rand(4, 3, requires_grad=True), 0.25
    y0 = y
    for _ in range(3):
        k1 = f(y)
        k2 = f(y + h / 2 * k1)
        k3 = f(y + h / 2 * k2)
        k4 = f(y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y.pow(2).sum(), f, {"y0": y0}


@model("pinn", "scientific")
def pinn():
    """Physics-informed net: the PDE residual u_xx + u from second derivatives (grad of grad, create_graph)."""
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.linspace(0, 1, 5).unsqueeze(1).requires_grad_(True)
    u = net(x)
    ux = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
    uxx = torch.autograd.grad(ux.sum(), x, create_graph=True)[0]
    return (uxx + u).pow(2).mean() + (net(torch.zeros(1, 1)) - 1).pow(2).sum(), net


@model("tcn_forecaster", "time-series")
def tcn_forecaster():
    """Temporal convolution forecaster with weight-normalised convs and a Gaussian NLL head."""
    conv1 = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 4, 3, padding=2, dilation=1))
    conv2 = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=4, dilation=2))
    head = nn.Linear(4, 2)
    x = _rand(2, 2, 8)
    h = F.relu(conv1(x)[..., :-2])
    h = F.relu(conv2(h)[..., :-4]) + h
    mu, log_var = head(h[..., -1]).unbind(-1)
    return F.gaussian_nll_loss(mu, torch.randn(2), log_var.exp()), conv1, conv2, head


@model("perceiver", "multimodal")
def perceiver():
    """Perceiver: learned latents cross-attend to inputs (nn.MultiheadAttention), then self-attend, pooled."""
    latents = nn.Parameter(torch.randn(3, 8) * 0.1)
    cross, self_attn = nn.MultiheadAttention(8, 2, batch_first=True), nn.MultiheadAttention(8, 2, batch_first=True)
    norm, head = nn.LayerNorm(8), nn.Linear(8, 2)
    x = _rand(2, 6, 8)
    lat = latents.expand(2, -1, -1)
    lat = lat + cross(lat, x, x, need_weights=False)[0]
    h = norm(lat)
    lat = lat + self_attn(h, h, h, need_weights=False)[0]
    return F.cross_entropy(head(lat.mean(1)), torch.tensor([0, 1])), cross, self_attn, norm, head, \
        {"latents": latents}


@model("autoencoder_tied", "generative")
def autoencoder_tied():
    """Denoising autoencoder with tied weights (decoder uses the encoder's transpose), sparsity penalty."""
    w = nn.Parameter(torch.randn(4, 8) * 0.3)
    b1, b2 = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(8))
    x = torch.rand(5, 8)
    noisy = x * (torch.rand(5, 8) > 0.2)
    h = torch.sigmoid(F.linear(noisy, w, b1))
    recon = torch.sigmoid(F.linear(h, w.t(), b2))
    return F.binary_cross_entropy(recon, x) + 1e-2 * h.abs().sum(), {"w": w, "b1": b1, "b2": b2}


@model("float32_mlp_mixer", "vision", dtype=torch.float32)
def mlp_mixer():
    """MLP-Mixer in float32: token-mixing and channel-mixing MLPs with LayerNorm, transposes."""
    class Mixer(nn.Module):
        def __init__(self, tokens, d):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.tok = nn.Sequential(nn.Linear(tokens, 8), nn.GELU(), nn.Linear(8, tokens))
            self.ch = nn.Sequential(nn.Linear(d, 8), nn.GELU(), nn.Linear(8, d))

        def forward(self, x):
            x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
            return x + self.ch(self.n2(x))
    stem, mix, head = nn.Conv2d(3, 6, 2, 2), Mixer(9, 6), nn.Linear(6, 3)
    x = stem(_rand(2, 3, 6, 6)).flatten(2).transpose(1, 2)
    return F.cross_entropy(head(mix(x).mean(1)), torch.tensor([0, 2])), stem, mix, head


@model("float32_transformer", "language", dtype=torch.float32)
def float32_transformer():
    """A float32 nn.Transformer (encoder and decoder, one layer each), as models are trained."""
    tr = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)
    emb, out = nn.Embedding(10, 8), nn.Linear(8, 10)
    src, tgt = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6, 7]])
    h = tr(emb(src), emb(tgt), tgt_mask=nn.Transformer.generate_square_subsequent_mask(3))
    return F.cross_entropy(out(h).reshape(-1, 10), torch.tensor([6, 7, 8])), tr, emb, out


@model("float32_bilstm_tagger", "language", dtype=torch.float32)
def float32_bilstm_tagger():
    """A float32 2-layer bidirectional LSTM tagger, batch first, with a learned initial state: on the CPU
    PyTorch runs it through oneDNN (MkldnnRnnLayerBackward0, one node per layer and direction)."""
    emb, rnn, fc = nn.Embedding(12, 6), nn.LSTM(6, 5, num_layers=2, batch_first=True, bidirectional=True), nn.Linear(10, 4)
    h0, c0 = nn.Parameter(torch.randn(4, 1, 5) * 0.1), nn.Parameter(torch.randn(4, 1, 5) * 0.1)
    tokens = torch.tensor([[1, 5, 7, 2, 3], [3, 3, 9, 2, 11]])
    out, _ = rnn(emb(tokens), (h0.expand(4, 2, 5).contiguous(), c0.expand(4, 2, 5).contiguous()))
    loss = F.cross_entropy(fc(out).reshape(-1, 4), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1]))
    holder = nn.ParameterList([h0, c0])
    return loss, emb, rnn, fc, holder


# ------------------------------------------------------------------------- in-place, training-mode, misc

@model("inplace_resnet_train", "vision")
def inplace_resnet_train():
    """Training-mode details: ReLU(inplace), in-place residual add, dropout in train mode (a saved mask),
    slice assignment into a buffer (CopySlices), masked_fill_."""
    c1, bn, c2 = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, padding=1)
    fc = nn.Linear(4, 3)
    x = _rand(2, 2, 5, 5)
    h = F.relu(bn(c1(x)), inplace=True)
    r = c2(h)
    r += h
    r = F.dropout(r, 0.3, training=True)
    feats = torch.zeros(2, 4)
    feats[:, :] = r.mean((2, 3))
    feats[:, 1] *= 2
    logits = fc(feats).masked_fill_(torch.tensor([[False, True, False], [False, False, False]]), -5.0)
    return F.cross_entropy(logits, torch.tensor([0, 2])), c1, bn, c2, fc


@model("spatial_transformer", "vision")
def spatial_transformer():
    """Spatial transformer: a localisation net predicts an affine grid (affine_grid), grid_sample, classifier."""
    loc = nn.Sequential(nn.Flatten(), nn.Linear(36, 6))
    cls = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 2))
    x = _rand(2, 1, 6, 6)
    theta = loc(x).view(-1, 2, 3) + torch.tensor([[1.0, 0, 0], [0, 1, 0]])
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.cross_entropy(cls(F.grid_sample(x, grid, align_corners=False)), torch.tensor([1, 0])), loc, cls


@model("unfold_attention", "vision")
def unfold_attention():
    """Local attention by unfold (im2col) and fold back, einsum scores, circular and replicate padding."""
    q, kv = nn.Conv2d(2, 2, 1), nn.Conv2d(2, 4, 1)
    x = _rand(1, 2, 4, 4)
    qs = q(x).flatten(2)                                             # (1, 2, 16)
    k, v = kv(F.pad(x, (1, 1, 1, 1), mode="circular")).chunk(2, 1)
    kp = F.unfold(k, 3).view(1, 2, 9, 16)
    vp = F.unfold(F.pad(v[..., 1:-1, 1:-1], (1, 1, 1, 1), mode="replicate"), 3).view(1, 2, 9, 16)
    att = torch.einsum("bcl,bckl->bkl", qs, kp).softmax(1)
    out = torch.einsum("bkl,bckl->bcl", att, vp)
    back = F.fold(out.repeat(1, 9, 1), (4, 4), 3, padding=1)
    return back.pow(2).mean(), q, kv


@model("capsule_routing", "vision")
def capsule_routing():
    """Capsule network dynamic routing: squash non-linearity, 3 routing iterations with softmax coupling."""
    w = nn.Parameter(torch.randn(6, 3, 4, 2) * 0.5)                 # in caps, out caps, out dim, in dim
    u = _rand(2, 6, 2)
    u_hat = torch.einsum("ijdk,bik->bijd", w, u)

    def squash(s):
        n2 = (s ** 2).sum(-1, keepdim=True)
        return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-9)
    b = torch.zeros(2, 6, 3)
    for it in range(3):
        c = b.softmax(2)
        v = squash((c.unsqueeze(-1) * u_hat).sum(1))
        if it < 2:
            b = b + (u_hat * v.unsqueeze(1)).sum(-1)
    lengths = v.norm(dim=-1)
    t = F.one_hot(torch.tensor([0, 2]), 3).to(lengths.dtype)
    margin = t * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - t) * F.relu(lengths - 0.1) ** 2
    return margin.sum(1).mean(), {"w": w}


@model("conv3d_video", "vision")
def conv3d_video():
    """Video classifier: Conv3d, BatchNorm3d, MaxPool3d, trilinear upsampling of a mask head, 3-D pooling."""
    m = nn.Sequential(nn.Conv3d(1, 3, 3, padding=1), nn.BatchNorm3d(3), nn.ReLU(), nn.MaxPool3d(2))
    head = nn.Linear(3, 2)
    h = m(_rand(1, 1, 4, 4, 4))
    mask = F.interpolate(h, scale_factor=2, mode="trilinear", align_corners=True)
    return F.cross_entropy(head(F.adaptive_avg_pool3d(h, 1).flatten(1)), torch.tensor([1])) + mask.mean(), m, head


@model("rnn_lm_truncated", "language")
def rnn_lm_truncated():
    """Elman RNN language model (tanh, 2 layers) with LSTMCell head state, gradient of 2 unrolled chunks
    (the first chunk's hidden state detached), label-smoothed loss."""
    emb, rnn, cell, out = nn.Embedding(9, 4), nn.RNN(4, 5, num_layers=2), nn.LSTMCell(5, 5), nn.Linear(5, 9)
    seq = torch.tensor([[1], [4], [2], [7], [3], [5]])
    h, loss = None, 0
    hc = (torch.zeros(1, 5), torch.zeros(1, 5))
    for chunk in (seq[:3], seq[3:]):
        y, h = rnn(emb(chunk), h)
        h = h.detach()
        for t in range(y.shape[0] - 1):
            hc = cell(y[t], hc)
            loss = loss + F.cross_entropy(out(hc[0]), chunk[t + 1], label_smoothing=0.1)
    return loss, emb, rnn, cell, out


@model("seq_vae_gumbel", "generative")
def seq_vae_gumbel():
    """Discrete latent model: Gumbel-softmax (hard, straight-through) sampling, KL to a uniform prior."""
    enc, dec = nn.Linear(5, 4), nn.Linear(4, 5)
    x = torch.rand(3, 5)
    logits = enc(x)
    z = F.gumbel_softmax(logits, tau=0.7, hard=True)
    q = logits.softmax(-1)
    kl = (q * (q.clamp_min(1e-9).log() - math.log(0.25))).sum(-1).mean()
    return F.mse_loss(torch.sigmoid(dec(z)), x) + kl, enc, dec


@model("distributions_zoo", "probabilistic")
def distributions_zoo():
    """Bayesian layer: Beta and Dirichlet rsample (standard-gamma reparameterisation), a full-covariance
    MultivariateNormal (Cholesky, triangular solve), KL divergences."""
    net = nn.Linear(3, 2 + 3 + 2 + 3)
    x = _rand(4, 3)
    out = net(x)
    a, conc, mu, l = out[:, :2], out[:, 2:5], out[:, 5:7], out[:, 7:]
    beta = torch.distributions.Beta(F.softplus(a[:, 0]) + 0.5, F.softplus(a[:, 1]) + 0.5)
    dir_ = torch.distributions.Dirichlet(F.softplus(conc) + 0.5)
    tril = torch.zeros(4, 2, 2)
    tril[:, 0, 0] = F.softplus(l[:, 0]) + 0.1
    tril[:, 1, 1] = F.softplus(l[:, 1]) + 0.1
    tril[:, 1, 0] = l[:, 2]
    mvn = torch.distributions.MultivariateNormal(mu, scale_tril=tril)
    s = beta.rsample() + dir_.rsample().sum(-1) + mvn.rsample().sum(-1)
    kl = torch.distributions.kl_divergence(mvn, torch.distributions.MultivariateNormal(
        torch.zeros(2), torch.eye(2))).mean()
    return s.pow(2).mean() + kl - beta.entropy().mean() + mvn.log_prob(torch.ones(2)).mean(), net


@model("set_transformer_sort", "other")
def set_transformer_sort():
    """Sorting and ranking: soft top-k by sort, cumsum/cumprod, kthvalue, median, logcumsumexp, diff."""
    lin = nn.Linear(3, 6)
    h = lin(_rand(4, 3))
    s, idx = h.sort(dim=1, descending=True)
    csum = s.cumsum(1) / torch.arange(1, 7)
    cp = torch.sigmoid(s).cumprod(1)
    k = h.kthvalue(2, dim=1).values + h.median(dim=1).values
    lse = torch.logcumsumexp(h, 1)
    return csum.sum() + cp.sum() + k.sum() + lse[:, -1].sum() + h.diff(dim=1).abs().sum(), lin


class EmptyPrefix(nn.Module):
    """A learned prefix whose length is a setting, here 0: a legacy 1-d empty parameter, which cat skips."""

    def __init__(self):
        super().__init__()
        self.prefix = nn.Parameter(torch.zeros(0))
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return torch.cat([self.prefix, self.lin(x), torch.zeros(0), self.lin(x).flip(0)], 0)


@model("cat_empty_prefix", "other")
def cat_empty_prefix():
    """cat of (2, 3) features with legacy 1-d empty tensors (a zero-length learned prefix, a constant): cat skips
    them, and the prefix's gradient is empty too."""
    m = EmptyPrefix()
    return m(_rand(2, 4)).tanh().sum(), m


@model("losses_zoo", "other")
def losses_zoo():
    """Many nn losses on one backbone: KL-div, Poisson NLL, multi-label soft margin, margin ranking,
    hinge embedding, multi-margin, BCE with pos_weight, L1."""
    net = nn.Sequential(nn.Linear(4, 6), nn.ELU(), nn.Linear(6, 4))
    x = _rand(5, 4)
    y = net(x)
    tgt = torch.softmax(torch.randn(5, 4), -1)
    labels = (torch.rand(5, 4) > 0.5).to(y.dtype)
    return (F.kl_div(y.log_softmax(-1), tgt, reduction="batchmean")
            + F.poisson_nll_loss(y, torch.rand(5, 4) * 3)
            + F.multilabel_soft_margin_loss(y, labels)
            + F.margin_ranking_loss(y[:, 0], y[:, 1], torch.tensor([1.0, -1, 1, 1, -1]), margin=0.1)
            + F.hinge_embedding_loss(y[:, 2], torch.tensor([1.0, -1, 1, -1, 1]))
            + F.multi_margin_loss(y, torch.tensor([0, 1, 2, 3, 0]))
            + F.binary_cross_entropy_with_logits(y, labels, pos_weight=torch.full((4,), 2.0))
            + F.l1_loss(y, tgt)), net


@model("spectral_norm_gan", "generative")
def spectral_norm_gan():
    """Discriminator with spectral-normalised layers (parametrizations: power iteration, vector norms),
    hinge loss, and an orthogonally parametrised generator layer (matrix exponential / Cayley)."""
    d1 = nn.utils.parametrizations.spectral_norm(nn.Linear(4, 6))
    d2 = nn.utils.parametrizations.spectral_norm(nn.Linear(6, 1))
    g = nn.utils.parametrizations.orthogonal(nn.Linear(4, 4))
    fake, real = g(_rand(3, 4)), _rand(3, 4)

    def d(z):
        return d2(F.leaky_relu(d1(z), 0.1))
    return F.relu(1 - d(real)).mean() + F.relu(1 + d(fake)).mean() - d(fake).mean(), d1, d2, g


@model("bilinear_fusion", "multimodal")
def bilinear_fusion():
    """Multimodal fusion: nn.Bilinear, FiLM conditioning (per-channel scale and shift), PixelUnshuffle."""
    img, txt = _rand(2, 1, 4, 4), _rand(2, 3)
    film = nn.Linear(3, 8)
    conv = nn.Conv2d(4, 4, 1)
    bil = nn.Bilinear(4, 3, 2)
    h = conv(F.pixel_unshuffle(img, 2))
    gamma, beta = film(txt).chunk(2, -1)
    h = F.relu(gamma[..., None, None] * h + beta[..., None, None])
    return F.cross_entropy(bil(h.mean((2, 3)), txt), torch.tensor([0, 1])), film, conv, bil


@model("complex_unet", "speech")
def complex_unet():
    """Complex-valued speech enhancement: STFT, a complex mask from a real conv net, inverse STFT, SI-SNR-like loss."""
    net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.PReLU(), nn.Conv2d(4, 2, 3, padding=1))
    wav = _rand(1, 64)
    win = torch.hann_window(16)
    spec = torch.stft(wav, 16, 4, window=win, return_complex=True)
    m = net(torch.view_as_real(spec).permute(0, 3, 1, 2)).permute(0, 2, 3, 1).contiguous()
    est = torch.istft(spec * torch.view_as_complex(m), 16, 4, window=win, length=64)
    clean = torch.sin(torch.arange(64) / 3.0).unsqueeze(0)
    return ((est - clean) ** 2).sum() / (clean ** 2).sum(), net


# ---------------------------------------------------------------- checkpoints, custom Functions, precisions

from torch.utils.checkpoint import checkpoint, checkpoint_sequential  # noqa: E402


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


@model("checkpoint_reentrant", "checkpoint")
def checkpoint_reentrant():
    """Transformer-style residual blocks, each a reentrant checkpoint (use_reentrant=True), with a
    parameter used both inside and outside the checkpoints."""
    blocks, head = nn.ModuleList(_Block(6) for _ in range(2)), nn.Linear(6, 3)
    x = _rand(3, 6, requires_grad=True)
    h = x
    for b in blocks:
        h = checkpoint(b, h, use_reentrant=True)
    return F.cross_entropy(head(h), torch.tensor([0, 1, 2])) + blocks[0].fc1.weight.pow(2).sum() * 1e-3, \
        blocks, head, {"x": x}


@model("checkpoint_nested", "checkpoint")
def checkpoint_nested():
    """A reentrant checkpoint inside a reentrant checkpoint (ResNet stage of checkpointed blocks), two
    outputs of which one does not require grad, a non-tensor argument."""
    conv1, conv2, bn = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2)

    def block(t):
        return F.relu(bn(conv2(t))) + t

    def stage(t, scale):
        h = F.relu(conv1(t)) * scale
        return checkpoint(block, h, use_reentrant=True), h.detach().sum()
    x = _rand(1, 2, 4, 4, requires_grad=True)
    y, stat = checkpoint(stage, x, 0.5, use_reentrant=True)
    return y.pow(2).mean() + 0 * stat, conv1, conv2, bn, {"x": x}


@model("checkpoint_sequential", "checkpoint")
def checkpoint_sequential_model():
    """torch.utils.checkpoint.checkpoint_sequential (reentrant) over an MLP with dropout in training mode:
    the recomputation replays the forward's random state."""
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    x = _rand(5, 4, requires_grad=True)
    out = checkpoint_sequential(m, 3, x, use_reentrant=True)
    return F.mse_loss(out, torch.zeros(5, 2)), m, {"x": x}


@model("checkpoint_non_reentrant", "checkpoint")
def checkpoint_non_reentrant():
    """use_reentrant=False: saved-tensor hooks, no nested backward; the graph is the plain one and its saved
    values are recomputed when capture reads them."""
    blocks = nn.ModuleList(_Block(6) for _ in range(2))
    x = _rand(3, 6, requires_grad=True)
    h = x
    for b in blocks:
        h = checkpoint(b, h, use_reentrant=False)
    return h.pow(2).sum(), blocks, {"x": x}


class _RecomputeGELU(torch.autograd.Function):
    """A memory-saving GELU: saves only its input and differentiates a recomputation in backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            return torch.autograd.grad(F.gelu(xd), xd, g)


class _Swish(torch.autograd.Function):
    """A hand-written swish whose backward is arithmetic in Python: nothing autograd can record."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * s * (1 + x * (1 - s))


@model("custom_function_recompute", "custom-function")
def custom_function_recompute():
    """A custom autograd.Function whose backward recomputes its forward and calls torch.autograd.grad:
    captured as a nested graph (checkpoint node, mode grad)."""
    fc1, fc2 = nn.Linear(4, 8), nn.Linear(8, 2)
    x = _rand(3, 4)
    return fc2(_RecomputeGELU.apply(fc1(x))).pow(2).sum(), fc1, fc2


@model("custom_function_python", "custom-function", python=1)
def custom_function_python():
    """A custom autograd.Function whose backward is Python arithmetic, importable by name: a python node that
    calls that backward again (replayed with allow_python), order and gradients as PyTorch's."""
    fc1, fc2 = nn.Linear(4, 8), nn.Linear(8, 2)
    return fc2(_Swish.apply(fc1(_rand(3, 4)))).pow(2).sum(), fc1, fc2


@model("custom_function_opaque", "custom-function", opaque=1)
def custom_function_opaque():
    """A custom autograd.Function whose backward is Python arithmetic, defined inside a function (not
    importable, so no replay can call it): kept opaque (attrs.reason), the order still matches and gradients
    are not compared."""
    class LocalSwish(torch.autograd.Function):
        forward = staticmethod(_Swish.forward)
        backward = staticmethod(_Swish.backward)

    fc1, fc2 = nn.Linear(4, 8), nn.Linear(8, 2)
    return fc2(LocalSwish.apply(fc1(_rand(3, 4)))).pow(2).sum(), fc1, fc2


@model("autocast_bf16_cnn", "precision", dtype=torch.float32, half=torch.bfloat16)
def autocast_bf16_cnn():
    """CPU autocast to bfloat16: convs and linears in bfloat16, casts (ToCopyBackward0) around them, batch norm,
    softmax and the loss in float32; float32 parameters."""
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                      nn.Flatten(), nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(_rand(4, 3, 6, 6))
        return F.cross_entropy(logits, torch.tensor([0, 1, 2, 3])), m


@model("autocast_bf16_transformer", "precision", dtype=torch.float32, half=torch.bfloat16)
def autocast_bf16_transformer():
    """A pre-norm transformer encoder layer under CPU bfloat16 autocast."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
    head = nn.Linear(8, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.cross_entropy(head(layer(_rand(2, 4, 8)).mean(1)), torch.tensor([2, 0])), layer, head


@model("bfloat16_mlp", "precision", dtype=torch.bfloat16)
def bfloat16_mlp():
    """A model cast to bfloat16 entirely: parameters, activations, gradients."""
    m = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.SiLU(), nn.Linear(16, 4)).to(torch.bfloat16)
    return F.cross_entropy(m(_rand(6, 8).to(torch.bfloat16)), torch.tensor([0, 1, 2, 3, 0, 1])), m


@model("float16_cnn", "precision", dtype=torch.float16)
def float16_cnn():
    """A CNN in float16 on the CPU: convolution, group norm, pooling, linear."""
    m = nn.Sequential(nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(16, 3)).half()
    return F.cross_entropy(m(_rand(2, 2, 6, 6).half()), torch.tensor([1, 2])), m


# ----------------------------------------------------------------------------- more families and idioms


@model("shufflenet", "vision")
def shufflenet():
    """ShuffleNet unit: grouped 1x1 conv, channel shuffle (view, transpose, contiguous), depthwise conv."""
    c = nn.Sequential(nn.Conv2d(4, 8, 1, groups=2), nn.BatchNorm2d(8), nn.ReLU())
    dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
    x = c(_rand(2, 4, 6, 6))
    b, ch, h, w = x.shape
    x = x.view(b, 2, ch // 2, h, w).transpose(1, 2).contiguous().view(b, ch, h, w)
    return dw(x).pow(2).mean(), c, dw


@model("inception_squeeze", "vision")
def inception():
    """Inception/SqueezeNet: a squeeze 1x1 conv, parallel 1x1 and 3x3 expand branches and a pooled branch, concatenated."""
    sq = nn.Conv2d(4, 2, 1); e1 = nn.Conv2d(2, 3, 1); e3 = nn.Conv2d(2, 3, 3, padding=1)
    pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(4, 2, 1))
    x = _rand(2, 4, 5, 5)
    s = F.relu(sq(x))
    y = torch.cat([F.relu(e1(s)), F.relu(e3(s)), pool(x)], 1)
    return F.adaptive_max_pool2d(y, 1).sum(), sq, e1, e3, pool


@model("efficientnet_droppath", "vision")
def droppath():
    """EfficientNet residual with stochastic depth: a per-sample Bernoulli keep mask scales the branch."""
    conv = nn.Conv2d(3, 3, 3, padding=1); bn = nn.BatchNorm2d(3)
    x = _rand(4, 3, 5, 5)
    keep = torch.empty(4, 1, 1, 1).bernoulli_(0.7)
    out = x + F.silu(bn(conv(x))) * keep / 0.7
    return out.square().mean(), conv, bn


@model("swin_window", "vision")
def swin():
    """Swin window attention: cyclic shift (roll), window partition, relative position bias gathered from a table."""
    ws, d = 2, 4
    qkv, proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
    table = nn.Parameter(torch.randn((2 * ws - 1) ** 2, 1) * 0.1)
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + ws - 1
    idx = rel[..., 0] * (2 * ws - 1) + rel[..., 1]
    x = _rand(1, 4, 4, d)
    x = torch.roll(x, (-1, -1), (1, 2))
    win = x.view(1, 2, ws, 2, ws, d).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, d)
    q, k, v = qkv(win).chunk(3, -1)
    att = q @ k.transpose(-1, -2) / 2 + table[idx.view(-1)].view(ws * ws, ws * ws)
    out = proj(att.softmax(-1) @ v)
    out = out.view(1, 2, 2, ws, ws, d).permute(0, 1, 3, 2, 4, 5).reshape(1, 4, 4, d)
    return torch.roll(out, (1, 1), (1, 2)).pow(2).sum(), qkv, proj, {"table": table}


@model("deeplab_aspp", "vision")
def aspp():
    """DeepLab ASPP: parallel dilated convs and image pooling, bilinear upsampling (align_corners), pixel-wise CE."""
    b = nn.ModuleList([nn.Conv2d(3, 2, 1), nn.Conv2d(3, 2, 3, padding=2, dilation=2), nn.Conv2d(3, 2, 3, padding=3, dilation=3)])
    gp = nn.Conv2d(3, 2, 1); out = nn.Conv2d(8, 2, 1)
    x = _rand(1, 3, 6, 6)
    feats = [m(x) for m in b] + [F.interpolate(gp(F.adaptive_avg_pool2d(x, 1)), size=(6, 6), mode="bilinear", align_corners=True)]
    y = F.interpolate(out(torch.cat(feats, 1)), scale_factor=2, mode="bilinear", align_corners=True)
    return F.cross_entropy(y, torch.randint(0, 2, (1, 12, 12))), b, gp, out


@model("stylegan_modconv", "generative")
def modconv():
    """StyleGAN2 modulated convolution: style-scaled weights, demodulation (rsqrt), grouped conv per sample."""
    w = nn.Parameter(torch.randn(4, 3, 3, 3) * 0.3)
    affine = nn.Linear(5, 3)
    x, s = _rand(2, 3, 5, 5), affine(_rand(2, 5)) + 1
    wt = w[None] * s[:, None, :, None, None]
    d = torch.rsqrt(wt.pow(2).sum([2, 3, 4]) + 1e-8)
    wt = wt * d[:, :, None, None, None]
    y = F.conv2d(x.reshape(1, -1, 5, 5), wt.reshape(-1, 3, 3, 3), padding=1, groups=2).reshape(2, 4, 5, 5)
    return F.leaky_relu(y, 0.2).mean() * math.sqrt(2), affine, {"w": w}


@model("vqvae", "generative")
def vqvae():
    """VQ-VAE: nearest codebook entry (argmin), straight-through estimator, codebook and commitment losses."""
    enc, dec = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 1, 3, padding=1)
    book = nn.Parameter(torch.randn(6, 4))
    x = _rand(2, 1, 4, 4)
    z = enc(x).permute(0, 2, 3, 1)
    d = (z.unsqueeze(-2) - book).pow(2).sum(-1)
    idx = d.argmin(-1)
    zq = book[idx]
    st = z + (zq - z).detach()
    rec = dec(st.permute(0, 3, 1, 2))
    return F.mse_loss(rec, x) + F.mse_loss(zq, z.detach()) + 0.25 * F.mse_loss(z, zq.detach()), enc, dec, {"book": book}


@model("nerf", "scientific")
def nerf():
    """NeRF: sinusoidal positional encoding, MLP density and colour, volume rendering with cumprod transmittance."""
    mlp = nn.Sequential(nn.Linear(3 + 12, 16), nn.ReLU(), nn.Linear(16, 4))
    pts = _rand(3, 5, 3)
    freqs = 2.0 ** torch.arange(2)
    enc = torch.cat([pts] + [f(pts * fr) for fr in freqs for f in (torch.sin, torch.cos)], -1)
    out = mlp(enc)
    rgb, sigma = torch.sigmoid(out[..., :3]), F.relu(out[..., 3])
    delta = torch.full((3, 5), 0.1)
    alpha = 1 - torch.exp(-sigma * delta)
    trans = torch.cumprod(torch.cat([torch.ones(3, 1), 1 - alpha + 1e-10], -1), -1)[:, :-1]
    color = ((trans * alpha)[..., None] * rgb).sum(1)
    return F.mse_loss(color, torch.rand(3, 3)), mlp


@model("dgcnn_knn", "3d")
def dgcnn():
    """DGCNN edge convolution: k nearest neighbours from cdist + topk, gathered neighbour features, max aggregation."""
    edge = nn.Sequential(nn.Conv2d(6, 8, 1), nn.BatchNorm2d(8), nn.LeakyReLU(0.2))
    x = _rand(2, 3, 7)
    d = torch.cdist(x.transpose(1, 2), x.transpose(1, 2))
    idx = d.topk(3, dim=-1, largest=False).indices
    xt = x.transpose(1, 2)
    nb = torch.gather(xt.unsqueeze(1).expand(-1, 7, -1, -1), 2, idx.unsqueeze(-1).expand(-1, -1, -1, 3))
    feat = torch.cat([nb - xt.unsqueeze(2), xt.unsqueeze(2).expand(-1, -1, 3, -1)], -1).permute(0, 3, 1, 2)
    return edge(feat).max(-1)[0].mean(), edge


@model("bert_mlm", "language")
def bert():
    """BERT masked language model: token, position and segment embeddings, padding mask, loss at masked positions."""
    emb, pos, typ = nn.Embedding(20, 8), nn.Embedding(6, 8), nn.Embedding(2, 8)
    ln = nn.LayerNorm(8)
    enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, activation="gelu", batch_first=True)
    head = nn.Linear(8, 20)
    ids = torch.tensor([[2, 5, 7, 1, 9, 3], [4, 4, 8, 11, 2, 0]])
    h = ln(emb(ids) + pos(torch.arange(6)) + typ(torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)))
    h = enc(h, src_key_padding_mask=ids == 0)
    masked = torch.tensor([[0, 2], [1, 3]])
    picked = h[torch.arange(2)[:, None], masked]
    return F.cross_entropy(head(picked).reshape(-1, 20), torch.tensor([5, 1, 4, 11])), emb, pos, typ, ln, enc, head


@model("t5_relbias", "language")
def t5():
    """T5 attention: RMS layer norm without mean, bucketed relative position bias from an embedding."""
    d = 8
    q, k, v, o = (nn.Linear(d, d, bias=False) for _ in range(4))
    bias = nn.Embedding(8, 2)
    scale = nn.Parameter(torch.ones(d))
    x = _rand(1, 5, d)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * scale
    rel = torch.arange(5)[None, :] - torch.arange(5)[:, None]
    bucket = (rel.abs().clamp(max=3) + (rel > 0).long() * 4)
    b = bias(bucket).permute(2, 0, 1)[None]
    qs, ks, vs = (f(h).view(1, 5, 2, 4).transpose(1, 2) for f in (q, k, v))
    a = (qs @ ks.transpose(-1, -2) + b).softmax(-1)
    return o((a @ vs).transpose(1, 2).reshape(1, 5, d)).pow(2).sum(), q, k, v, o, bias, {"scale": scale}


@model("mamba_scan", "language")
def mamba():
    """Mamba-style selective scan: causal depthwise conv, softplus step sizes, a sequential state recurrence."""
    d, n = 4, 3
    inp, out = nn.Linear(d, 2 * d), nn.Linear(d, d)
    conv = nn.Conv1d(d, d, 3, groups=d, padding=2)
    A_log = nn.Parameter(torch.randn(d, n) * 0.1)
    bc = nn.Linear(d, 2 * n + 1)
    x = _rand(1, 5, d)
    xz = inp(x)
    xi, z = xz.chunk(2, -1)
    xi = F.silu(conv(xi.transpose(1, 2))[..., :5].transpose(1, 2))
    B, C, dt = bc(xi).split([n, n, 1], -1)
    dt = F.softplus(dt)
    A = -torch.exp(A_log)
    h = torch.zeros(1, d, n)
    ys = []
    for t in range(5):
        h = torch.exp(dt[:, t, :, None] * A) * h + dt[:, t, :, None] * B[:, t, None, :] * xi[:, t, :, None]
        ys.append((h * C[:, t, None, :]).sum(-1))
    y = torch.stack(ys, 1) * F.silu(z)
    return out(y).pow(2).mean(), inp, out, conv, bc, {"A_log": A_log}


@model("conformer_conv", "speech")
def conformer():
    """Conformer convolution module: pointwise conv, GLU, depthwise conv, BatchNorm1d, Swish, residual."""
    pw1, dw, bn, pw2 = nn.Conv1d(4, 8, 1), nn.Conv1d(4, 4, 3, padding=1, groups=4), nn.BatchNorm1d(4), nn.Conv1d(4, 4, 1)
    ln = nn.LayerNorm(4)
    x = _rand(2, 6, 4)
    h = F.glu(pw1(ln(x).transpose(1, 2)), dim=1)
    h = pw2(F.silu(bn(dw(h))))
    return (x + h.transpose(1, 2)).pow(2).mean(), pw1, dw, bn, pw2, ln


@model("tacotron_location_att", "speech")
def tacotron():
    """Tacotron decoder: prenet with dropout, GRU cell, location-sensitive attention (conv over previous weights)."""
    prenet = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Dropout(0.5))
    rnn = nn.GRUCell(6 + 4, 5)
    loc = nn.Conv1d(1, 2, 3, padding=1)
    W, V, U = nn.Linear(5, 4), nn.Linear(4, 4), nn.Linear(2, 4)
    v = nn.Linear(4, 1, bias=False)
    mem = _rand(1, 7, 4)
    h, ctx, att, loss = torch.zeros(1, 5), torch.zeros(1, 4), torch.zeros(1, 7), 0
    frames = torch.randn(3, 1, 3)
    for t in range(3):
        h = rnn(torch.cat([prenet(frames[t]), ctx], -1), h)
        e = v(torch.tanh(W(h)[:, None] + V(mem) + U(loc(att[:, None]).transpose(1, 2)))).squeeze(-1)
        att = e.softmax(-1)
        ctx = (att[..., None] * mem).sum(1)
        loss = loss + ctx.pow(2).sum()
    return loss, prenet, rnn, loc, W, V, U, v


@model("clip", "multimodal")
def clip():
    """CLIP: two towers, L2-normalised embeddings, learnable temperature (exp), symmetric cross-entropy."""
    img, txt = nn.Linear(6, 4), nn.Linear(5, 4)
    logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
    a, b = F.normalize(img(_rand(3, 6)), dim=-1), F.normalize(txt(_rand(3, 5)), dim=-1)
    logits = logit_scale.exp() * a @ b.t()
    lab = torch.arange(3)
    return (F.cross_entropy(logits, lab) + F.cross_entropy(logits.t(), lab)) / 2, img, txt, {"s": logit_scale}


@model("mae_masking", "vision")
def mae():
    """MAE: random masking by argsort of noise, gather of visible patches, mask tokens, unshuffle, masked MSE."""
    emb, dec = nn.Linear(4, 6), nn.Linear(6, 4)
    mask_tok = nn.Parameter(torch.zeros(1, 1, 6))
    x = _rand(2, 8, 4)
    noise = torch.rand(2, 8)
    shuffle = noise.argsort(1); restore = shuffle.argsort(1)
    keep = shuffle[:, :3]
    vis = torch.gather(emb(x), 1, keep[..., None].expand(-1, -1, 6))
    full = torch.cat([vis, mask_tok.expand(2, 5, -1)], 1)
    full = torch.gather(full, 1, restore[..., None].expand(-1, -1, 6))
    rec = dec(full)
    m = torch.ones(2, 8); m[:, :3] = 0; m = torch.gather(m, 1, restore)
    return (((rec - x) ** 2).mean(-1) * m).sum() / m.sum(), emb, dec, {"mask_token": mask_tok}


@model("dino_loss", "metric")
def dino():
    """DINO: centred, sharpened teacher targets without gradient, student log-softmax cross-entropy."""
    student, teacher = nn.Sequential(nn.Linear(5, 8), nn.GELU(), nn.Linear(8, 6)), nn.Sequential(nn.Linear(5, 8), nn.GELU(), nn.Linear(8, 6))
    x = _rand(4, 5)
    center = torch.randn(6) * 0.1
    with torch.no_grad():
        t = F.softmax((teacher(x) - center) / 0.04, -1)
    s = F.log_softmax(student(x + 0.1) / 0.1, -1)
    return -(t * s).sum(-1).mean(), student


@model("graphsage_gin", "graph")
def sage():
    """GraphSAGE mean aggregation (index_add with counts) and GIN sum aggregation (learnable eps), index_reduce pooling."""
    src = torch.tensor([0, 1, 2, 3, 4, 0, 2]); dst = torch.tensor([1, 2, 3, 4, 0, 3, 0])
    lin_self, lin_nb = nn.Linear(3, 4), nn.Linear(3, 4)
    gin = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)); eps = nn.Parameter(torch.tensor(0.1))
    x = _rand(5, 3)
    cnt = torch.zeros(5).index_add_(0, dst, torch.ones(7)).clamp(min=1)
    mean = torch.zeros(5, 3).index_add(0, dst, x[src]) / cnt[:, None]
    h = F.relu(lin_self(x) + lin_nb(mean))
    agg = torch.zeros(5, 4).scatter_add(0, dst[:, None].expand(-1, 4), h[src])
    out = gin((1 + eps) * h + agg)
    pooled = torch.zeros(2, 2).index_reduce(0, torch.tensor([0, 0, 1, 1, 1]), out, "amax", include_self=False)
    return F.cross_entropy(pooled, torch.tensor([0, 1])), lin_self, lin_nb, gin, {"eps": eps}


@model("egnn", "graph")
def egnn():
    """E(n)-equivariant GNN: messages from squared distances, coordinate updates by index_add, node updates."""
    phi_e, phi_x, phi_h = nn.Sequential(nn.Linear(2 * 3 + 1, 4), nn.SiLU()), nn.Linear(4, 1), nn.Linear(3 + 4, 3)
    src = torch.tensor([0, 1, 2, 1, 2, 0]); dst = torch.tensor([1, 2, 0, 0, 1, 2])
    h, pos = _rand(3, 3), _rand(3, 3, requires_grad=True)
    diff = pos[src] - pos[dst]
    d2 = (diff ** 2).sum(-1, keepdim=True)
    m = phi_e(torch.cat([h[src], h[dst], d2], -1))
    pos2 = pos + torch.zeros(3, 3).index_add(0, dst, diff * phi_x(m))
    h2 = phi_h(torch.cat([h, torch.zeros(3, 4).index_add(0, dst, m)], -1))
    return h2.pow(2).sum() + pos2.pow(2).sum(), phi_e, phi_x, phi_h, {"pos": pos}


@model("maml", "meta")
def maml():
    """MAML: two inner SGD steps with create_graph=True, the outer loss through them (second-order gradients)."""
    w, b = nn.Parameter(torch.randn(1, 3) * 0.5), nn.Parameter(torch.zeros(1))
    xs, ys, xq, yq = _rand(5, 3), _rand(5, 1), _rand(4, 3), _rand(4, 1)
    fw, fb = w, b
    for _ in range(2):
        l = F.mse_loss(F.linear(xs, fw, fb), ys)
        gw, gb = torch.autograd.grad(l, (fw, fb), create_graph=True)
        fw, fb = fw - 0.1 * gw, fb - 0.1 * gb
    return F.mse_loss(F.linear(xq, fw, fb), yq), {"w": w, "b": b}


@model("glow_flow", "generative")
def glow():
    """Glow step: ActNorm, invertible 1x1 conv with slogdet, affine coupling with a sigmoid scale, log-likelihood."""
    loc, logs = nn.Parameter(torch.zeros(1, 2, 1, 1)), nn.Parameter(torch.zeros(1, 2, 1, 1))
    W = nn.Parameter(torch.linalg.qr(torch.randn(2, 2))[0])
    net = nn.Conv2d(1, 2, 3, padding=1)
    x = _rand(2, 2, 3, 3)
    y = (x + loc) * torch.exp(logs)
    ld = logs.sum() * 9
    y = F.conv2d(y, W.view(2, 2, 1, 1))
    ld = ld + torch.slogdet(W)[1] * 9
    a, b = y.chunk(2, 1)
    s, t = net(a).chunk(2, 1)
    s = torch.sigmoid(s + 2)
    b = (b + t) * s
    ld = ld + torch.log(s).flatten(1).sum(1)
    z = torch.cat([a, b], 1)
    return -(-0.5 * z.pow(2).flatten(1).sum(1) + ld).mean(), net, {"loc": loc, "logs": logs, "W": W}


@model("sparsemax_tabnet", "tabular")
def sparsemax_model():
    """TabNet attentive transformer: sparsemax by sort, cumsum, support size and gather."""
    lin = nn.Linear(4, 5); prior = torch.ones(3, 5)
    z = lin(_rand(3, 4)) * prior
    zs, _ = z.sort(-1, descending=True)
    k = torch.arange(1, 6, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs) > cs
    kz = support.sum(-1, keepdim=True)
    tau = (cs.gather(-1, kz - 1) - 1) / kz
    p = torch.clamp(z - tau, min=0)
    return (p * torch.arange(5.0)).sum(), lin


@model("deepfm", "recommendation")
def deepfm():
    """DeepFM: first-order embeddings, factorisation-machine pairwise term (square of sums), deep MLP."""
    emb = nn.Embedding(12, 4); lin = nn.Embedding(12, 1); deep = nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 1))
    ids = torch.tensor([[0, 5, 9], [3, 6, 11]])
    e = emb(ids)
    fm = 0.5 * ((e.sum(1) ** 2) - (e ** 2).sum(1)).sum(1, keepdim=True)
    logit = lin(ids).sum(1) + fm + deep(e.flatten(1))
    return F.binary_cross_entropy_with_logits(logit.squeeze(1), torch.tensor([1.0, 0.0])), emb, lin, deep


@model("arcface", "metric")
def arcface():
    """ArcFace: normalised features and class weights, acos, additive angular margin on the target class."""
    backbone = nn.Linear(6, 4); W = nn.Parameter(torch.randn(5, 4))
    e = F.normalize(backbone(_rand(3, 6)))
    cos = F.linear(e, F.normalize(W)).clamp(-1 + 1e-7, 1 - 1e-7)
    theta = torch.acos(cos)
    lab = torch.tensor([1, 3, 0])
    target = torch.cos(theta + 0.5)
    oh = F.one_hot(lab, 5).bool()
    logits = torch.where(oh, target, cos) * 16
    return F.cross_entropy(logits, lab), backbone, {"W": W}


@model("lora", "language")
def lora():
    """LoRA: frozen base linear, trainable low-rank A and B with dropout on the adapter path."""
    base = nn.Linear(6, 6); base.weight.requires_grad_(False); base.bias.requires_grad_(False)
    A, B = nn.Parameter(torch.randn(2, 6) * 0.1), nn.Parameter(torch.randn(6, 2) * 0.1)
    x = _rand(3, 6)
    y = base(x) + F.dropout(x, 0.1) @ A.t() @ B.t() * 2.0
    return y.pow(2).mean(), {"A": A, "B": B}


@model("qat_fake_quant", "quantization", dtype=torch.float32)
def qat():
    """Fake quantization: per-channel weights and per-tensor activations (straight-through masks)."""
    lin = nn.Linear(4, 3)
    x = _rand(2, 4)
    wq = torch.fake_quantize_per_channel_affine(lin.weight, torch.full((3,), 0.05), torch.zeros(3, dtype=torch.int32), 0, -128, 127)
    xq = torch.fake_quantize_per_tensor_affine(x.requires_grad_(), 0.1, 0, -128, 127)
    return F.linear(xq, wq, lin.bias).pow(2).sum(), lin, {"x": x}


@model("siren", "scientific")
def siren():
    """SIREN: sine activations with a frequency factor."""
    l1, l2, l3 = nn.Linear(2, 8), nn.Linear(8, 8), nn.Linear(8, 1)
    x = torch.rand(6, 2) * 2 - 1
    h = torch.sin(30 * l1(x)); h = torch.sin(l2(h))
    return F.mse_loss(l3(h), torch.rand(6, 1)), l1, l2, l3


@model("sliced_score", "generative")
def sliced_score():
    """Sliced score matching: a Jacobian-vector product through autograd.grad(create_graph=True)."""
    net = nn.Sequential(nn.Linear(3, 8), nn.Softplus(), nn.Linear(8, 3))
    x = _rand(4, 3, requires_grad=True)
    v = torch.randn(4, 3)
    s = net(x)
    gv = torch.autograd.grad((s * v).sum(), x, create_graph=True)[0]
    return ((gv * v).sum(-1) + 0.5 * (s * v).sum(-1) ** 2).mean(), net


@model("rssm_world_model", "rl")
def rssm():
    """Dreamer RSSM world model: GRU cell, prior and posterior Normals, rsample, KL divergence over time."""
    cell = nn.GRUCell(3 + 2, 6); prior = nn.Linear(6, 4); post = nn.Linear(6 + 5, 4)
    h, z, kl = torch.zeros(2, 6), torch.zeros(2, 3), 0
    obs, act = torch.randn(3, 2, 5), torch.randn(3, 2, 2)
    for t in range(3):
        h = cell(torch.cat([z, act[t]], -1), h)
        pm, ps = prior(h).split([3, 1], -1)
        qm, qs = post(torch.cat([h, obs[t]], -1)).split([3, 1], -1)
        p = torch.distributions.Normal(pm, F.softplus(ps) + 0.1)
        q = torch.distributions.Normal(qm, F.softplus(qs) + 0.1)
        z = q.rsample()
        kl = kl + torch.distributions.kl_divergence(q, p).sum()
    return kl, cell, prior, post


@model("informer_topk", "time-series")
def informer():
    """Informer ProbSparse attention: query sparsity measure, top-k queries, index assignment into a context."""
    qp, kp = nn.Linear(4, 4), nn.Linear(4, 4)
    x = _rand(1, 6, 4)
    q, k = qp(x), kp(x)
    s = q @ k.transpose(1, 2)
    m = s.max(-1).values - s.mean(-1)
    top = m.topk(2, -1).indices
    qr = q[torch.arange(1)[:, None], top]
    out = (qr @ k.transpose(1, 2)).softmax(-1) @ x
    ctx = x.mean(1, keepdim=True).expand(-1, 6, -1).clone()
    ctx[torch.arange(1)[:, None], top] = out
    return ctx.pow(2).sum(), qp, kp


@model("nbeats", "time-series")
def nbeats():
    """N-BEATS block: MLP to polynomial basis coefficients, trend forecast by a fixed basis."""
    fc = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    t = torch.linspace(0, 1, 4)
    basis = torch.stack([t ** i for i in range(3)])
    x = _rand(2, 8)
    theta = fc(x)
    return F.l1_loss(theta @ basis, torch.randn(2, 4)), fc


@model("tft_grn", "time-series")
def tft():
    """Temporal Fusion Transformer gated residual network: variable selection softmax, ELU, GLU, layer norm."""
    l1, l2, gate, skip, sel = nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 8), nn.Linear(3, 4), nn.Linear(3, 3)
    norm = nn.LayerNorm(4)
    x = _rand(5, 3)
    w = sel(x).softmax(-1)
    xs = x * w
    h = l2(F.elu(l1(xs)))
    g = F.glu(gate(h), -1)
    return norm(skip(xs) + g).pow(2).mean(), l1, l2, gate, skip, sel, norm


@model("decision_transformer", "rl")
def dt():
    """Decision Transformer: return, state and action token embeddings with timestep embeddings, causal mask."""
    er, es, ea, et = nn.Linear(1, 8), nn.Linear(3, 8), nn.Embedding(4, 8), nn.Embedding(10, 8)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    head = nn.Linear(8, 4)
    T = 3
    r, s, a, ts = torch.randn(1, T, 1), torch.randn(1, T, 3), torch.tensor([[1, 0, 3]]), torch.tensor([[2, 3, 4]])
    te = et(ts)
    tok = torch.stack([er(r) + te, es(s) + te, ea(a) + te], 2).reshape(1, 3 * T, 8)
    mask = torch.triu(torch.full((3 * T, 3 * T), float("-inf")), 1)
    h = layer(tok, src_mask=mask).reshape(1, T, 3, 8)
    return F.cross_entropy(head(h[:, :, 1]).reshape(-1, 4), a.reshape(-1)), er, es, ea, et, layer, head


@model("hypernet", "meta")
def hypernet():
    """Hypernetwork: a linear layer generates another layer's weights and bias, applied with F.linear."""
    hyper = nn.Linear(2, 4 * 3 + 3)
    z = _rand(1, 2)
    p = hyper(z).squeeze(0)
    W, b = p[:12].view(3, 4), p[12:]
    return F.linear(_rand(5, 4), W, b).tanh().sum(), hyper


@model("ebm_langevin", "generative")
def ebm():
    """Energy-based model: Langevin sampling steps by autograd.grad (detached), contrastive energy loss."""
    energy = nn.Sequential(nn.Linear(2, 8), nn.SiLU(), nn.Linear(8, 1))
    xs = torch.randn(4, 2)
    for _ in range(2):
        xs = xs.requires_grad_(True)
        g = torch.autograd.grad(energy(xs).sum(), xs)[0]
        xs = (xs - 0.1 * g + 0.01 * torch.randn_like(xs)).detach()
    return energy(torch.randn(4, 2)).mean() - energy(xs).mean(), energy


@model("qat_prepared", "quantization", dtype=torch.float32)
def qat_prepared():
    """Quantization-aware training as prepared by torch.ao.quantization.prepare_qat (fused observers)."""
    import warnings
    from torch.ao.quantization import get_default_qat_qconfig, prepare_qat
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 2))
    m.qconfig = get_default_qat_qconfig("x86")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = prepare_qat(m.train())
    return F.cross_entropy(m(_rand(2, 2, 4, 4)), torch.tensor([0, 1])), m


@model("qr_orthogonal_rnn", "language")
def qr_orthogonal_rnn():
    """Orthogonal recurrent weights from a QR decomposition (Q of a free parameter, signs fixed by diag(R))."""
    raw = nn.Parameter(torch.randn(5, 5) * 0.5)
    inp, out = nn.Linear(3, 5), nn.Linear(5, 2)
    q, r = torch.linalg.qr(raw)
    w = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    h = torch.zeros(2, 5)
    for x in torch.randn(4, 2, 3):
        h = torch.tanh(inp(x) + h @ w.t())
    return F.cross_entropy(out(h), torch.tensor([0, 1])), inp, out, {"raw": raw}


@model("pinv_readout", "scientific")
def pinv_readout():
    """Closed-form least-squares readout (pseudo-inverse) on learned random features, differentiated end to end."""
    feat = nn.Sequential(nn.Linear(2, 6), nn.Tanh())
    x, y = _rand(8, 2), _rand(8, 1)
    phi = feat(x)
    beta = torch.linalg.pinv(phi) @ y
    xv = _rand(4, 2)
    return F.mse_loss(feat(xv) @ beta, torch.sin(xv.sum(-1, keepdim=True))), feat


@model("saliency_grad_mode", "interpretability")
def saliency_grad_mode():
    """torch.autograd.grad of a class score w.r.t. the input image and the first conv's weight (a grad() capture:
    requested inputs, nothing accumulated), through a small CNN with batch norm in eval mode."""
    from zoo.registry import Case
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(4, 3)).eval()
    img = _rand(1, 1, 6, 6, requires_grad=True)
    score = m(img)[0, 2]
    return Case(score, {"img": img, **dict(m.named_parameters())}, inputs=[img, m[0].weight])


@model("multi_head_grad_outputs", "vision")
def multi_head_grad_outputs():
    """Two heads backpropagated together with explicit gradients: a scalar loss and a non-scalar dense map
    (torch.autograd.backward([loss, dense], [1.5, weights]))."""
    from zoo.registry import Case
    trunk, cls, seg = nn.Conv2d(2, 4, 3, padding=1), nn.Linear(4, 3), nn.Conv2d(4, 2, 1)
    h = F.relu(trunk(_rand(2, 2, 5, 5)))
    loss = F.cross_entropy(cls(h.mean((2, 3))), torch.tensor([0, 2]))
    dense = seg(h)
    names = {f"{k}.{n}": p for k, mod in (("trunk", trunk), ("cls", cls), ("seg", seg))
             for n, p in mod.named_parameters()}
    return Case([loss, dense], names, grad_outputs=[torch.tensor(1.5), torch.randn(dense.shape)])
