"""Hugging Face causal LMs as HookedTransformers: `from_hf(model_or_local_dir)`.

Supported: GPT-2 (learned APE), GPT-NeoX / Pythia (rotary on part of each head), Bloom
(ALiBi), Llama, Mistral and Qwen2 (rotary, grouped-query attention), and SmolLM3 (RoPE or NoPE
per layer, `no_rope_layers`: 1 = RoPE, 0 = NoPE), which becomes our own per-layer model
(`build_model(..., layer_pe=[...])`'s class). The weights go through TransformerLens 3.9's own
converters (`transformer_lens.pretrained.weight_conversions`); the HookedTransformerConfig is
built here from the transformers config, because TL's `convert_hf_model_config` wants a hub
name or directory (not an in-memory model) and fails on GPT-2 under transformers 5 (no `n_ctx`).

RoPE scaling: Llama 3's ("llama3") in TL's own rotary; "linear", "dynamic" and "yarn" on
SmolLM3, in our rotary layers (`set_rope_scaling`); anything else is refused. Unsupported
options (biases Llama has not, Qwen2's partial sliding window, post-LN Bloom, ...) raise
HFModelError, one line, rather than convert to a different model.

Nothing is folded or centred: the converted model computes what the Hugging Face one does, in
the same basis, so `hook_resid_*` are the Hugging Face hidden states. (TL's LayerNorm folding
into the unembedding also goes wrong when d_vocab == d_model.)

Nothing downloads: a directory is read with `from_pretrained(dir, local_files_only=True)`,
never with remote code, and a tokenizer is attached as given (TL's `set_tokenizer` would
re-load it by name). Each layer's PE, for the analyses: `nopeinterp.models.layer_pes(model)`
(from our per-layer model for SmolLM3, from `cfg.positional_embedding_type` for the others:
GPT-2 "ape", NeoX/Llama/Mistral/Qwen2 "rotary", Bloom "alibi"); `model.pe_options` holds the
rotary fraction and base; `model.hf_architecture` the transformers class name.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nopeinterp._tl import (
    TL4,
    Attention,
    HookedTransformer,
    HookedTransformerConfig,
    bridge,
    tl_deprecation_silenced,
)
from nopeinterp.models.alibi import alibi_slopes
from nopeinterp.models.codellm import CodeLLMError, from_codellm, is_codellm_dir
from nopeinterp.models.config import ModelConfig
from nopeinterp.models.context import DEFAULT_MAX_CTX, HFModelError, _ctx
from nopeinterp.models.hf_fused import (
    install_fused_activation,
    install_fused_attention,
    install_fused_unembed,
)

# Rotary and ALiBi models have no hard length limit, but TL keeps a rotary table of n_ctx rows
# per layer (and older TL versions an n_ctx x n_ctx mask): their context is capped by default.

# transformers activation names -> TL's (only those whose formulas agree).
_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_fast": "gelu_fast",
    "gelu_pytorch_tanh": "gelu_pytorch_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


@functools.cache
def _bloom_attention():
    """TL 3.9 attention with BLOOM's ALiBi slopes for any number of heads.

    TL 3.9 computes ALiBi slopes for a power-of-two head count only (BLOOM-176B has 112
    heads); its forward caches `self.alibi` and rebuilds it when a longer input comes. Every
    tensor it stores there is rebuilt here, same shape, with `alibi_slopes` (BLOOM's rule).
    (A function: the class exists under TL 3.9 only.)
    """

    class BloomAttention(Attention):
        @property
        def alibi(self):
            return self._alibi

        @alibi.setter
        def alibi(self, value):
            if value is not None:
                distance = Attention.create_alibi_slope(value.size(-1), value.device)  # -(q - k)
                slopes = alibi_slopes(self.cfg.n_heads).to(value.device, value.dtype)
                value = slopes[:, None, None] * distance.to(value.dtype)
            self._alibi = value

    return BloomAttention


@dataclass(frozen=True)
class _Family:
    pe: str  # the kind of conversion: "ape", "rotary", "alibi" or "per-layer" (SmolLM3)
    converter: str  # function name in transformer_lens.pretrained.weight_conversions
    config: Any  # hf_config -> HookedTransformerConfig keyword arguments


def _require(ok: bool, arch: str, what: str) -> None:
    if not ok:
        raise HFModelError(f"{arch}: {what} is not supported by from_hf")


def _act(hf_config, arch: str, name: str) -> str:
    act = getattr(hf_config, name)
    _require(act in _ACTIVATIONS, arch, f"activation {act!r}")
    return _ACTIVATIONS[act]


def _rope(hf_config, arch: str, scaled=()) -> tuple[float, float, dict | None]:
    """(rope_theta, partial_rotary_factor, RoPE scaling or None) of a transformers config (v5
    `rope_parameters`, or the older top-level fields); `scaled`: the RoPE scalings allowed."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    params.update(getattr(hf_config, "rope_scaling", None) or {})
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    _require(
        rope_type == "default" or rope_type in scaled,
        arch,
        f"RoPE scaling {rope_type!r}",
    )
    theta = params.pop("rope_theta", getattr(hf_config, "rope_theta", None))
    fraction = params.pop(
        "partial_rotary_factor",
        getattr(hf_config, "partial_rotary_factor", getattr(hf_config, "rotary_pct", 1.0)),
    )
    _require(theta is not None, arch, "a config without rope_theta")
    scaling = None
    if rope_type == "yarn":  # transformers' default for the length the model was trained at
        params.setdefault("original_max_position_embeddings", hf_config.max_position_embeddings)
    if rope_type == "dynamic":  # transformers grows the base past max_position_embeddings
        params["original_max_position_embeddings"] = hf_config.max_position_embeddings
    if rope_type != "default":
        scaling = {"rope_type": rope_type, **params}
    return float(theta), float(fraction), scaling


def _gpt2_config(c, arch, n_ctx):
    _require(not getattr(c, "add_cross_attention", False), arch, "cross-attention")
    return {
        "d_model": c.n_embd,
        "d_head": c.n_embd // c.n_head,
        "n_heads": c.n_head,
        "d_mlp": c.n_inner or 4 * c.n_embd,
        "n_layers": c.n_layer,
        "n_ctx": n_ctx if n_ctx is not None else c.n_positions,
        "eps": c.layer_norm_epsilon,
        "d_vocab": c.vocab_size,
        "act_fn": _act(c, arch, "activation_function"),
        "use_attn_scale": c.scale_attn_weights,
        "scale_attn_by_inverse_layer_idx": c.scale_attn_by_inverse_layer_idx,
        "normalization_type": "LN",
        "positional_embedding_type": "standard",
    }


def _neox_config(c, arch, n_ctx):
    _require(getattr(c, "attention_bias", True), arch, "attention_bias=False")
    theta, fraction, _ = _rope(c, arch)
    d_head = c.hidden_size // c.num_attention_heads
    return {
        "d_model": c.hidden_size,
        "d_head": d_head,
        "n_heads": c.num_attention_heads,
        "d_mlp": c.intermediate_size,
        "n_layers": c.num_hidden_layers,
        "n_ctx": n_ctx,
        "eps": c.layer_norm_eps,
        "d_vocab": c.vocab_size,
        "act_fn": _act(c, arch, "hidden_act"),
        "parallel_attn_mlp": c.use_parallel_residual,
        "normalization_type": "LN",
        "positional_embedding_type": "rotary",
        "rotary_dim": int(d_head * fraction),
        "rotary_base": theta,
        "rotary_adjacent_pairs": False,
    }


def _bloom_config(c, arch, n_ctx):
    _require(
        not c.apply_residual_connection_post_layernorm,
        arch,
        "apply_residual_connection_post_layernorm=True",
    )
    return {
        "d_model": c.hidden_size,
        "d_head": c.hidden_size // c.n_head,
        "n_heads": c.n_head,
        "d_mlp": 4 * c.hidden_size,
        "n_layers": c.n_layer,
        "n_ctx": n_ctx,
        "eps": c.layer_norm_epsilon,
        "d_vocab": c.vocab_size,
        "act_fn": "gelu_fast",  # Bloom's own tanh GELU, hard-coded in transformers
        "normalization_type": "LN",
        "post_embedding_ln": True,
        "positional_embedding_type": "alibi",
    }


def _llama_config(c, arch, n_ctx):
    _require(not getattr(c, "attention_bias", False), arch, "attention_bias=True")
    _require(not getattr(c, "mlp_bias", False), arch, "mlp_bias=True")
    window = getattr(c, "sliding_window", None)
    # Mistral slides its window in every layer (TL: local attention over the last `window`
    # keys, as transformers' mask); Qwen2 only in some, which TL cannot express.
    _require(window is None or arch == "MistralForCausalLM", arch, "sliding-window attention")
    # RoPE scaling: Llama 3's in TL (NTK-by-parts), the others in our per-layer model
    theta, fraction, scaling = _rope(c, arch, scaled=_SCALINGS.get(arch, ()))
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    n_kv = c.num_key_value_heads or c.num_attention_heads
    return {
        "d_model": c.hidden_size,
        "d_head": d_head,
        "n_heads": c.num_attention_heads,
        # TL's Mistral and Qwen2 converters always write grouped K/V weights.
        "n_key_value_heads": n_kv
        if n_kv != c.num_attention_heads or arch != "LlamaForCausalLM"
        else None,
        "d_mlp": c.intermediate_size,
        "n_layers": c.num_hidden_layers,
        "n_ctx": n_ctx,
        "eps": c.rms_norm_eps,
        "d_vocab": c.vocab_size,
        "act_fn": _act(c, arch, "hidden_act"),
        "normalization_type": "RMS",
        "final_rms": True,
        "gated_mlp": True,
        "positional_embedding_type": "rotary",
        "rotary_dim": int(d_head * fraction),
        "rotary_base": theta,
        "rotary_adjacent_pairs": False,
        **(
            {"use_local_attn": True, "attn_types": ["local"] * c.num_hidden_layers}
            if window is not None
            else {}
        ),
        "window_size": window,
        **(
            {
                "use_NTK_by_parts_rope": True,
                "NTK_original_ctx_len": scaling["original_max_position_embeddings"],
                "NTK_by_parts_low_freq_factor": scaling["low_freq_factor"],
                "NTK_by_parts_high_freq_factor": scaling["high_freq_factor"],
                "NTK_by_parts_factor": scaling["factor"],
            }
            if scaling is not None and scaling["rope_type"] == "llama3"
            else {}
        ),
    }


_SCALINGS = {  # RoPE scalings whose logits match transformers' (tests/test_hf.py)
    "LlamaForCausalLM": ("llama3",),
    "SmolLM3ForCausalLM": ("linear", "dynamic", "yarn"),
}


# The HookedTransformerConfig fields our own per-layer model takes from a converted config.
_OWN_MODEL_CFG = (
    "d_model d_head n_heads d_mlp n_layers n_ctx eps d_vocab act_fn normalization_type "
    "gated_mlp rotary_dim rotary_base rotary_adjacent_pairs dtype default_prepend_bos"
).split()

FAMILIES: dict[str, _Family] = {
    "GPT2LMHeadModel": _Family("ape", "convert_gpt2_weights", _gpt2_config),
    "GPTNeoXForCausalLM": _Family("rotary", "convert_neox_weights", _neox_config),
    "BloomForCausalLM": _Family("alibi", "convert_bloom_weights", _bloom_config),
    "LlamaForCausalLM": _Family("rotary", "convert_llama_weights", _llama_config),
    "MistralForCausalLM": _Family("rotary", "convert_mistral_weights", _llama_config),
    "Qwen2ForCausalLM": _Family("rotary", "convert_qwen2_weights", _llama_config),
    # RoPE or NoPE per layer (`no_rope_layers`): our own per-layer model (see _per_layer_model)
    "SmolLM3ForCausalLM": _Family("per-layer", "convert_llama_weights", _llama_config),
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)


def _family(arch: str | None) -> _Family:
    if arch not in FAMILIES:
        raise HFModelError(
            f"unsupported architecture {arch!r}; from_hf supports "
            + ", ".join(SUPPORTED_ARCHITECTURES)
        )
    return FAMILIES[arch]


def _reason(err: Exception) -> str:
    """The first line of an exception from transformers or torch, for a one-line message."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _context_limit(hf_config) -> int | None:
    for name in ("n_positions", "max_position_embeddings", "seq_length"):
        if getattr(hf_config, name, None):
            return int(getattr(hf_config, name))
    return None


@contextlib.contextmanager
def _quiet_loading():
    """No transformers progress bars on stderr while a directory loads (restored after)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _load_dir(path: Path, tokenizer):
    """(hf_model, tokenizer) from a save_pretrained directory, refusing unsupported ones
    before reading any weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not path.is_dir():
        raise HFModelError(
            f"{path} is not a local directory (from_hf reads save_pretrained files and never "
            "downloads)"
        )
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise HFModelError(
            f"{path}: not a readable Hugging Face model directory ({_reason(err)})"
        ) from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architectures = getattr(config, "architectures", None)  # None when only a config was saved
    _family(
        architectures[0]
        if architectures
        else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    )
    try:
        with _quiet_loading():
            hf = AutoModelForCausalLM.from_pretrained(
                path,
                config=config,
                local_files_only=True,
                trust_remote_code=False,
                weights_only=True,  # a pickled checkpoint may hold tensors only, never code
            )
    except (OSError, ValueError, KeyError, pickle.UnpicklingError) as err:
        raise HFModelError(f"{path}: could not load the weights ({_reason(err)})") from None
    if tokenizer is None and any(
        (path / name).exists()
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    ):
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, KeyError) as err:
            raise HFModelError(f"{path}: could not load the tokenizer ({_reason(err)})") from None
    return hf, tokenizer


def _tied_unembedding(hf_config, state_dict) -> bool:
    """Whether the converted unembedding is the embedding transposed (a tied LM head)."""
    text_config = (
        hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    )
    W_E, W_U = state_dict.get("embed.W_E"), state_dict.get("unembed.W_U")
    return (
        bool(getattr(text_config, "tie_word_embeddings", False))
        and W_E is not None
        and W_U is not None
        and W_U.shape == W_E.T.shape
        and torch.equal(W_U, W_E.T)
    )


def from_hf(
    model_or_local_dir,
    *,
    tokenizer=None,
    device: str | torch.device | None = None,
    n_ctx: int | None = None,
) -> HookedTransformer:
    """A HookedTransformer computing what a Hugging Face causal LM computes, with TL hook names.

    `model_or_local_dir`: a transformers model (e.g. `GPT2LMHeadModel`) or a directory written
    by `save_pretrained`. `tokenizer`: attached as is (default: the directory's own, if any).
    `device`: default the Hugging Face model's device (cpu for a directory). `n_ctx`: the longest
    input; default the model's own limit, capped at DEFAULT_MAX_CTX for rotary and ALiBi
    models (GPT-2's learned positions are a hard limit). Weights keep their dtype; a tied LM
    head stays tied (`unembed.W_U` is a view of `embed.W_E`, as in the Hugging Face model).
    Supported architectures: SUPPORTED_ARCHITECTURES, and directories of the paper's own
    `custom_decoder_only_t5` (its 1B code LMs; `nopeinterp.models.codellm`), opened without
    running any of their files; anything else raises HFModelError.
    """
    from transformers import PreTrainedModel

    if isinstance(model_or_local_dir, str | os.PathLike) and is_codellm_dir(model_or_local_dir):
        try:  # the paper's own T5 decoders: read as data, never through their remote code
            return from_codellm(model_or_local_dir, tokenizer=tokenizer, device=device, n_ctx=n_ctx)
        except CodeLLMError as err:
            raise HFModelError(str(err)) from None
    if isinstance(model_or_local_dir, str | os.PathLike):
        hf, tokenizer = _load_dir(Path(model_or_local_dir), tokenizer)
    elif isinstance(model_or_local_dir, PreTrainedModel):
        hf = model_or_local_dir
    else:
        raise HFModelError(
            "from_hf takes a transformers model or a local directory, got "
            f"{type(model_or_local_dir).__name__}"
        )
    arch = type(hf).__name__
    family = _family(arch)
    hf_config = hf.config
    limit = _context_limit(hf_config)
    ctx = _ctx(limit, n_ctx, arch, hard=family.pe == "ape")
    if TL4:  # no HookedTransformer to convert into: a TransformerBridge over the model itself
        model = bridge(hf, tokenizer, device, ctx)
        if family.pe == "per-layer":
            model.layer_pe = ["rotary" if f else "nope" for f in hf_config.no_rope_layers]
        model.pe_options = _bridge_pe_options(model.cfg)
        return _finish(model, tokenizer, arch, hf_config)
    from transformer_lens.pretrained import weight_conversions

    param = next(hf.parameters())
    cfg = HookedTransformerConfig(
        **family.config(hf_config, arch, ctx),
        original_architecture=arch,
        dtype=param.dtype,
        device=str(device if device is not None else param.device),
        default_prepend_bos=False,  # inputs are token tensors; a tokenizer's template decides
        init_weights=False,  # every weight is overwritten below
    )
    with torch.no_grad():
        state_dict = getattr(weight_conversions, family.converter)(hf, cfg)
        if family.pe == "per-layer":
            model = _per_layer_model(hf_config, cfg, state_dict)
            return _finish(model, tokenizer, arch, hf_config)
        with tl_deprecation_silenced():
            model = HookedTransformer(cfg, move_to_device=False)
        if family.pe == "alibi":
            for layer, block in enumerate(model.blocks):
                block.attn = _bloom_attention()(cfg, "global", layer)
            model.setup()  # re-name the hook points of the new modules
        if "pos_embed" in model._modules and "pos_embed.W_pos" not in state_dict:
            state_dict["pos_embed.W_pos"] = torch.zeros_like(model.pos_embed.W_pos)  # unused
        # TL's load_and_process_state_dict without its processing step, which we turn off:
        # that step still copies every weight to float32 and back (for a bf16 1B model, a
        # 9 GB peak from 2.3 GB of weights). Copied key by key: nothing is shared.
        state_dict = model.fill_missing_keys(state_dict)
        tied = _tied_unembedding(hf_config, state_dict)
        if tied:  # W_U becomes a view of W_E below: its own (untouched) storage is dropped
            del state_dict["unembed.W_U"]
        for key in list(state_dict):
            model.load_state_dict({key: state_dict.pop(key)}, strict=False)
    model.to(cfg.device, print_details=False)
    if tied:  # one tensor, as in the Hugging Face model (TL's converter would hold a copy)
        W_E = model.embed.W_E
        model.unembed.W_U = torch.nn.Parameter(W_E.T, requires_grad=W_E.requires_grad)
    install_fused_attention(model)  # SDPA whenever no hook reads the scores or pattern
    install_fused_activation(model)  # one GELU kernel, not the formula's temporaries
    install_fused_unembed(model)  # no zero bias broadcast into the logits
    model.pe_options = (
        {"fraction": cfg.rotary_dim / cfg.d_head, "base": cfg.rotary_base}
        if family.pe == "rotary"
        else {}
    )
    return _finish(model, tokenizer, arch, hf_config)


def _bridge_pe_options(cfg) -> dict:
    """The rotary fraction and base of a bridge's cfg, as `model.pe_options` gives them."""
    if cfg.positional_embedding_type != "rotary" or not getattr(cfg, "rotary_dim", None):
        return {}
    return {"fraction": cfg.rotary_dim / cfg.d_head, "base": getattr(cfg, "rotary_base", 10000)}


def _finish(model, tokenizer, arch: str, hf_config=None):
    if tokenizer is not None:
        if model.tokenizer is not tokenizer:  # a bridge (TL 4) holds it already
            model.tokenizer = tokenizer  # not set_tokenizer: that re-loads it by name
        model.cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0
    model.hf_architecture = arch
    model.hf_config = hf_config  # what the random-init control re-initialises from
    # the BOS token the data layer puts first (nopeinterp.data.bos_token_id); None if none
    bos = getattr(hf_config, "bos_token_id", None)
    model.bos_token_id = bos if isinstance(bos, int) and 0 <= bos < model.cfg.d_vocab else None
    return model.eval()


def _per_layer_model(hf_config, cfg, state_dict: dict):
    """SmolLM3 as our own per-layer model: `no_rope_layers[i]` 1 -> "rotary", 0 -> "nope".

    Our attention has one K/V head per query head, so grouped K/V weights are repeated per
    query head (head h reads group h // (n_heads / n_kv), as transformers' repeat_kv does):
    the same logits, with hook_k / hook_v showing each group once per head it serves.
    """
    from nopeinterp.models import set_rope_scaling
    from nopeinterp.models.registry import LAYER_PES, MODEL_CLASSES

    layer_pe = ["rotary" if flag else "nope" for flag in hf_config.no_rope_layers]
    if len(layer_pe) != cfg.n_layers:
        raise HFModelError(
            f"SmolLM3ForCausalLM: no_rope_layers has {len(layer_pe)} entries for "
            f"{cfg.n_layers} layers"
        )
    kwargs = {k: v for k, v in cfg.to_dict().items() if k in _OWN_MODEL_CFG}
    own_cfg = ModelConfig(**kwargs, init_weights=False)  # every weight is loaded below
    pe = "rotary" if "rotary" in layer_pe else "nope"
    options, scaling = {}, None
    if pe == "rotary":
        arch = "SmolLM3ForCausalLM"
        scaling = _rope(hf_config, arch, scaled=_SCALINGS[arch])[2]
        options = {"fraction": cfg.rotary_dim / cfg.d_head, "base": cfg.rotary_base}
    with torch.random.fork_rng(devices=[]):  # our init draws numbers: leave the caller's
        model = MODEL_CLASSES[pe](own_cfg, layer_pes=LAYER_PES, layer_pe=layer_pe, **options)
    if scaling is not None:
        try:  # set_rope_scaling also rebuilds the rotary tables (the constructor does not)
            set_rope_scaling(model, scaling)
        except ValueError as err:  # a RoPE scaling our rotary layers do not implement
            raise HFModelError(f"SmolLM3ForCausalLM: {_reason(err)}") from None
    repeat = cfg.n_heads // (cfg.n_key_value_heads or cfg.n_heads)
    own = {}
    for key, value in state_dict.items():
        block, _, name = key.rpartition(".")
        if name in ("_W_K", "_W_V", "_b_K", "_b_V"):
            key, value = f"{block}.{name[1:]}", value.repeat_interleave(repeat, dim=0)
        own[key] = value
    missing, unexpected = model.load_state_dict(own, strict=False)
    if unexpected or missing:
        raise HFModelError(f"SmolLM3ForCausalLM: weights do not fit ({missing}, {unexpected})")
    return model.to(cfg.device)


__all__ = ["DEFAULT_MAX_CTX", "SUPPORTED_ARCHITECTURES", "HFModelError", "from_hf"]
