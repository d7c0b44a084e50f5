"""Shared base of the model zoo: a HookedTransformer whose positional encoding is pluggable,
per layer.

A positional encoding acts in one of two places:
  - in attention, per layer (`LayerPE`): nope, t5, alibi, rotary, fire, kerple. Each lives in
    its own small module as a `LayerPE` subclass saying whether the layer rotates q and k
    (`rotary`), which additive bias module it adds to the scores (`make_bias`, a
    `PositionBias` returning [1, head, query, key]; shown on its own in
    `attn.hook_position_bias`), and which options it takes. Layers of one bias PE share one
    bias module unless its `shared` option is False; a model may mix layer PEs freely
    (`layer_pe=[...]`).
  - in the residual stream, once (`ape`, `sinusoidal`): a `PETransformer` subclass with
    `absolute_embedding = True` and its own `pos_embed`; its layers are plain NoPE attention.
Everything else (MLPs, hooks, caching, generation) is stock TransformerLens. The block,
LayerNorm and attention forwards are TL's minus work our configurations never need
(`PEBlock`, `FusedLayerNorm`, `PEAttention`); each falls back to TL's own forward when a
feature it skips is on, and tests/test_models.py checks them against TL's forwards and
gradients for every PE. `PEAttention` runs `F.scaled_dot_product_attention` (the fused path)
when nothing needs the explicit scores or pattern; see `PEAttention.fused_ok`.
"""

from __future__ import annotations

import copy
import inspect

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
    get_offset_position_ids,
    tl_deprecation_silenced,
)
from nopeinterp.tasks.tokenizer import adds_bos


def relative_distance(q_len: int, k_len: int, device=None) -> torch.Tensor:
    """[q_len, k_len] long tensor of query_pos - key_pos.

    Queries are the last q_len of k_len positions, which is what a KV cache gives.
    Future keys get negative distances; the causal mask removes them.
    """
    q_pos = torch.arange(k_len - q_len, k_len, device=device)
    k_pos = torch.arange(k_len, device=device)
    return q_pos[:, None] - k_pos[None, :]


class PositionBias(nn.Module):
    """Base for additive attention biases: forward(q_len, k_len) -> [1, head, q_len, k_len].

    Positions are counted from the first column (as relative distances are); queries are the
    last q_len of the k_len keys (a KV cache). A bias that depends on the query's absolute
    position sets `reads_query_positions` and takes forward(q_len, k_len, query_positions):
    [batch, q_len] positions from each sequence's first real token under left padding
    (-> [batch, head, q_len, k_len]), or None.
    """

    reads_query_positions = False

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


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
# Hook points whose value only the explicit path computes: a hook on any of them (a cache, a
# patch, an ablation) makes the layer take the explicit path.
EXPLICIT_HOOKS = ("hook_attn_scores", "hook_pattern", "hook_position_bias", "hook_logit_scale")


class PEAttention(Attention):
    """TL attention plus this layer's positional encoding: rotary (`rotary=True`), an additive
    position bias computed for the current shape (`position_bias`), a logit scale per head
    and query position (`logit_scale`, NoPE's temperature), attention-weight dropout.

    The bias module is owned by the model (so T5's table can be shared by all layers) and is
    kept here in a list, outside the module tree, so the state dict holds it once.

    `forward` is TL 3.9's for our configurations minus the NaN clean-up pass after the
    softmax where no row can be fully masked, and minus a copy of W_O per call. Same hook
    points, same values; with any TL feature it does not cover (e.g. `use_attn_result`), TL's
    own forward runs. When no hook watches the scores, the pattern or the position terms
    (`fused_ok`), the scores and pattern are never materialised here: attention runs through
    `F.scaled_dot_product_attention` with the bias and masks as one additive mask.
    """

    fused = True  # class switch, for tests and benchmarks of the explicit path

    def __init__(
        self,
        cfg,
        attn_type="global",
        layer_id=None,
        position_bias=None,
        rotary=False,
        logit_scale=None,
        dropout=0.0,
    ):
        super().__init__(cfg, attn_type, layer_id)
        self._position_bias = [position_bias]
        self.rotary = rotary
        self.dropout = dropout
        if position_bias is not None:
            self.hook_position_bias = HookPoint()  # [1, head_index, query_pos, key_pos]
        if logit_scale is not None:
            self.logit_scale = logit_scale
            self.hook_logit_scale = HookPoint()  # [batch or 1, head_index, query_pos, 1]
        self._query_positions = None

    # --- positional terms ----------------------------------------------------------------
    def apply_rotary(self, x, past_kv_pos_offset=0, attention_mask=None):
        if not self.rotary:  # a non-rotary layer of a model whose other layers rotate
            return x
        return super().apply_rotary(x, past_kv_pos_offset, attention_mask)

    def position_bias(self, q_len, k_len):
        bias_fn = self._position_bias[0]
        if bias_fn is None:
            return None
        # A bias module shared by several layers is computed once per model forward
        # (PETransformer.forward opens and closes its memo).
        # Within one forward every layer sees the same attention mask.
        memo = getattr(bias_fn, "memo", None)
        key = (q_len, k_len, torch.is_grad_enabled())
        if memo is not None and key in memo:
            bias = memo[key]
        else:
            if getattr(bias_fn, "reads_query_positions", False):
                bias = bias_fn(q_len, k_len, self.left_padded_positions(q_len, k_len))
            else:
                bias = bias_fn(q_len, k_len)
            if memo is not None:
                memo[key] = bias
        return self.hook_position_bias(bias)

    def left_padded_positions(self, q_len, k_len):
        """[batch, q_len] positions of the queries counted from each sequence's first real
        token when the attention mask left-pads, else None (positions = column indices)."""
        mask = self._query_positions
        if mask is None or bool(mask[:, 0].all()):
            return None
        return get_offset_position_ids(k_len - q_len, mask).to(self.W_Q.device)

    def query_scale(self, q_len, k_len, attention_mask):
        """[batch or 1, head, q_len, 1] factor on the logits, or None."""
        if not hasattr(self, "logit_scale"):
            return None
        offset = k_len - q_len
        if attention_mask is None:
            positions = torch.arange(offset, k_len, device=self.W_Q.device)[None]
        else:
            positions = get_offset_position_ids(offset, attention_mask).to(self.W_Q.device)
        return self.hook_logit_scale(self.logit_scale(positions))

    def calculate_attention_scores(self, q, k):
        scores = super().calculate_attention_scores(q, k)
        q_len, k_len = scores.shape[-2], scores.shape[-1]
        scale = self.query_scale(q_len, k_len, self._query_positions)
        if scale is not None:
            scores = scores * scale.to(scores.dtype)
        bias = self.position_bias(q_len, k_len)
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        return scores

    def masked_scores(self, q, k, offset, attention_mask):
        """Logits [batch, head, q_len, k_len] with the PE terms and the causal and padding
        masks, for queries at offset..offset+q_len-1 (what `hook_attn_scores` sees)."""
        return self.apply_causal_mask(self.calculate_attention_scores(q, k), offset, attention_mask)

    softmax_fp32 = False  # softmax in float32 whatever the scores' dtype (T5's; arch="t5")

    def softmax_pattern(self, scores, empty_rows: bool):
        if self.softmax_fp32 and scores.dtype not in (torch.float32, torch.float64):
            pattern = F.softmax(scores.float(), dim=-1).to(scores.dtype)
        else:
            pattern = F.softmax(scores, dim=-1)
        if empty_rows:  # a row with no visible key (left padding): 0, as TL gives
            pattern = torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern)
        return pattern

    @property
    def qk_hook_names(self) -> tuple[str, str]:
        """This layer's hook points carrying the q and k its scores are computed from."""
        return ("hook_rot_q", "hook_rot_k") if self.rotary else ("hook_q", "hook_k")

    def attention_rows(self, q, k, start: int, stop: int, attention_mask=None):
        """(scores, pattern) [batch, head, stop - start, stop] of query rows start..stop-1
        over keys 0..stop-1, from this layer's cached q and k ([batch, pos, head, d_head] at
        `qk_hook_names`) and the model's attention_mask.

        The explicit path's own computation, run on a block of rows as a KV-cache step runs
        it: keys after the last row are causally masked for every row of the block, so they
        are left out. An analysis can then walk a long sequence block by block, in memory
        batch x head x rows x stop instead of the full [batch, head, pos, pos].
        """
        mask = None if attention_mask is None else attention_mask[:, :stop].to(q.device)
        self._query_positions = mask
        try:
            scores = self.masked_scores(q[:, start:stop], k[:, :stop], start, mask)
        finally:
            self._query_positions = None
        return scores, self.softmax_pattern(scores, self.empty_rows(mask))

    def rows_supported(self) -> bool:
        """Whether `attention_rows` gives what `forward` computes: the lean forward runs and
        no hook (a patch, an ablation) changes the scores, pattern or position terms."""
        return not self.tl_forward_needed(None, None) and not self.explicit_hooks_attached()

    def explicit_hooks_attached(self) -> bool:
        return any(getattr(self, n).has_hooks() for n in EXPLICIT_HOOKS if hasattr(self, n))

    def empty_rows(self, attention_mask) -> bool:
        # Key 0 is visible to every query, so only a masked key 0 (left padding) or a local
        # window can leave a row with no visible key, whose softmax is NaN: TL zeroes those.
        return attention_mask is not None and (
            self.attn_type == "local" or not bool(attention_mask[:, 0].all())
        )

    # --- forward -------------------------------------------------------------------------
    def tl_forward_needed(self, additive_attention_mask, position_bias) -> bool:
        cfg = self.cfg
        return (
            additive_attention_mask is not None
            or position_bias is not None
            or cfg.clip_qkv is not None
            or cfg.original_architecture is not None
            or cfg.positional_embedding_type not in ("standard", "rotary")
            or (self._attention_dir_override or cfg.attention_dir) != "causal"
            or any(getattr(cfg, flag) for flag in _TL_FORWARD_FLAGS)
        )

    def fused_ok(self) -> bool:
        """The allowlist of the fused path: a global causal layer, no score soft-cap, and no
        hook on a value only the explicit path computes. Anything else: explicit path."""
        return (
            self.fused
            and self.attn_type == "global"
            and not (self.cfg.attn_scores_soft_cap or 0) > 0
            and not self.explicit_hooks_attached()
        )

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
        self._query_positions = attention_mask
        if self.tl_forward_needed(additive_attention_mask, position_bias):
            out = super().forward(
                query_input,
                key_input,
                value_input,
                past_kv_cache_entry,
                additive_attention_mask,
                attention_mask,
                position_bias,
            )
            self._query_positions = None
            return out
        cfg = self.cfg
        q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
        offset = 0
        if past_kv_cache_entry is not None:
            offset = past_kv_cache_entry.past_keys.size(1)
            k, v = past_kv_cache_entry.append(k, v)
        if self.rotary:
            q = self.hook_rot_q(self.apply_rotary(q, offset, attention_mask))
            k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))  # keys are cached
        empty_rows = self.empty_rows(attention_mask)
        if self.fused_ok():
            z = self.hook_z(self.fused_z(q, k, v, offset, attention_mask, empty_rows))
        else:
            scores = self.hook_attn_scores(self.masked_scores(q, k, offset, attention_mask))
            pattern = self.hook_pattern(self.softmax_pattern(scores, empty_rows))
            if self.dropout and self.training:
                pattern = F.dropout(pattern, self.dropout, training=True)
            z = self.calculate_z_scores(v, pattern)  # [batch, pos, head, d_head]
        self._query_positions = None
        w_o = self.W_O.reshape(cfg.n_heads * cfg.d_head, cfg.d_model)  # a view: no copy
        return F.linear(z.reshape(*z.shape[:2], -1), w_o.T, self.b_O)

    def fused_z(self, q, k, v, offset, attention_mask, empty_rows):
        """z [batch, query, head, d_head] through scaled_dot_product_attention: the same
        computation as scores -> causal/padding mask -> softmax -> @ v."""
        q_len, k_len = q.shape[1], k.shape[1]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, head, pos, d_head]
        scale = self.query_scale(q_len, k_len, attention_mask)
        if scale is not None:  # scaling q scales its logits
            q = q * scale.to(q.dtype)
        bias = self.position_bias(q_len, k_len)
        padded = attention_mask is not None and not bool(attention_mask.all())
        dropout = self.dropout if self.training else 0.0
        if bias is None and not padded and q_len == k_len:
            z = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=1.0 / self.attn_scale
            )
            return z.transpose(1, 2)
        visible = relative_distance(q_len, k_len, q.device) >= 0
        if padded:
            visible = visible & attention_mask[:, None, None, :].bool().to(q.device)
        else:
            visible = visible[None, None]
        # a large finite negative, not -inf: a row with no visible key (left padding) must
        # not give NaN (its output is zeroed below, as TL zeroes its pattern)
        low = torch.finfo(q.dtype).min
        if bias is None:
            mask = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
            mask = mask.masked_fill(~visible, low)
        else:
            mask = bias.to(q.dtype).masked_fill(~visible, low)
        z = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, scale=1.0 / self.attn_scale
        )
        if empty_rows:
            z = z.masked_fill(~visible.any(-1, keepdim=True), 0.0)
        return z.transpose(1, 2)


class LayerPE:
    """A positional encoding acting inside attention, one layer at a time (see module doc)."""

    name: str = ""
    rotary: bool = False
    bias_attr: str | None = None  # model attribute holding the bias modules (a ModuleList)
    attention_cls = None  # PEAttention unless set

    def resolve_options(self, cfg, **options) -> dict:
        """Validate this PE's options and return them with defaults filled in."""
        if options:
            raise TypeError(f"pe={self.name!r} takes no options, got {sorted(options)}")
        return {}

    def make_bias(self, cfg, options) -> PositionBias | None:
        return None

    def shared(self, options) -> bool:
        return options.get("shared", True)

    def attention_kwargs(self, cfg, options) -> dict:
        """Extra keyword arguments for this layer's `PEAttention`."""
        return {}


class FusedLayerNorm(LayerNorm):
    """TL's LayerNorm as one `F.layer_norm` kernel (same formula: biased variance, eps inside
    the square root), unless a hook watches its internals (`hook_scale`, `hook_normalized`):
    then TL's step-by-step forward runs, so caching and patching those points work as before.
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
    """TL's pre-LN block, with ln1 computed once and fed to q, k and v, and dropout on the
    attention and MLP outputs before each is added to the residual stream (as T5's decoder
    layers do; `dropout`, active in training mode only).

    TL 3.9 computes `ln1(x)` three times (and adds 0.0 to two of them) so that split-qkv
    inputs can differ; ours never do unless a user turns on `use_split_qkv_input` or
    `use_attn_in`, and then TL's own forward runs (without dropout). Same hook points, same
    values (hook_attn_out and hook_mlp_out see the output before dropout).
    """

    def __init__(self, cfg, block_index, dropout=0.0):
        super().__init__(cfg, block_index)
        self.dropout = dropout
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
        p = self.dropout if self.training else 0.0
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
        if p:
            attn_out = F.dropout(attn_out, p, training=True)
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_in = self.hook_mlp_in(resid_mid.clone()) if cfg.use_hook_mlp_in else resid_mid
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mlp_in)))
        if p:
            mlp_out = F.dropout(mlp_out, p, training=True)
        return self.hook_resid_post(resid_mid + mlp_out)


class PETransformer(HookedTransformer):
    """HookedTransformer with a positional encoding per layer; see the module docstring.

    `layer_pe`: each layer's `LayerPE` name; `pe_options`: the options of every PE used
    (each PE takes its own keys); `dropout`: see `PEBlock` (also on the embeddings and the
    attention weights); `arch`: "default" (TL's pre-LayerNorm block with biases) or "t5" (the
    paper's T5 decoder layout, `nopeinterp.models.t5_arch`).
    """

    pe: str = ""
    absolute_embedding = False

    def __init__(
        self,
        cfg: HookedTransformerConfig,
        tokenizer=None,
        *,
        layer_pe=None,
        dropout: float = 0.0,
        arch: str = "default",
        **pe_options,
    ):
        from nopeinterp.models.registry import LAYER_PES

        layer_pe = list(layer_pe or [self.layer_pe_default] * cfg.n_layers)
        specs = [LAYER_PES[name] for name in layer_pe]
        cfg.positional_embedding_type = (
            "rotary" if any(spec.rotary for spec in specs) else "standard"
        )
        if tokenizer is not None and tokenizer.bos_token is not None and not adds_bos(tokenizer):
            # TransformerLens sets bos_token = eos_token on a tokenizer that adds no start token
            # (a task built with bos=False); given such a tokenizer again (a second model from
            # this one's tokenizer), it would fetch a "bos-enabled" copy from the Hub. A copy
            # without bos_token is kept as it is.
            tokenizer = copy.deepcopy(tokenizer)
            tokenizer.bos_token = None
        with tl_deprecation_silenced():
            super().__init__(cfg, tokenizer=tokenizer)
        self.layer_pe = layer_pe
        self.dropout = dropout
        self.arch = arch
        self.pe_options = self.resolve_pe_options(specs, pe_options)
        # Same modules and state-dict keys as TL's, with a faster path (PEBlock, PEAttention).
        self.blocks = nn.ModuleList(PEBlock(cfg, i, dropout) for i in range(cfg.n_layers))
        if type(self.ln_final) is LayerNorm:
            self.ln_final = FusedLayerNorm(cfg)
        if not self.absolute_embedding and hasattr(self, "pos_embed"):
            # No unused W_pos in the state dict, and nothing added to the residual stream.
            del self.pos_embed, self.hook_pos_embed
        self.configure_positional_encoding()
        self.install_layer_pes(specs)
        # TL initialised the stock modules; re-run it (same seed) so replaced ones are set too.
        if cfg.init_weights:  # False: the caller loads every weight
            self.init_weights()
        if arch == "t5":
            from nopeinterp.models.t5_arch import make_t5_layout

            make_t5_layout(self)  # T5's norm, MLP, tied output, no biases; T5's init
        self.setup()  # re-name hook points after the module swaps
        self.eval()

    layer_pe_default = "nope"

    def resolve_pe_options(self, specs, options) -> dict:
        """Each distinct layer PE takes its own option keys; unknown keys are an error."""
        resolved, used = {}, set()
        for spec in dict.fromkeys(specs):
            names = set(inspect.signature(spec.resolve_options).parameters) - {"cfg", "options"}
            mine = {k: v for k, v in options.items() if k in names}
            used |= set(mine)
            resolved.update(spec.resolve_options(self.cfg, **mine))
        left = sorted(set(options) - used)
        if left:
            used = ", ".join(dict.fromkeys(spec.name for spec in specs))
            raise TypeError(f"pe={self.pe!r} (layers: {used}) takes no options {left}")
        return resolved

    def configure_positional_encoding(self) -> None:
        """For absolute embeddings: install `pos_embed`. Default: nothing."""

    def install_layer_pes(self, specs) -> None:
        """Give every block a `PEAttention` with its layer's PE; bias modules live on the model
        (`spec.bias_attr`, a ModuleList: one module shared by the layers of that PE, or one per
        layer with `shared=False`)."""
        bias_of_layer = {}
        for spec in dict.fromkeys(specs):
            layers = [i for i, s in enumerate(specs) if s is spec]
            if spec.bias_attr is None:
                continue
            if spec.shared(self.pe_options):
                modules = nn.ModuleList([spec.make_bias(self.cfg, self.pe_options)])
                bias_of_layer.update({i: modules[0] for i in layers})
            else:
                modules = nn.ModuleList(spec.make_bias(self.cfg, self.pe_options) for _ in layers)
                bias_of_layer.update(dict(zip(layers, modules, strict=True)))
            setattr(self, spec.bias_attr, modules)
        for layer, (block, spec) in enumerate(zip(self.blocks, specs, strict=True)):
            block.attn = (spec.attention_cls or PEAttention)(
                self.cfg,
                "global",
                layer,
                position_bias=bias_of_layer.get(layer),
                rotary=spec.rotary,
                dropout=self.dropout,
                **spec.attention_kwargs(self.cfg, self.pe_options),
            )

    # --- TL overrides ---------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        biases = [m for m in self.modules() if isinstance(m, PositionBias)]
        for module in biases:
            module.memo = {}
        try:
            return super().forward(*args, **kwargs)
        finally:
            for module in biases:
                module.memo = None

    def get_residual(self, embed, pos_offset, *args, return_shortformer_pos_embed=True, **kwargs):
        if self.absolute_embedding:
            residual, extra = super().get_residual(
                embed, pos_offset, *args, return_shortformer_pos_embed=True, **kwargs
            )
        else:
            residual, extra = embed, None
        if self.dropout and self.training:
            residual = F.dropout(residual, self.dropout, training=True)
        return (residual, extra) if return_shortformer_pos_embed else residual

    def move_model_modules_to_device(self):
        # TL's version assumes pos_embed exists unless the PE is rotary.
        for name in ("embed", "hook_embed", "pos_embed", "hook_pos_embed", "ln_final", "unembed"):
            if hasattr(self, name):
                getattr(self, name).to(self.cfg.device)
        for block in self.blocks:
            block.to(self.cfg.device)

    def extra_repr(self) -> str:
        mixed = len(set(self.layer_pe)) > 1
        return (
            f"pe={self.pe!r}, "
            + (f"arch={self.arch!r}, " if self.arch != "default" else "")
            + (f"layer_pe={self.layer_pe}, " if mixed else "")
            + (f"pe_options={self.pe_options}")
        )
