"""A freshly initialised twin of any model the analyses take: the random-init baseline of the
probes."""

from __future__ import annotations

import copy

import torch

from nopeinterp._tl import tl_deprecation_silenced


def random_init_like(model, seed: int | None = None):
    """A model with `model`'s config (and PE) and fresh weights drawn with `seed`.

    `seed` defaults to the model's own config seed + 1 (0 + 1 when it has none), so the
    baseline never shares the trained model's initial weights. Works for our models
    (rebuilt with `build_model`), for any model `from_hf` imported (a transformers model
    initialised from a copy of its config, nothing downloaded, then imported the same way) and
    for any other stock TransformerLens model (its class constructed again from a copy of its
    cfg, with weight initialisation on). The caller's RNG state is left alone.
    """
    device = next(model.parameters()).device
    if seed is None:
        seed = (getattr(model.cfg, "seed", None) or 0) + 1
    if getattr(model, "hf_config", None) is not None:  # imported: re-initialise its HF model
        from nopeinterp.models.hf import from_hf

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fresh = from_hf(
                _hf_model_from_config(model.hf_config).to(model.cfg.dtype),
                tokenizer=getattr(model, "tokenizer", None),
                n_ctx=model.cfg.n_ctx,
            )
        fresh.cfg.seed = seed
    elif getattr(model, "pe", None) is not None:  # one of ours: rebuild from its recorded config
        from nopeinterp.models import build_model, model_config

        fresh = build_model(
            **{**model_config(model), "seed": seed},
            dtype=model.cfg.dtype,
            tokenizer=getattr(model, "tokenizer", None),
        )
    else:
        cfg = copy.deepcopy(model.cfg)
        cfg.seed = seed
        cfg.init_weights = True  # a converted model's cfg says False: its weights were loaded
        with torch.random.fork_rng(devices=[]), tl_deprecation_silenced():
            fresh = type(model)(cfg, tokenizer=getattr(model, "tokenizer", None))
    if next(fresh.parameters()).device != device:
        fresh = fresh.to(device)
    return fresh


def _hf_model_from_config(hf_config):
    """A transformers causal LM with fresh weights from a copy of `hf_config` (no download)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(copy.deepcopy(hf_config))
