"""``python -m bench replay [--seed N] [--models N] [--only SRC:NAME,...]``: capture and check drawn models.

The zoo (``tests/zoo``) holds fixed models; this draws its cases from everything the installed libraries can
build, from a seed the run prints (``--seed`` repeats one draw): every model name ``timm.list_models()`` lists
(1,371 in timm 1.0.31), torchvision's classification, segmentation and video models, and Hugging Face
transformers architectures from small configs (``HF`` below: 2 layers, hidden size 32; random weights,
nothing downloaded), the libraries taken in turns (timm's names would otherwise be nine draws in ten), until
``--models`` cases have been captured and checked. Each case is a user's commands, each in a fresh process:

1. a script builds the model in float64 with random weights (``torch.set_default_dtype(torch.float64)``; the
   transformers models ``.to(float64)``; a model that cannot run in float64, such as a grouped matrix
   product, in float32), runs one forward in training mode at a small input (64x64 pixels, or the model's
   own input size when it refuses that one; 2x8 tokens) to a scalar loss (the model's own, or the mean
   square of its logits) and captures the backward with its reference (``from_torch(loss, names=...,
   path=g.json)``);
2. ``autograd-run check g.json --allow-python``: the replay's order against PyTorch's executed order, and every
   leaf's gradient against PyTorch's (the check's own tolerances).

Each case ends in one of: ``exact`` (check exit 0), ``wrong`` (exit 3 with an order or gradient that differs),
``not compared`` (exit 3 because an opaque node keeps gradients from being compared: its reason is shown),
``ours failed`` (capture or check stopped with an error), and, not counted against us, ``model`` (the model
itself cannot be built or run at that input, before capture starts), ``too big`` (more than ``--max-params``
parameters: float64 weights, gradients and references would not fit this machine's budget), ``timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

BENCH_WORDS = {"replay", "--quick", "--full", *"abcdefghij"}

V, H = 96, 32  # vocabulary and hidden size of the transformers configs
_DEC = dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=40)
#: Hugging Face architectures: name -> (config class, model class, config fields). Small configs of models
#: nobody here wrote; the draw picks among them.
HF = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=32)),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(vocab_size=V, hidden_size=H, num_layers=2, num_heads=4,
                attention_types=[[["global", "local"], 1]], max_position_embeddings=32, window_size=4)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=32,
             rotary_dim=4)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(vocab_size=V, hidden_size=H, num_hidden_layers=2,
            num_attention_heads=4, ffn_dim=64, max_position_embeddings=32, word_embed_proj_dim=H)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(vocab_size=V, hidden_size=H, n_layer=2, n_head=4)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(vocab_size=V, hidden_size=H, num_hidden_layers=2,
               num_attention_heads=4)),
    "phi": ("PhiConfig", "PhiForCausalLM", _DEC),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(_DEC, num_key_value_heads=2, pad_token_id=0)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_DEC, num_key_value_heads=2, head_dim=8)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_DEC, num_key_value_heads=2, head_dim=8)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(_DEC, num_key_value_heads=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(_DEC, num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(_DEC, num_key_value_heads=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(_DEC, num_key_value_heads=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(_DEC, num_key_value_heads=2, num_local_experts=4,
                num_experts_per_tok=2)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(_DEC, pad_token_id=0)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(_DEC, num_key_value_heads=2)),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(vocab_size=V, n_embd=H, n_layer=2, n_head=4,
                    n_positions=32)),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", dict(vocab_size=V, n_embd=H, n_layer=2, n_head=4,
                n_positions=32, rotary_dim=4)),
    "ctrl": ("CTRLConfig", "CTRLLMHeadModel", dict(vocab_size=V, n_embd=H, n_layer=2, n_head=4, dff=64,
             n_positions=32)),
    "bert": ("BertConfig", "BertForMaskedLM", _DEC),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", _DEC),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM", dict(vocab_size=V, dim=H, n_layers=2, n_heads=4,
                   hidden_dim=64, max_position_embeddings=32)),
    "albert": ("AlbertConfig", "AlbertForMaskedLM", dict(_DEC, embedding_size=16)),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", dict(_DEC, embedding_size=16)),
    "deberta_v2": ("DebertaV2Config", "DebertaV2ForMaskedLM", _DEC),
    "megatron_bert": ("MegatronBertConfig", "MegatronBertForMaskedLM", _DEC),
    "mpnet": ("MPNetConfig", "MPNetForMaskedLM", _DEC),
    "big_bird": ("BigBirdConfig", "BigBirdForMaskedLM", dict(_DEC, attention_type="original_full")),
    "longformer": ("LongformerConfig", "LongformerForMaskedLM", dict(_DEC, attention_window=4)),
    "fnet": ("FNetConfig", "FNetForMaskedLM", dict(_DEC, max_position_embeddings=32)),
    "xlnet": ("XLNetConfig", "XLNetLMHeadModel", dict(vocab_size=V, d_model=H, n_layer=2, n_head=4, d_inner=64)),
    "funnel": ("FunnelConfig", "FunnelForMaskedLM", dict(vocab_size=V, d_model=H, block_sizes=[1, 1], n_head=4,
               d_head=8, d_inner=64)),
    "rwkv": ("RwkvConfig", "RwkvForCausalLM", dict(vocab_size=V, hidden_size=H, num_hidden_layers=2,
             attention_hidden_size=H, intermediate_size=64, context_length=16)),
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, state_size=8,
              use_mambapy=False)),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(vocab_size=V, hidden_size=H, num_hidden_layers=2,
               state_size=8, num_heads=4, head_dim=16, n_groups=1, chunk_size=4)),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=V, d_model=H, d_kv=8, d_ff=64, num_layers=1,
           num_heads=4, decoder_start_token_id=0)),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict(vocab_size=V, d_model=H, encoder_layers=1,
             decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
             decoder_ffn_dim=64, max_position_embeddings=32)),
    "reformer": ("ReformerConfig", "ReformerModelWithLMHead", dict(vocab_size=V, hidden_size=H, num_attention_heads=2,
                 attention_head_size=8, attn_layers=["local", "lsh"], axial_pos_embds=False, feed_forward_size=32,
                 local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, max_position_embeddings=8,
                 is_decoder=True)),
    "vit": ("ViTConfig", "ViTForImageClassification", dict(image_size=32, patch_size=8, hidden_size=H,
            num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)),
    "swin": ("SwinConfig", "SwinForImageClassification", dict(image_size=32, patch_size=4, embed_dim=16,
             depths=[1, 1], num_heads=[2, 4], window_size=4)),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", dict(hidden_sizes=[8, 16], depths=[1, 1],
                 num_stages=2)),
    "segformer": ("SegformerConfig", "SegformerForSemanticSegmentation", dict(num_encoder_blocks=2, depths=[1, 1],
                  sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], decoder_hidden_size=32,
                  strides=[4, 2], patch_sizes=[7, 3], mlp_ratios=[2, 2])),
    "mobilevit": ("MobileViTConfig", "MobileViTForImageClassification", dict(hidden_sizes=[16, 24, 32],
                  neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])),
}
#: Transformers models that take images, not tokens: the side of their square input, in pixels.
HF_IMAGES = {"vit": 32, "swin": 32, "convnext": 32, "segformer": 32, "mobilevit": 64}

# 130 more architectures a sweep found to build and train here (bench/hf_more.py): 174 in all
from bench.hf_more import HF_MORE, HF_MORE_IMAGES, HF_MORE_INPUTS  # noqa: E402

HF.update(HF_MORE)
HF_IMAGES.update(HF_MORE_IMAGES)
#: name -> the inputs CASE builds for an architecture that takes neither token ids with labels nor images
HF_INPUTS = dict(HF_MORE_INPUTS)

#: The user's script for one case (a fresh process): build, one forward, capture. Prints one JSON line.
CASE = '''\
import json, sys, warnings
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
from zoo import external
from bench.replay_external import HF, HF_IMAGES, HF_INPUTS
src, name, max_params = {src!r}, {name!r}, {max_params!r}
dtype = torch.float64
def build(dtype):
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    if src == "timm":
        timm = external.import_timm()
        try:
            m = timm.create_model(name, pretrained=False, img_size=64)
        except TypeError:
            m = timm.create_model(name, pretrained=False)
    elif src.startswith("torchvision"):
        tv = external.import_torchvision()
        part = src.partition(".")[2]
        kw = {{"num_classes": 3, "weights_backbone": None}} if part == "segmentation" else {{}}
        m = getattr(getattr(tv, part) if part else tv, name)(weights=None, **kw)
    else:
        T = external.import_transformers()
        conf, cls, kw = HF[name]
        cfg = getattr(T, conf)(**kw)
        cfg._attn_implementation = "eager"
        m = getattr(T, cls)(cfg).to(dtype)
    n = sum(p.numel() for p in m.parameters())
    if n > max_params:
        print(json.dumps({{"outcome": "too big", "params": n}})); sys.exit(0)
    if src == "hf":
        if name in HF_IMAGES:
            x = torch.randn(2, 3, HF_IMAGES[name], HF_IMAGES[name])
            return m, n, lambda: m(pixel_values=x)
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 96, (2, 8), generator=gen)
        kind, _, arg = HF_INPUTS.get(name, "lm").partition(":")
        a, b = (list(map(int, arg.split(","))) + [0])[:2] if arg else (0, 0)
        if kind == "ids":
            return m, n, lambda: m(input_ids=ids)
        if kind == "ctc":  # waveforms, CTC labels
            x, labels = torch.randn(2, a), torch.randint(3, 96, (2, 4), generator=gen)
            return m, n, lambda: m(input_values=x, labels=labels)
        if kind in ("feat", "s2t"):  # feature maps (channels x time, or time x features), labels
            x = torch.randn(2, a, b)
            return m, n, lambda: m(input_features=x, labels=ids)
        if kind == "ast":  # spectrograms (time x mel bins)
            x = torch.randn(2, a, b)
            return m, n, lambda: m(input_values=x)
        if kind == "clip":  # token ids and images: the contrastive loss
            x = torch.randn(2, 3, a, a)
            return m, n, lambda: m(input_ids=ids, pixel_values=x, return_loss=True)
        return m, n, lambda: m(input_ids=ids, labels=ids)
    x = torch.randn(1, 3, 4, 64, 64) if src == "torchvision.video" else torch.randn(2, 3, 64, 64)
    try:
        with torch.no_grad():
            m.eval(); m(x)
    except Exception:
        cfg = getattr(m, "pretrained_cfg", None) or {{}}
        x = (torch.randn(1, 3, 16, 112, 112) if src == "torchvision.video"
             else torch.randn(2, *cfg.get("input_size", (3, 224, 224))))
    return m, n, lambda: m(x)
def scalar(r):
    if isinstance(r, torch.Tensor):
        return r.square().mean() if r.dim() else r
    if getattr(r, "loss", None) is not None:
        return r.loss
    if hasattr(r, "logits"):
        return r.logits.square().mean()
    if isinstance(r, dict):
        return sum(scalar(v) for v in r.values())
    if isinstance(r, (list, tuple)):
        return sum(scalar(v) for v in r)
    raise TypeError(f"output of type {{type(r).__name__}}")
try:
    try:
        m, n, fwd = build(dtype)
        m.train()
        loss = scalar(fwd())
    except RuntimeError:  # an op without float64 kernels (a grouped matrix product): float32
        dtype = torch.float32
        m, n, fwd = build(dtype)
        m.train()
        loss = scalar(fwd())
except SystemExit:
    raise
except Exception as exc:
    print(json.dumps({{"outcome": "model", "why": f"{{type(exc).__name__}}: {{exc}}"[:300]}})); sys.exit(0)
from autograd_run.capture import from_torch
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    doc = from_torch(loss, names=dict(m.named_parameters()), path={graph!r})
opaque = [f"{{d['name']}}: {{d.get('attrs', {{}}).get('reason', '')}}" for d in doc["nodes"] if d.get("op") == "opaque"]
print(json.dumps({{"outcome": "captured", "params": n, "nodes": len(doc["nodes"]), "dtype": str(dtype)[6:],
                  "opaque": opaque[:3]}}))
'''


def candidates() -> list[tuple[str, str]]:
    """(source, name) of every model the installed libraries can build here (a library that cannot be imported
    adds none, and says why on stderr)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from zoo import external
    out: list[tuple[str, str]] = []
    try:
        tv = external.import_torchvision()
        out += [("torchvision", n) for n in tv.list_models(module=tv)]
        out += [("torchvision.segmentation", n) for n in tv.list_models(module=tv.segmentation)]
        out += [("torchvision.video", n) for n in tv.list_models(module=tv.video)]
    except ImportError as exc:
        print(f"replay: no torchvision models ({exc})", file=sys.stderr)
    try:
        out += [("timm", n) for n in external.import_timm().list_models()]
    except ImportError as exc:
        print(f"replay: no timm models ({exc})", file=sys.stderr)
    try:
        external.import_transformers()
        out += [("hf", n) for n in HF]
    except ImportError as exc:
        print(f"replay: no transformers models ({exc})", file=sys.stderr)
    return out


#: ``autograd-run check`` in a fresh process, with the environment fix the capture script has: the registry's
#: torchvision is a CUDA build whose ops do not load next to the CPU torch (``zoo.external.import_torchvision``), and
#: a Python node's module (transformers' ``GeLUFunction``, imported to replay it) imports torchvision through
#: transformers; in a user's environment torchvision works. The CLI is then run as the console script runs it.
CHECK = """
import sys
sys.path.insert(0, {tests!r})
from zoo import external
try:
    external.import_torchvision()
except ImportError:
    pass
from autograd_run.cli.main import main
sys.argv[0] = "autograd-run"
main()
"""


def one(src: str, name: str, folder: str, env: dict, max_params: int, timeout: float) -> dict:
    """One case: the capture script, then ``autograd-run check``, each a fresh process."""
    graph = os.path.join(folder, f"{src}_{name}.json")
    script = CASE.format(tests=os.path.join(ROOT, "tests"), src=src, name=name, graph=graph, max_params=max_params)
    row = {"source": src, "name": name}
    try:
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(row, outcome="timeout", why=f"capture over {timeout:.0f} s")
    last = (p.stdout.strip().splitlines() or [""])[-1]
    if p.returncode != 0 or not last.startswith("{"):
        return dict(row, outcome="ours failed", why=((p.stderr.strip().splitlines() or ["?"])[-1])[:300])
    got = json.loads(last)
    row.update(got)
    if got["outcome"] != "captured":
        return row
    try:
        q = subprocess.run([sys.executable, "-c", CHECK.format(tests=os.path.join(ROOT, "tests")), "check", graph,
                            "--allow-python"], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(row, outcome="timeout", why=f"check over {timeout:.0f} s")
    text = (q.stdout + q.stderr).strip()
    if q.returncode == 0:
        row["outcome"] = "exact"
    elif q.returncode == 3 and NOT_COMPARED in text:
        row["outcome"] = "not compared"
        row["why"] = (row["opaque"] or ["?"])[0][:300]
    elif q.returncode == 3:
        row["outcome"] = "wrong"
        row["why"] = " | ".join(ln for ln in text.splitlines() if ln.strip())[-600:]
    else:
        row["outcome"] = "ours failed"
        row["why"] = (text.splitlines() or ["?"])[-1][:300]
    return row


OURS = ("exact", "wrong", "not compared", "ours failed")
#: What ``check`` says (exit 3) when the order and every compared gradient agree and opaque nodes kept the rest
#: from being compared (else it says the replay differs).
NOT_COMPARED = "opaque nodes keep gradients from being compared"


def draw(pool: list[tuple[str, str]], rng: random.Random):
    """The pool in a random order that takes the libraries (timm, torchvision, hf) in turns, each library's
    models shuffled: timm's 1,371 names would otherwise be nine draws in ten."""
    by_lib: dict[str, list] = {}
    for case in pool:
        by_lib.setdefault(case[0].partition(".")[0], []).append(case)
    queues = [rng.sample(v, len(v)) for _, v in sorted(by_lib.items())]
    while any(queues):
        for q in queues:
            if q:
                yield q.pop()


def main(argv: list[str] | None = None, quick: bool = False) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--models", type=int, default=10 if quick else 30,
                   help="models captured and checked (default 30); models drawn that do not run here (too big, "
                        "or failing in their own forward) are counted apart, up to 4x this many draws in all")
    p.add_argument("--only", default="", help="comma-separated SOURCE:NAME (timm:resnet18, hf:gpt2, "
                                               "torchvision:alexnet) instead of a draw")
    p.add_argument("--max-params", type=float, default=25e6, help="larger models are not run (default 25e6)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per command (default 600)")
    args, _ = p.parse_known_args([a for a in (argv or []) if a not in BENCH_WORDS])
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"replay: seed {seed} (python -m bench replay --seed {seed} repeats this draw)", flush=True)
    if args.only:
        cases = [tuple(c.split(":", 1)) for c in args.only.split(",") if c]
        if any(len(c) != 2 for c in cases):
            p.error("--only takes SOURCE:NAME entries (timm:resnet18, hf:gpt2, torchvision:alexnet)")
        wanted = len(cases)
    else:
        pool = candidates()
        libraries = sorted({src.partition(".")[0] for src, _ in pool})
        print(f"replay: drawing until {args.models} models are checked, in turns from {', '.join(libraries)} "
              f"({len(pool)} models)", flush=True)
        cases, wanted = draw(pool, random.Random(seed)), args.models
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as folder:
        for src, name in cases:
            if sum(r["outcome"] in OURS for r in rows) >= wanted or len(rows) >= 4 * wanted:
                break
            r = one(src, name, folder, env, int(args.max_params), args.timeout)
            rows.append(r)
            detail = (f"{r['nodes']:5d} nodes {r.get('dtype', '')}" if "nodes" in r else "")
            print(f"  {src + ':' + name:48.48s} {r['outcome']:12s} {detail} {r.get('why', '')[:160]}", flush=True)
    counts = {k: sum(r["outcome"] == k for r in rows) for k in (*OURS, "model", "too big", "timeout")}
    ran = sum(counts[k] for k in OURS)
    print(f"replay: {ran} captured and checked: {counts['exact']} exact, {counts['not compared']} not compared "
          f"(opaque), {counts['wrong']} wrong, {counts['ours failed']} failed; not run: {counts['model']} the "
          f"model itself fails here, {counts['too big']} too big, {counts['timeout']} timed out", flush=True)
    return {"seed": seed, "counts": counts, "cases": rows}


if __name__ == "__main__":
    main(sys.argv[1:])
