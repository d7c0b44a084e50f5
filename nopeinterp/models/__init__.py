"""The model zoo: one decoder-only HookedTransformer per positional encoding."""

from __future__ import annotations

import inspect

import torch

from nopeinterp._tl import HookedTransformerConfig
from nopeinterp.models.alibi import ALiBiTransformer, alibi_slopes
from nopeinterp.models.ape import LearnedAPETransformer, SinusoidalTransformer
from nopeinterp.models.base import PEAttention, PETransformer
from nopeinterp.models.hf import from_hf
from nopeinterp.models.nope import NoPETransformer
from nopeinterp.models.rotary import RotaryTransformer, rotary_dim
from nopeinterp.models.t5 import T5Transformer, t5_bucket_ids

MODEL_CLASSES: dict[str, type[PETransformer]] = {
    cls.pe: cls
    for cls in (
        NoPETransformer,
        T5Transformer,
        ALiBiTransformer,
        RotaryTransformer,
        LearnedAPETransformer,
        SinusoidalTransformer,
    )
}
PE_TYPES = ("nope", "t5", "alibi", "rotary", "ape", "sinusoidal")
assert tuple(MODEL_CLASSES) == PE_TYPES

# build_model's architecture arguments: what a checkpoint's "config" records.
ARCH_DEFAULTS = {"d_mlp": None, "seed": 0, "act_fn": "relu", "attn_scale": None}


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
    tokenizer=None,
    **pe_options,
) -> PETransformer:
    """A freshly initialised decoder-only model with positional encoding `pe`.

    Pre-LayerNorm blocks, MLP width `d_mlp` (default 4*d_model), heads of d_model/n_heads.
    `n_ctx` is the training context; only learned `ape` is limited by it.
    `attn_scale`: divide logits by sqrt(d_head) (default True; the paper, T5-style, does not).
    `pe_options`: t5 -> num_buckets=32, max_distance=128, shared=True;
    rotary -> fraction=0.25, base=10000. Weights depend only on `seed` and the arguments.
    """
    if pe not in MODEL_CLASSES:
        raise ValueError(f"unknown positional encoding {pe!r}; choose one of {', '.join(PE_TYPES)}")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    d_head = d_model // n_heads
    extra = {}
    if pe == "rotary":
        extra["rotary_dim"] = rotary_dim(d_head, pe_options.get("fraction", 0.25))
        extra["rotary_base"] = pe_options.get("base", 10000)
    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_head,
        d_mlp=d_mlp or 4 * d_model,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        act_fn=act_fn,
        normalization_type="LN",
        attention_dir="causal",
        use_attn_scale=True if attn_scale is None else attn_scale,
        seed=seed,
        device="cpu",
        default_prepend_bos=False,  # our tokenizer's template adds <bos> itself
        **extra,
    )
    with torch.random.fork_rng(devices=[]):  # TL seeds the global RNG; leave the caller's alone
        return MODEL_CLASSES[pe](cfg, tokenizer=tokenizer, **pe_options)


def model_config(model: PETransformer) -> dict:
    """The build_model keyword arguments that rebuild `model` (without its weights)."""
    cfg = model.cfg
    return {
        "pe": model.pe,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "d_model": cfg.d_model,
        "d_vocab": cfg.d_vocab,
        "n_ctx": cfg.n_ctx,
        "d_mlp": cfg.d_mlp,
        "seed": cfg.seed,
        "act_fn": cfg.act_fn,
        "attn_scale": cfg.use_attn_scale,
        **model.pe_options,
    }


BUILD_MODEL_ARGS = frozenset(inspect.signature(build_model).parameters) - {
    "tokenizer",
    "pe_options",
}

__all__ = [
    "MODEL_CLASSES",
    "PE_TYPES",
    "PEAttention",
    "PETransformer",
    "alibi_slopes",
    "build_model",
    "from_hf",
    "model_config",
    "rotary_dim",
    "t5_bucket_ids",
]
