"""Small real-model graphs (vision, generative, speech, language, RL) replayed against PyTorch: every node has a
rule, the executed order matches and every parameter's gradient agrees in float64."""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
nn = torch.nn
F = torch.nn.functional

from rules_torch_cases import D, check, leaf  # noqa: E402

pytestmark = pytest.mark.torch


def _params(*mods):
    out = {}
    for k, m in enumerate(mods):
        for n, p in m.named_parameters():
            out[f"m{k}_{n.replace('.', '_')}"] = p
    return out


class _SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.f1, self.f2 = nn.Conv2d(c, c // 2, 1), nn.Conv2d(c // 2, c, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.f2(F.relu(self.f1(F.adaptive_avg_pool2d(x, 1)))))


def test_mobilenet_v3_block():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish(),
                      nn.Conv2d(16, 16, 3, 1, 1, groups=16), _SqueezeExcite(16), nn.Conv2d(16, 8, 1),
                      nn.BatchNorm2d(8), nn.ReLU6()).double()
    x = leaf(2, 3, 12, 12, seed=1)
    check(F.cross_entropy(m(x).mean((2, 3)), torch.tensor([1, 5]), label_smoothing=0.0), {"x": x, **_params(m)})


def test_dcgan_generator_and_discriminator():
    torch.manual_seed(2)
    g = nn.Sequential(nn.ConvTranspose2d(8, 16, 4, 1, 0, bias=False), nn.BatchNorm2d(16), nn.ReLU(True),
                      nn.ConvTranspose2d(16, 3, 4, 2, 1, bias=False), nn.Tanh()).double()
    d = nn.Sequential(nn.Conv2d(3, 8, 4, 2, 1), nn.LeakyReLU(0.2, True), nn.Conv2d(8, 1, 4, 1, 0),
                      nn.Flatten()).double()
    z = leaf(2, 8, 1, 1, seed=2)
    loss = F.binary_cross_entropy_with_logits(d(g(z)), torch.ones(2, 1, dtype=D))
    check(loss, {"z": z, **_params(g, d)})


def test_wgan_gradient_penalty_through_layer_norm():
    torch.manual_seed(3)
    critic = nn.Sequential(nn.Conv2d(3, 8, 4, 2, 1), nn.LayerNorm([8, 4, 4]), nn.LeakyReLU(0.2),
                           nn.Conv2d(8, 1, 4, 1, 0)).double()
    real, fake = leaf(2, 3, 8, 8, seed=3), leaf(2, 3, 8, 8, seed=4)
    a = torch.rand(2, 1, 1, 1, dtype=D, generator=torch.Generator().manual_seed(0))
    interp = a * real + (1 - a) * fake
    grad = torch.autograd.grad(critic(interp).sum(), interp, create_graph=True)[0]
    penalty = ((torch.linalg.vector_norm(grad.flatten(1), dim=1) - 1) ** 2).mean()
    check(penalty + critic(fake).mean(), {"real": real, "fake": fake, **_params(critic)})


def test_r1_penalty_through_batch_norm():
    torch.manual_seed(4)
    d = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(6, 1)).double()
    x = leaf(3, 3, 6, 6, seed=5)
    grad = torch.autograd.grad(F.softplus(d(x)).sum(), x, create_graph=True)[0]
    check(grad.pow(2).sum() * 5.0, {"x": x, **_params(d)})


def test_speech_encoder_with_ctc(tmp_path):
    torch.manual_seed(5)
    enc = nn.Sequential(nn.Conv1d(1, 8, 10, 5), nn.GroupNorm(8, 8), nn.GELU(), nn.Conv1d(8, 6, 3, 2)).double()
    wav = leaf(2, 1, 64, seed=6)
    logp = enc(wav).transpose(1, 2).transpose(0, 1).log_softmax(-1)
    loss = F.ctc_loss(logp, torch.tensor([[1, 2], [3, 4]]), (logp.shape[0],) * 2, (2, 2))
    check(loss, {"wav": wav, **_params(enc)}, path=tmp_path / "g.json")


def test_super_resolution_pixel_shuffle():
    torch.manual_seed(6)
    m = nn.Sequential(nn.Conv2d(3, 12, 3, padding=1), nn.PixelShuffle(2), nn.PReLU(), nn.ReflectionPad2d(1),
                      nn.Conv2d(3, 3, 3)).double()
    x = leaf(1, 3, 6, 6, seed=7)
    check(F.l1_loss(m(x), F.interpolate(x.detach(), scale_factor=2, mode="bicubic")), {"x": x, **_params(m)})


def test_unet_decoder_upsampling():
    torch.manual_seed(7)
    up = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4),
                       nn.Mish(), nn.ConvTranspose2d(4, 2, 2, stride=2), nn.Sigmoid()).double()
    x = leaf(2, 3, 5, 5, seed=8)
    target = torch.rand(2, 2, 20, 20, dtype=D, generator=torch.Generator().manual_seed(1))
    p = up(x)
    dice = 1 - (2 * (p * target).sum() + 1) / (p.sum() + target.sum() + 1)
    check(dice + F.binary_cross_entropy(p, target), {"x": x, **_params(up)})


def test_llama_mlp_with_rms_norm_and_rotary(tmp_path):
    torch.manual_seed(8)
    norm, w1, w2, w3 = nn.RMSNorm(16).double(), nn.Linear(16, 32, bias=False).double(), \
        nn.Linear(16, 32, bias=False).double(), nn.Linear(32, 16, bias=False).double()
    h = leaf(2, 5, 16, seed=9)
    hh = norm(h)
    freqs = torch.polar(torch.ones(5, 8, dtype=D), torch.linspace(0, 3, 40, dtype=D).reshape(5, 8))
    rot = torch.view_as_real(torch.view_as_complex(hh.reshape(2, 5, 8, 2)) * freqs).flatten(2)
    out = w3(F.silu(w1(hh)) * w2(rot))
    check((out ** 2).mean(), {"h": h, **_params(norm, w1, w2, w3)}, path=tmp_path / "g.json")


def test_vae_losses():
    torch.manual_seed(9)
    enc, dec = nn.Linear(6, 8).double(), nn.Linear(4, 6).double()
    x = torch.rand(3, 6, dtype=D, generator=torch.Generator().manual_seed(2))
    mu, logvar = enc(x).chunk(2, dim=1)
    eps = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(3))
    z = mu + eps * torch.exp(0.5 * logvar)
    recon = torch.sigmoid(dec(z))
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    check(F.binary_cross_entropy(recon, x, reduction="sum") + kl, _params(enc, dec))


def test_rl_gaussian_policy_and_value():
    torch.manual_seed(10)
    pi, v = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 4)).double(), nn.Linear(4, 1).double()
    obs = leaf(5, 4, seed=11)
    mu, log_std = pi(obs).chunk(2, dim=-1)
    dist = torch.distributions.Normal(mu, F.softplus(log_std) + 1e-3)
    act = torch.full((5, 2), 0.3, dtype=D)
    ratio = (dist.log_prob(act).sum(-1) - dist.log_prob(act).sum(-1).detach()).exp()
    adv = torch.linspace(-1, 1, 5, dtype=D)
    surrogate = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()
    value_loss = F.huber_loss(v(obs).squeeze(-1), adv * 2)
    check(surrogate + 0.5 * value_loss - 0.01 * dist.entropy().mean(), {"obs": obs, **_params(pi, v)})


def test_focal_loss_detection_head():
    torch.manual_seed(11)
    head = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), nn.Conv2d(4, 3, 1)).double()
    x = leaf(2, 4, 5, 5, seed=12)
    logits = head(x)
    t = (torch.rand(2, 3, 5, 5, generator=torch.Generator().manual_seed(4)) > 0.7).to(D)
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, t, reduction="none")
    pt = p * t + (1 - p) * (1 - t)
    alpha = 0.25 * t + 0.75 * (1 - t)
    focal = (alpha * ce * (1 - pt) ** 2).sum() / 4
    box = F.smooth_l1_loss(logits[:, :2], torch.zeros(2, 2, 5, 5, dtype=D), beta=1 / 9)
    check(focal + box, {"x": x, **_params(head)})


def test_a_node_whose_gradients_are_all_undefined_sends_none():
    """As PyTorch's generated nodes: no defined incoming gradient, no outgoing one (and no formula call)."""
    from types import SimpleNamespace

    from autograd_run.ops import REGISTRY
    node = SimpleNamespace(next=[object(), None, object()], saved={})
    for name in ("LeakyReluBackward0", "ConvolutionBackward0", "MulBackward0"):
        assert REGISTRY[name].backward(node, [None], None) == [None, None, None]
