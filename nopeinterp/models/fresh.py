"""A freshly initialised twin of any HookedTransformer: the random-init baseline of the probes."""

from __future__ import annotations

import copy

import torch

from nopeinterp._tl import tl_deprecation_silenced


def random_init_like(model, seed: int | None = None):
    """A model with `model`'s config (and PE) and fresh weights drawn with `seed`.

    `seed` defaults to the model's own config seed + 1 (0 + 1 when it has none), so the
    baseline never shares the trained model's initial weights. Works for our models
    (rebuilt with `build_model`) and for any stock TransformerLens HookedTransformer (its
    class constructed again from a copy of its cfg). The caller's RNG state is left alone.
    """
    device = next(model.parameters()).device
    if seed is None:
        seed = (getattr(model.cfg, "seed", None) or 0) + 1
    if getattr(model, "pe", None) is not None:  # one of ours: rebuild from its recorded config
        from nopeinterp.models import build_model, model_config

        fresh = build_model(
            **{**model_config(model), "seed": seed},
            dtype=model.cfg.dtype,
            tokenizer=getattr(model, "tokenizer", None),
        )
    else:
        cfg = copy.deepcopy(model.cfg)
        cfg.seed = seed
        with torch.random.fork_rng(devices=[]), tl_deprecation_silenced():
            fresh = type(model)(cfg, tokenizer=getattr(model, "tokenizer", None))
    if next(fresh.parameters()).device != device:
        fresh = fresh.to(device)
    return fresh
