"""Models nobody here wrote, for the DDP / FSDP2 sweep (bench/dp_sweep.py): torchvision, timm and Hugging Face
transformers from small configs with random weights (nothing downloaded), through tests/zoo/external.py's
importers and helpers. ``parts(name)`` -> (model, run) with torch.manual_seed(SEED) first."""

from __future__ import annotations

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.join(ROOT, "tests") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "tests"))

from zoo import external as X  # noqa: E402

SEED = 0
SIDE = 32


def _tv(name, side=SIDE, **kw):
    return lambda: X._vision(getattr(X.import_torchvision(), name)(weights=None, **kw), side)


def _timm(name, side=SIDE, **kw):
    return lambda: X._vision(X.import_timm().create_model(name, pretrained=False, **kw), side)


def _hf(config, cls, seq2seq=False, **kw):
    return lambda: X._hf(config, cls, seq2seq=seq2seq, **kw)


def _frozen_resnet():
    """resnet18 fine-tuned: the stem and layer1 frozen (requires_grad False)."""
    m, run = X._vision(X.import_torchvision().resnet18(weights=None, num_classes=10))
    for mod in (m.conv1, m.bn1, m.layer1):
        for p in mod.parameters():
            p.requires_grad_(False)
    return m, run


def _hf_vit():
    T = X.import_transformers()
    cfg = T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      image_size=32, patch_size=8, num_labels=10)
    cfg._attn_implementation = "eager"
    m = T.ViTForImageClassification(cfg)
    return X._vision(m)


def _ckpt(build, reentrant):
    """An HF model with gradient checkpointing on (its own API), reentrant or not."""
    def make():
        m, run = build()
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        m.train()
        return m, run
    return make


def _timm_ckpt(name, side=SIDE, **kw):
    def make():
        m, run = _timm(name, side, **kw)()
        m.set_grad_checkpointing(True)
        return m, run
    return make


D = X._DECODER
MODELS = {
    # torchvision
    "tv_mobilenet_v2": _tv("mobilenet_v2", num_classes=10),
    "tv_mnasnet0_5": _tv("mnasnet0_5", num_classes=10),
    "tv_squeezenet1_1": _tv("squeezenet1_1", side=64, num_classes=10),
    "tv_shufflenet_v2_x0_5": _tv("shufflenet_v2_x0_5"),
    "tv_regnet_x_400mf": _tv("regnet_x_400mf", num_classes=10),
    "tv_resnet18_frozen": _frozen_resnet,
    "tv_mobilenet_v3_small": _tv("mobilenet_v3_small"),
    # timm
    "timm_lcnet_050": _timm("lcnet_050", num_classes=10),
    "timm_mobilevit_xxs": _timm("mobilevit_xxs", side=64, num_classes=10),
    "timm_edgenext_xx_small": _timm("edgenext_xx_small", side=64, num_classes=10),
    "timm_levit_128s": _timm("levit_128s", side=64, num_classes=10),
    "timm_tinynet_e": _timm("tinynet_e", num_classes=10),
    "timm_ghostnet_050": _timm("ghostnet_050", num_classes=10),
    "timm_deit_tiny": _timm("deit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10),
    "timm_dla46_c": _timm("dla46_c", num_classes=10),
    "timm_mixnet_s": _timm("mixnet_s", num_classes=10),
    "timm_resnet10t": _timm("resnet10t", num_classes=10),
    "timm_regnetx_002": _timm("regnetx_002", num_classes=10),
    "timm_rexnet_100": _timm("rexnet_100", num_classes=10),
    # transformers
    "hf_opt": _hf("OPTConfig", "OPTForCausalLM", vocab_size=96, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, ffn_dim=64, max_position_embeddings=32, word_embed_proj_dim=32),
    "hf_distilbert": _hf("DistilBertConfig", "DistilBertForMaskedLM", vocab_size=96, dim=32, n_layers=2,
                         n_heads=4, hidden_dim=64, max_position_embeddings=32),
    "hf_albert": _hf("AlbertConfig", "AlbertForMaskedLM", vocab_size=96, embedding_size=16, hidden_size=32,
                     num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32),
    "hf_roberta": _hf("RobertaConfig", "RobertaForMaskedLM", **dict(D, max_position_embeddings=40)),
    "hf_electra": _hf("ElectraConfig", "ElectraForMaskedLM", vocab_size=96, embedding_size=16, hidden_size=32,
                      num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32),
    "hf_mistral": _hf("MistralConfig", "MistralForCausalLM", **dict(D, num_key_value_heads=2)),
    "hf_phi": _hf("PhiConfig", "PhiForCausalLM", **D),
    "hf_bloom": _hf("BloomConfig", "BloomForCausalLM", vocab_size=96, hidden_size=32, n_layer=2, n_head=4),
    "hf_gptj": _hf("GPTJConfig", "GPTJForCausalLM", vocab_size=96, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                   n_positions=32),
    "hf_xlnet": _hf("XLNetConfig", "XLNetLMHeadModel", vocab_size=96, d_model=32, n_layer=2, n_head=4, d_inner=64),
    "hf_mixtral": _hf("MixtralConfig", "MixtralForCausalLM",
                      **dict(D, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "hf_vit": _hf_vit,
    "hf_gpt2": _hf("GPT2Config", "GPT2LMHeadModel", vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=32),
    "hf_t5": _hf("T5Config", "T5ForConditionalGeneration", seq2seq=True, vocab_size=96, d_model=32, d_kv=8, d_ff=64,
                 num_layers=1, num_heads=4, decoder_start_token_id=0),
}
MODELS.update({
    "hf_gpt2_ckpt": _ckpt(MODELS["hf_gpt2"], False),
    "hf_mistral_ckpt_re": _ckpt(MODELS["hf_mistral"], True),
    "hf_mistral_ckpt": _ckpt(MODELS["hf_mistral"], False),
    "hf_bert_ckpt_re": _ckpt(_hf("BertConfig", "BertForMaskedLM", **D), True),
    "timm_deit_tiny_ckpt": _timm_ckpt("deit_tiny_patch16_224", img_size=32, patch_size=8, depth=3, num_classes=10),
})


def parts(name: str):
    torch.manual_seed(SEED)
    return MODELS[name]()
