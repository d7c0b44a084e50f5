"""The model zoo: decoder-only transformers with a positional encoding per layer."""

from __future__ import annotations

import torch

from nopeinterp.errors import check_choice
from nopeinterp.models.alibi import alibi_slopes
from nopeinterp.models.base import PEAttention, PETransformer
from nopeinterp.models.config import ModelConfig
from nopeinterp.models.registry import ARCH_LAYOUTS, LAYER_PES, MODEL_CLASSES
from nopeinterp.models.rotary import check_rope_scaling, rope_frequencies, rotary_dim
from nopeinterp.models.t5 import t5_bucket_ids
from nopeinterp.models.t5_arch import ARCH_TYPES, T5_EPS, check_arch
from nopeinterp.options import PAPER_PE_TYPES, PE_TYPES
from nopeinterp.tasks.tokenizer import adds_bos

LAYER_PE_TYPES = tuple(LAYER_PES)  # the PEs a model may mix per layer (`layer_pe=`)
assert tuple(MODEL_CLASSES) == PE_TYPES

# build_model's architecture arguments: what a checkpoint's "config" records.
ARCH_DEFAULTS = {
    "arch": "default",
    "d_head": None,
    "d_mlp": None,
    "seed": 0,
    "act_fn": "relu",
    "attn_scale": None,
    "layer_pe": None,
    "dropout": 0.0,
}

# TL's positional_embedding_type -> our PE name, for stock HookedTransformers.
_TL_PE_NAMES = {
    "standard": "ape",
    "rotary": "rotary",
    "alibi": "alibi",
    "relative_positional_bias": "t5",
    "shortformer": "shortformer",
}


def resolve_device(device=None) -> torch.device:
    """None or "auto": cuda if available, else mps if available, else cpu; else `device`."""
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(device)


def build_model(
    pe: str,
    *,
    n_layers: int,
    n_heads: int,
    d_model: int,
    d_vocab: int,
    n_ctx: int,
    d_mlp: int | None = None,
    seed: int = 0,
    act_fn: str = "relu",
    attn_scale: bool | None = None,
    layer_pe: list[str] | None = None,
    dropout: float = 0.0,
    arch: str = "default",
    d_head: int | None = None,
    device=None,
    dtype: torch.dtype | None = None,
    init_weights: bool = True,
    tokenizer=None,
    **pe_options,
) -> PETransformer:
    """A freshly initialised decoder-only model with positional encoding `pe`.

    Pre-LayerNorm blocks, MLP width `d_mlp` (default 4*d_model), heads of d_model/n_heads.
    `n_ctx` is the training context; only learned `ape` is limited by it.
    `attn_scale`: divide logits by sqrt(d_head) (default True; the paper, T5-style, does not).
    `layer_pe`: one PE per layer from LAYER_PE_TYPES (e.g. ["rotary"] * 3 + ["nope"], a
    SmolLM3-style stack); `pe` must be one of them (it names the model). Default: `pe` in
    every layer.
    `dropout`: on the embeddings, the attention weights and the attention and MLP outputs, in
    training mode (the paper: 0.1; with arch="t5" also after the ReLU and the final norm).
    `arch`: "default" (GPT-2's pre-LayerNorm block with biases) or "t5" (the paper's own model,
    T5's decoder: RMS norm, no biases, unscaled logits by default, tied output scaled by
    d_model^-0.5, T5's initialisation; see `nopeinterp.models.t5_arch`).
    `d_head`: each head's width (default d_model / n_heads; any value: n_heads x d_head need
    not equal d_model, as T5's d_kv).
    `device`: where the model lives (None: `resolve_device()`); weights depend only on `seed`
    and the arguments, not on the device (they are initialised on the CPU).
    `dtype`: of the weights (default float32; e.g. torch.bfloat16 for a large model).
    `init_weights=False` skips the random initialisation, for a caller that then loads every
    weight (a large model builds in seconds).
    `pe_options`: t5 -> num_buckets=32, max_distance=128, shared=True;
    rotary -> fraction=0.25, base=10000, rope_scaling=None;
    fire -> fire_hidden=32, fire_c=1.0, fire_threshold=n_ctx, shared=True; kerple -> shared;
    nope -> logit_scale=None|"learned"|float|list, log_scale=0.0, log_floor=1.
    """
    check_choice(pe, PE_TYPES, "positional encoding", error=ValueError)
    check_arch(arch)
    if arch == "t5" and act_fn != "relu":
        raise ValueError(f"arch='t5' has T5's ReLU feed-forward, got act_fn={act_fn!r}")
    if d_head is None and d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    if d_head is not None and (type(d_head) is not int or d_head < 1):
        raise ValueError(f"d_head must be a positive integer, got {d_head!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if layer_pe is not None:
        layer_pe = list(layer_pe)
        if len(layer_pe) != n_layers:
            raise ValueError(f"layer_pe has {len(layer_pe)} entries for n_layers={n_layers}")
        unknown = [p for p in layer_pe if p not in LAYER_PES]
        if unknown:
            raise ValueError(
                f"layer_pe: {unknown[0]!r} is not a per-layer PE; choose from "
                f"{', '.join(LAYER_PE_TYPES)}"
            )
        if pe not in layer_pe:
            raise ValueError(f"pe={pe!r} names the model, so it must be one of layer_pe")
        if len(set(layer_pe)) == 1:
            layer_pe = None  # uniform: the same model as without layer_pe
    d_head = d_head or d_model // n_heads
    t5 = arch == "t5"
    extra = {"normalization_type": "RMS", "eps": T5_EPS} if t5 else {"normalization_type": "LN"}
    if pe == "rotary" or (layer_pe and "rotary" in layer_pe):
        extra["rotary_dim"] = rotary_dim(d_head, pe_options.get("fraction", 0.25))
        extra["rotary_base"] = pe_options.get("base", 10000)
        extra["rotary_adjacent_pairs"] = t5  # the official rotary: GPT-J's interleaved pairs
    device = resolve_device(device)
    cfg = ModelConfig(
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_head,
        d_mlp=d_mlp or 4 * d_model,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        act_fn=act_fn,
        use_attn_scale=(not t5) if attn_scale is None else attn_scale,
        seed=seed,
        device="cpu",  # initialised here, then moved: same weights on every device
        dtype=dtype or torch.float32,
        init_weights=init_weights,
        # to_tokens keeps the <bos> our tokenizer template adds (False would strip it); a
        # tokenizer without a start token (the no-<bos> SCAN split) gets none added
        default_prepend_bos=tokenizer is not None and adds_bos(tokenizer),
        **extra,
    )
    with torch.random.fork_rng(devices=[]):  # init_weights seeds the global RNG: not the caller's
        model = MODEL_CLASSES[pe](
            cfg,
            tokenizer=tokenizer,
            layer_pes=LAYER_PES,
            layer_pe=layer_pe,
            dropout=dropout,
            arch=arch,
            arch_layouts=ARCH_LAYOUTS,
            **pe_options,
        )
    if dtype is not None and dtype != torch.float32:  # the PE modules' own tensors too
        model.to(dtype)
    if device.type != "cpu":
        model.to(device)
    return model


def model_config(model: PETransformer) -> dict:
    """The build_model keyword arguments that rebuild `model` (without its weights)."""
    cfg = model.cfg
    mixed = len(set(model.layer_pe)) > 1
    return {
        "pe": model.pe,
        "arch": model.arch,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "d_model": cfg.d_model,
        "d_head": cfg.d_head,
        "d_vocab": cfg.d_vocab,
        "n_ctx": cfg.n_ctx,
        "d_mlp": cfg.d_mlp,
        "seed": cfg.seed,
        "act_fn": cfg.act_fn,
        "attn_scale": cfg.use_attn_scale,
        "layer_pe": list(model.layer_pe) if mixed else None,
        "dropout": model.dropout,
        **model.pe_options,
    }


def layer_pes(model) -> list[str]:
    """Each layer's positional encoding, for labelling per-layer results: ours (from the
    model's layer_pe; "ape"/"sinusoidal" on every layer of an absolute-embedding model) and
    stock TransformerLens HookedTransformers (from cfg.positional_embedding_type)."""
    n_layers = model.cfg.n_layers
    if isinstance(model, PETransformer):
        return [model.pe] * n_layers if model.absolute_embedding else list(model.layer_pe)
    if getattr(model, "layer_pe", None) is not None:  # a bridge over SmolLM3 (TL 4)
        return list(model.layer_pe)
    kind = model.cfg.positional_embedding_type
    return [_TL_PE_NAMES.get(kind, kind)] * n_layers


def set_rope_scaling(model: PETransformer, rope_scaling: dict | None) -> PETransformer:
    """Use RoPE scaling (transformers' rope_parameters spelling, e.g. {"rope_type": "yarn",
    "factor": 4.0, "original_max_position_embeddings": 64}; None or "default": none) in every
    rotary layer of `model`, without retraining. Returns the model (changed in place)."""
    if not isinstance(model, PETransformer):
        raise ValueError(
            "rope_scaling applies to nopeinterp's own rotary layers (our models, SmolLM3); "
            f"this is a {type(model).__name__} (a Llama 3 model brings its own scaling)"
        )
    rotary_layers = [b.attn for b in model.blocks if getattr(b.attn, "rotary", False)]
    if not rotary_layers:
        raise ValueError(
            f"rope_scaling needs a rotary layer; this model's layers: {layer_pes(model)}"
        )
    base = model.pe_options.get("base", 10000)
    scaling = check_rope_scaling(rope_scaling, base, model.cfg.n_ctx)
    for attn in rotary_layers:
        attn.set_rope_scaling(scaling)
    model.pe_options.pop("rope_scaling", None)
    if scaling is not None:
        model.pe_options["rope_scaling"] = scaling
    return model


__all__ = [
    "ARCH_TYPES",
    "LAYER_PE_TYPES",
    "MODEL_CLASSES",
    "PAPER_PE_TYPES",
    "PE_TYPES",
    "PEAttention",
    "PETransformer",
    "alibi_slopes",
    "build_model",
    "layer_pes",
    "model_config",
    "resolve_device",
    "rope_frequencies",
    "rotary_dim",
    "set_rope_scaling",
    "t5_bucket_ids",
]
