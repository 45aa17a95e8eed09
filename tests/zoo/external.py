"""The zoo's external family: models nobody here wrote, from torchvision, timm and Hugging Face transformers.

Each is the library's own model class, built with random weights (nothing
is downloaded): torchvision's classification models at a small input size,
timm's by ``create_model(pretrained=False)``, and transformers' from small
configs (2 layers, hidden size 32, vocabulary 96; eager attention, which is
what a CPU build without fused kernels runs; transformers builds in float32
whatever torch's default dtype, so these are float32 entries, and Mixtral's
experts are grouped matrix products, ``GroupedMmBackward0``). The loss is the model's own
(``labels=``) for the language models and ``square().mean()`` of the logits
for the vision models.

The family is optional: when a library is not installed (or cannot be
imported here), its models are still registered, with the reason, and the
zoo's tests skip them saying so. ``make test`` installs them with the test
extras (``pip install -e '.[zoo]'``).

``import_torchvision()`` is the one place that imports torchvision; see its
comment for the workaround it needs next to the CPU build of torch 2.13.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types

import numpy as np
import torch

from zoo.registry import model

#: Input side of the vision models (pixels): small enough that a float64 backward takes well under a second.
IMAGE = 32
VOCAB, HIDDEN = 96, 32


@functools.lru_cache(maxsize=None)
def import_torchvision():
    """torchvision's ``models`` package, or raises ImportError with the reason.

    The registry's ``torchvision==0.28.0`` (the release for torch 2.13) is a CUDA build whose compiled ops
    library does not load next to the CPU build of torch; its ``__init__`` then imports
    ``torchvision._meta_registrations``, which registers fake kernels for those ops
    (``torchvision::nms`` ...) and fails with ``operator torchvision::nms does not exist``. None of the
    classification models calls those ops (detection does), so an empty module is registered under that
    name before the import: the models import, and ``torchvision.ops.nms`` still fails loudly if called
    ("Couldn't load custom C++ ops"). When the ops library does load (a matching build), the real module is
    imported as usual: the placeholder is only put in place when ``torchvision/_C`` cannot be loaded.
    """
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        raise ImportError("torchvision is not installed (pip install -e '.[zoo]')")
    name = "torchvision._meta_registrations"
    if name not in sys.modules and not _torchvision_ops_load(spec):
        sys.modules[name] = types.ModuleType(name)
    import torchvision.models
    return torchvision.models


def _torchvision_ops_load(spec) -> bool:
    """Whether torchvision's compiled ops library loads into this torch (found without importing torchvision)."""
    import glob
    import os
    folder = os.path.dirname(spec.origin)
    libs = glob.glob(os.path.join(folder, "_C*.so")) + glob.glob(os.path.join(folder, "_C*.pyd"))
    if not libs:
        return False
    try:
        torch.ops.load_library(libs[0])
    except (OSError, RuntimeError):
        return False
    return hasattr(torch.ops.torchvision, "nms")


@functools.lru_cache(maxsize=None)
def import_timm():
    import_torchvision()  # timm imports torchvision's transforms when it is installed
    import timm
    return timm


@functools.lru_cache(maxsize=None)
def import_transformers():
    if importlib.util.find_spec("torchvision") is not None:
        import_torchvision()  # some models' modules import torchvision (Bart's, through its image utilities)
    import transformers
    return transformers


def unavailable(source: str) -> str:
    """Why the models from ``source`` cannot be built here ("" when they can)."""
    loader = {"torchvision": import_torchvision, "timm": import_timm, "transformers": import_transformers}[source]
    try:
        loader()
    except Exception as exc:  # an import of a library that does not fit this torch fails in many ways
        return f"{source} cannot be imported here: {type(exc).__name__}: {str(exc)[:160]}"
    return ""


# --- torchvision -------------------------------------------------------------------------------------------

#: Models whose last feature maps would be 1x1 at IMAGE: a batch norm over 2 values there is ill-conditioned
#: (float64 rounding differences grow past the tolerance), so they see twice the side.
LARGER = {"densenet121": 2 * IMAGE, "efficientnet_b0": 2 * IMAGE}


def _vision(m, side: int = IMAGE):
    """(model, run): ``run(model)`` is one forward to the loss, on the same input each time."""
    m.train()
    x = torch.randn(2, 3, side, side)

    def run(model):
        out = model(x)
        logits = out.logits if hasattr(out, "logits") else out
        return logits.square().mean()
    return m, run


#: name -> a builder of (model, run): the model built once, ``run(model)`` one forward to its loss. The zoo
#: entry builds and runs once; the profile benchmark (``bench/user_profiles.py``) runs one model many times,
#: as training does (a new model per step would measure fresh memory, not the backward).
PARTS: dict = {}


def parts(name: str):
    """The zoo entry ``name``'s (model, run), built with the zoo's seed (torch's default dtype as it is)."""
    torch.manual_seed(0)
    return PARTS[name]()


def _entry(name: str, **kw):
    """Register a builder of (model, run) as the zoo entry ``name`` too (which builds and runs once)."""
    def register(fn):
        PARTS[name] = fn

        @model(name, "external", **kw)
        def build():
            m, run = fn()
            return run(m), m
        return fn
    return register


TORCHVISION = {
    "resnet18": {}, "mobilenet_v3_small": {}, "efficientnet_b0": {}, "convnext_tiny": {}, "swin_t": {},
    "densenet121": {}, "shufflenet_v2_x0_5": {}, "regnet_y_400mf": {},
    # GoogLeNet in training mode returns its two auxiliary heads too: the main logits are the loss here.
    "googlenet": {"aux_logits": False, "init_weights": True},
    "vit_b_16": {"image_size": IMAGE, "patch_size": 8, "num_layers": 2, "num_heads": 4, "hidden_dim": 32,
                 "mlp_dim": 64},
}


def _register_torchvision(name: str, kwargs: dict):
    small_vit = name == "vit_b_16"

    @_entry(f"tv_{'vit_small' if small_vit else name}", external="torchvision",
           note=f"torchvision.models.{'VisionTransformer' if small_vit else name}"
                f"({', '.join(f'{k}={v}' for k, v in kwargs.items())}), random weights, "
                f"input 2x3x{LARGER.get(name, IMAGE)}x{LARGER.get(name, IMAGE)}")
    def build():
        tvm = import_torchvision()
        if small_vit:
            return _vision(tvm.VisionTransformer(**kwargs))
        return _vision(getattr(tvm, name)(weights=None, **kwargs), LARGER.get(name, IMAGE))
    return build


for _name, _kw in TORCHVISION.items():
    _register_torchvision(_name, _kw)


# --- timm --------------------------------------------------------------------------------------------------

TIMM = {
    "convnext_atto": {},
    "vit_tiny_patch16_224": {"img_size": IMAGE, "patch_size": 8, "depth": 2},
    "mixer_s16_224": {"img_size": IMAGE, "num_classes": 10},
    "xcit_nano_12_p16_224": {"img_size": IMAGE, "depth": 2},
}


def _register_timm(name: str, kwargs: dict):
    @_entry(f"timm_{name.split('_')[0]}", external="timm",
           note=f"timm.create_model({name!r}, pretrained=False"
                f"{''.join(f', {k}={v}' for k, v in kwargs.items())}), input 2x3x{IMAGE}x{IMAGE}")
    def build():
        return _vision(import_timm().create_model(name, pretrained=False, **kwargs))
    return build


for _name, _kw in TIMM.items():
    _register_timm(_name, _kw)


# --- Hugging Face transformers -----------------------------------------------------------------------------

def _ids(seq: int = 8):
    return torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(1))


def _hf(config: str, cls: str, seq2seq: bool = False, **kw):
    T = import_transformers()
    cfg = getattr(T, config)(**kw)
    cfg._attn_implementation = "eager"
    m = getattr(T, cls)(cfg)
    m.train()
    x = _ids()
    y = _ids(6) if seq2seq else x
    return m, lambda model: model(input_ids=x, labels=y).loss


_DECODER = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=32)
TRANSFORMERS = {
    "gpt2": (("GPT2Config", "GPT2LMHeadModel"),
             dict(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=32)),
    "bert": (("BertConfig", "BertForMaskedLM"), _DECODER),
    "llama": (("LlamaConfig", "LlamaForCausalLM"), dict(_DECODER, num_key_value_heads=2)),
    "qwen2": (("Qwen2Config", "Qwen2ForCausalLM"), dict(_DECODER, num_key_value_heads=2)),
    "mixtral": (("MixtralConfig", "MixtralForCausalLM"),
                dict(_DECODER, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "mamba": (("MambaConfig", "MambaForCausalLM"),
              dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, state_size=8, use_mambapy=True)),
    "t5": (("T5Config", "T5ForConditionalGeneration"),
           dict(vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                decoder_start_token_id=0)),
    "gpt_neox": (("GPTNeoXConfig", "GPTNeoXForCausalLM"), _DECODER),
    "falcon": (("FalconConfig", "FalconForCausalLM"),
               dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4)),
    "gemma2": (("Gemma2Config", "Gemma2ForCausalLM"),
               dict(_DECODER, num_key_value_heads=2, head_dim=8, sliding_window=4)),
    "bart": (("BartConfig", "BartForConditionalGeneration"),
             dict(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32)),
}


def _register_hf(name: str, classes, kwargs: dict):
    @_entry(f"hf_{name}", external="transformers",
           dtype=torch.float32,
           note=f"transformers.{classes[1]}({classes[0]}: {len(kwargs)} fields set, "
                f"{kwargs.get('num_hidden_layers', kwargs.get('n_layer', kwargs.get('num_layers', 1)))} layer(s)), "
                "random weights, 2x8 tokens, the model's own loss")
    def build():
        return _hf(*classes, seq2seq=name in ("t5", "bart"), **kwargs)
    return build


for _name, (_cls, _kw) in TRANSFORMERS.items():
    _register_hf(_name, _cls, _kw)


@_entry("hf_wav2vec2", external="transformers", dtype=torch.float64, tol=(1e-5, 1e-8),
       note="transformers.Wav2Vec2ForCTC (2 conv feature layers, 1 encoder layer, hidden 32), training mode with "
            "SpecAugment time masks (a masked write into a view: CopySlices over IndexPutBackward0; the feature "
            "encoder's input is a leaf the model itself marks requires_grad), random weights, 2x400 samples, "
            "CTC loss (the model takes its log-softmax in float32: float32's tolerance there)")
def hf_wav2vec2():
    T = import_transformers()
    torch.manual_seed(0)  # the time masks are drawn from numpy's generator, the weights from torch's
    cfg = T.Wav2Vec2Config(vocab_size=12, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=64, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                           num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, mask_time_prob=0.3,
                           mask_time_length=2, mask_time_min_masks=1, hidden_dropout=0.0, attention_dropout=0.0,
                           activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0)
    m = T.Wav2Vec2ForCTC(cfg)
    m.train()
    audio, labels = torch.randn(2, 400), torch.randint(1, 12, (2, 5))

    def run(model):
        np.random.seed(0)
        return model(audio, labels=labels).loss
    return m, run


@_entry("hf_whisper", external="transformers", dtype=torch.float32,
       note="transformers.WhisperForConditionalGeneration (1 encoder and 1 decoder layer, d_model 32, 16 mel bins), "
            "random weights, 2x16x32 features, 6 label tokens")
def hf_whisper():
    T = import_transformers()
    cfg = T.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=HIDDEN, encoder_layers=1, decoder_layers=1,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                          decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    cfg._attn_implementation = "eager"
    m = T.WhisperForConditionalGeneration(cfg)
    m.train()
    feats, labels = torch.randn(2, 16, 2 * 16), _ids(6)
    return m, lambda model: model(input_features=feats, labels=labels).loss
