"""Shared base of the model zoo: a HookedTransformer whose positional encoding is pluggable.

Each PE lives in its own small module (nope.py, t5.py, alibi.py, rotary.py, ape.py) as a
subclass of `PETransformer`. A subclass says three things:
  - `tl_positional_embedding_type`: what TransformerLens itself should do ("standard" adds
    `pos_embed` to the residual stream, "rotary" rotates q and k);
  - `absolute_embedding`: whether the residual stream gets an absolute position embedding;
  - `configure_positional_encoding()`: installs the PE, e.g. a `PositionBias` module returning
    an additive attention bias [1, head, query, key], which `PEAttention` adds to the scores
    before the causal mask, so it shows in `hook_attn_scores` and, on its own, in
    `attn.hook_position_bias`.
Everything else (MLPs, hooks, caching, generation) is stock TransformerLens. The block,
LayerNorm and attention forwards are TL's minus work our configurations never need
(`PEBlock`, `FusedLayerNorm`, `PEAttention`: about 30% of a training step on CPU, see
bench/RESULTS.md); each falls back to TL's own forward when a feature it skips is on, and
tests/test_models.py checks them against TL's forwards and gradients for every PE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nopeinterp._tl import (
    Attention,
    HookedTransformer,
    HookedTransformerConfig,
    HookPoint,
    LayerNorm,
    TransformerBlock,
    tl_deprecation_silenced,
)


def relative_distance(q_len: int, k_len: int, device=None) -> torch.Tensor:
    """[q_len, k_len] long tensor of query_pos - key_pos.

    Queries are the last q_len of k_len positions, which is what a KV cache gives.
    Future keys get negative distances; the causal mask removes them.
    """
    q_pos = torch.arange(k_len - q_len, k_len, device=device)
    k_pos = torch.arange(k_len, device=device)
    return q_pos[:, None] - k_pos[None, :]


# TL attention features the lean forward below does not implement: with any on, TL's runs.
_TL_FORWARD_FLAGS = (
    "use_attn_result",
    "use_split_qkv_input",
    "use_attn_in",
    "load_in_4bit",
    "use_qk_norm",
    "use_logn_attn",
    "use_attention_sinks",
)


class PEAttention(Attention):
    """TL attention plus an additive position bias computed for the current shape, used by
    every PE (with no bias for NoPE, rotary and the absolute embeddings).

    The bias module is owned by the model (so T5's table can be shared by all layers) and is
    kept here in a list, outside the module tree, so the state dict holds it once.

    `forward` is TL 3.9's for our configurations minus the NaN clean-up pass over the pattern
    after the softmax, which only a row whose keys are all padding needs (left padding), and
    minus a copy of W_O per call. Same hook points, same values; with any TL feature it does
    not cover (e.g. `use_attn_result`), TL's own forward runs.
    """

    def __init__(self, cfg, attn_type="global", layer_id=None, position_bias=None):
        super().__init__(cfg, attn_type, layer_id)
        self._position_bias = [position_bias]
        if position_bias is not None:
            self.hook_position_bias = HookPoint()  # [1, head_index, query_pos, key_pos]

    def calculate_attention_scores(self, q, k):
        scores = super().calculate_attention_scores(q, k)
        bias_fn = self._position_bias[0]
        if bias_fn is None:
            return scores
        bias = self.hook_position_bias(bias_fn(scores.shape[-2], scores.shape[-1]))
        return scores + bias.to(scores.dtype)

    def forward(
        self,
        query_input,
        key_input,
        value_input,
        past_kv_cache_entry=None,
        additive_attention_mask=None,
        attention_mask=None,
        position_bias=None,
    ):
        cfg = self.cfg
        if (
            additive_attention_mask is not None
            or position_bias is not None
            or cfg.clip_qkv is not None
            or cfg.original_architecture is not None
            or cfg.positional_embedding_type not in ("standard", "rotary")
            or (self._attention_dir_override or cfg.attention_dir) != "causal"
            or any(getattr(cfg, flag) for flag in _TL_FORWARD_FLAGS)
        ):
            return super().forward(
                query_input,
                key_input,
                value_input,
                past_kv_cache_entry,
                additive_attention_mask,
                attention_mask,
                position_bias,
            )
        q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
        offset = 0
        if past_kv_cache_entry is not None:
            offset = past_kv_cache_entry.past_keys.size(1)
            k, v = past_kv_cache_entry.append(k, v)
        if cfg.positional_embedding_type == "rotary":
            q = self.hook_rot_q(self.apply_rotary(q, offset, attention_mask))
            k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))  # keys are cached
        scores = self.apply_causal_mask(
            self.calculate_attention_scores(q, k), offset, attention_mask
        )
        pattern = F.softmax(self.hook_attn_scores(scores), dim=-1)
        # Key 0 is visible to every query, so only a masked key 0 (left padding) or a local
        # window can leave a row with no visible key, whose softmax is NaN: TL zeroes those.
        if attention_mask is not None and (
            self.attn_type == "local" or not bool(attention_mask[:, 0].all())
        ):
            pattern = torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern)
        z = self.calculate_z_scores(v, self.hook_pattern(pattern))  # [batch, pos, head, d_head]
        w_o = self.W_O.reshape(cfg.n_heads * cfg.d_head, cfg.d_model)  # a view: no copy
        return F.linear(z.reshape(*z.shape[:2], -1), w_o.T, self.b_O)


class FusedLayerNorm(LayerNorm):
    """TL's LayerNorm as one `F.layer_norm` kernel (same formula: biased variance, eps inside
    the square root), unless a hook watches its internals (`hook_scale`, `hook_normalized`):
    then TL's step-by-step forward runs (eight elementwise ops, each with its own backward),
    so caching and patching those points work as before.
    """

    def forward(self, x):
        if (
            self.cfg.dtype not in (torch.float32, torch.float64)
            or self.hook_scale.has_hooks()
            or self.hook_normalized.has_hooks()
        ):
            return super().forward(x)
        return F.layer_norm(x, (self.length,), self.w, self.b, self.eps)


class PEBlock(TransformerBlock):
    """TL's pre-LN block, with ln1 computed once and fed to q, k and v.

    TL 3.9 computes `ln1(x)` three times (and adds 0.0 to two of them) so that split-qkv
    inputs can differ; ours never do unless a user turns on `use_split_qkv_input` or
    `use_attn_in`, and then TL's own forward runs. Same hook points, same values.
    """

    def __init__(self, cfg, block_index):
        super().__init__(cfg, block_index)
        if type(self.ln1) is LayerNorm:
            self.ln1, self.ln2 = FusedLayerNorm(cfg), FusedLayerNorm(cfg)

    def forward(
        self, resid_pre, shortformer_pos_embed=None, past_kv_cache_entry=None, attention_mask=None
    ):
        cfg = self.cfg
        if (
            cfg.use_attn_in
            or cfg.use_split_qkv_input
            or shortformer_pos_embed is not None
            or cfg.parallel_attn_mlp
            or cfg.attn_only
            or cfg.use_normalization_before_and_after
        ):
            return super().forward(
                resid_pre, shortformer_pos_embed, past_kv_cache_entry, attention_mask
            )
        resid_pre = self.hook_resid_pre(resid_pre)
        normalized = self.ln1(resid_pre)
        attn_out = self.hook_attn_out(
            self.attn(
                query_input=normalized,
                key_input=normalized,
                value_input=normalized,
                past_kv_cache_entry=past_kv_cache_entry,
                attention_mask=attention_mask,
            )
        )
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_in = self.hook_mlp_in(resid_mid.clone()) if cfg.use_hook_mlp_in else resid_mid
        return self.hook_resid_post(resid_mid + self.apply_mlp(self.ln2(mlp_in)))


class PETransformer(HookedTransformer):
    """HookedTransformer with one positional encoding; see the module docstring."""

    pe: str = ""
    tl_positional_embedding_type = "standard"
    absolute_embedding = False

    def __init__(self, cfg: HookedTransformerConfig, tokenizer=None, **pe_options):
        cfg.positional_embedding_type = self.tl_positional_embedding_type
        with tl_deprecation_silenced():
            super().__init__(cfg, tokenizer=tokenizer)
        self.pe_options = self.resolve_pe_options(**pe_options)
        # Same modules and state-dict keys as TL's, with a faster path (PEBlock, PEAttention).
        self.blocks = nn.ModuleList(PEBlock(cfg, i) for i in range(cfg.n_layers))
        if type(self.ln_final) is LayerNorm:
            self.ln_final = FusedLayerNorm(cfg)
        self.use_attention(PEAttention)
        if not self.absolute_embedding and hasattr(self, "pos_embed"):
            # No unused W_pos in the state dict, and nothing added to the residual stream.
            del self.pos_embed, self.hook_pos_embed
        self.configure_positional_encoding()
        # TL initialised the stock modules; re-run it (same seed) so replaced ones are set too.
        self.init_weights()
        self.setup()  # re-name hook points after the module swaps
        self.eval()

    # --- for subclasses -------------------------------------------------------------------
    def resolve_pe_options(self, **options) -> dict:
        """Validate this PE's options and return them with defaults filled in."""
        if options:
            raise TypeError(f"pe={self.pe!r} takes no options, got {sorted(options)}")
        return {}

    def configure_positional_encoding(self) -> None:
        """Install the PE after the model is built (with `PEAttention` and no bias). Default:
        nothing."""

    def use_attention(self, attention_cls, layer_kwargs=lambda layer: {}) -> None:
        """Replace every block's attention by `attention_cls(cfg, "global", layer, **kw)`."""
        for layer, block in enumerate(self.blocks):
            block.attn = attention_cls(self.cfg, "global", layer, **layer_kwargs(layer))

    # --- TL overrides ---------------------------------------------------------------------
    def get_residual(self, embed, pos_offset, *args, return_shortformer_pos_embed=True, **kwargs):
        if self.absolute_embedding:
            return super().get_residual(
                embed,
                pos_offset,
                *args,
                return_shortformer_pos_embed=return_shortformer_pos_embed,
                **kwargs,
            )
        return (embed, None) if return_shortformer_pos_embed else embed

    def move_model_modules_to_device(self):
        # TL's version assumes pos_embed exists unless the PE is rotary.
        for name in ("embed", "hook_embed", "pos_embed", "hook_pos_embed", "ln_final", "unembed"):
            if hasattr(self, name):
                getattr(self, name).to(self.cfg.device)
        for block in self.blocks:
            block.to(self.cfg.device)

    def extra_repr(self) -> str:
        return f"pe={self.pe!r}, pe_options={self.pe_options}"


class PositionBias(nn.Module):
    """Base for additive attention biases: forward(q_len, k_len) -> [1, head, q_len, k_len]."""

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError
