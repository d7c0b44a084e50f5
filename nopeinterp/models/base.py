"""Shared base of the model zoo: a decoder-only transformer whose positional encoding is
pluggable, per layer, with TransformerLens' hook names, parameter names and shapes.

The model, nanoGPT-style, in the order the residual stream meets it:
    embed (+ pos_embed for an absolute PE) -> blocks[i]: x + attn(ln1(x)), then + mlp(ln2(x))
    -> ln_final -> unembed.
It is written on TransformerLens' `HookedRootModule` and `HookPoint` (which TL 3.9 and 4.x both
have), not on TL's `HookedTransformer` (which TL 4 removed): the hook points
(`blocks.{i}.hook_resid_pre`, `blocks.{i}.attn.hook_pattern`, ...), `run_with_cache`,
`run_with_hooks`, `hooks()`, the `cfg` fields (`ModelConfig`) and the state-dict keys
(`blocks.{i}.attn.W_Q` [head, d_model, d_head], ...) are TL 3.9's, so every checkpoint loads
as it did and every analysis runs unchanged, under either version.

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
`PEAttention` runs `F.scaled_dot_product_attention` (the fused path) when nothing needs the
explicit scores or pattern; see `PEAttention.fused_ok`. Generation with a KV cache:
`model.init_kv_cache(batch)`, passed as `past_kv_cache=` (`KVCache`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from nopeinterp._tl import ActivationCache, HookedRootModule, HookPoint, get_offset_position_ids
from nopeinterp.errors import check_choice
from nopeinterp.models.config import ModelConfig


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


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


# act_fn name (TL's and transformers' spelling) -> function
ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
}


# --- the modules of a block -------------------------------------------------------------------
class LayerNorm(nn.Module):
    """LayerNorm (biased variance, eps inside the square root) with TL's hook points: one
    `F.layer_norm` kernel while no hook watches `hook_scale` / `hook_normalized`, otherwise
    the step-by-step form that fills them. Half precision is normalised in float32."""

    def __init__(self, cfg: ModelConfig, length: int | None = None):
        super().__init__()
        self.eps = cfg.eps
        self.length = length or cfg.d_model
        self.w = nn.Parameter(torch.ones(self.length, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(self.length, dtype=cfg.dtype))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, length]

    def forward(self, x):
        hooked = self.hook_scale.has_hooks() or self.hook_normalized.has_hooks()
        if x.dtype in (torch.float32, torch.float64) and not hooked:
            return F.layer_norm(x, (self.length,), self.w, self.b, self.eps)
        dtype = x.dtype
        x = x.float() if dtype not in (torch.float32, torch.float64) else x
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale).to(dtype) * self.w + self.b


class RMSNorm(nn.Module):
    """RMS norm (T5's, Llama's) with TL's hook points: x * rsqrt(mean(x^2) + eps) * w, the
    mean in float32. One `F.rms_norm` kernel in float32 and float64 while no hook watches
    `hook_scale` / `hook_normalized`; otherwise the step-by-step form that fills them."""

    def __init__(self, cfg: ModelConfig, length: int | None = None):
        super().__init__()
        self.eps = cfg.eps
        self.length = length or cfg.d_model
        self.w = nn.Parameter(torch.ones(self.length, dtype=cfg.dtype))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, length]

    def forward(self, x):
        if (
            x.dtype in (torch.float32, torch.float64)
            and not self.hook_scale.has_hooks()
            and not self.hook_normalized.has_hooks()
        ):
            return F.rms_norm(x, (self.length,), self.w, self.eps)
        variance = x.float().pow(2).mean(-1, keepdim=True)
        scale = self.hook_scale(torch.sqrt(variance + self.eps))
        normalized = self.hook_normalized((x.float() / scale).to(x.dtype))
        return self.w * normalized


NORMS = {"LN": LayerNorm, "RMS": RMSNorm}


class MLP(nn.Module):
    """act(x @ W_in + b_in) @ W_out + b_out; with `cfg.gated_mlp`,
    (act(x @ W_gate) * (x @ W_in + b_in)) @ W_out + b_out (Llama's). Hooks: `hook_pre` (the
    activation's input), `hook_pre_linear` (gated: the linear branch), `hook_post`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[check_choice(cfg.act_fn, ACTIVATIONS, "act_fn", error=ValueError)]
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=cfg.dtype))
        if cfg.gated_mlp:
            self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=cfg.dtype))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp, dtype=cfg.dtype))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model, dtype=cfg.dtype))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        if cfg.gated_mlp:
            self.hook_pre_linear = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x):
        linear = F.linear(x, self.W_in.T, self.b_in)
        if hasattr(self, "W_gate"):
            gate = self.hook_pre(x @ self.W_gate)
            post = self.hook_post(self.act(gate) * self.hook_pre_linear(linear))
        else:
            post = self.hook_post(self.act(self.hook_pre(linear)))
        return F.linear(post, self.W_out.T, self.b_out)


class Embed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens):
        return self.W_E[tokens]


class Unembed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out, dtype=cfg.dtype))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab_out, dtype=cfg.dtype))
        self.hook_in = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_vocab]

    def forward(self, residual):
        return self.hook_out(F.linear(self.hook_in(residual), self.W_U.T, self.b_U))


# --- KV cache ---------------------------------------------------------------------------------
class KVCacheEntry:
    """One layer's keys and values so far, [batch, pos, head, d_head] (keys before rotation:
    a rotary layer rotates all of them at each step)."""

    def __init__(self, cfg: ModelConfig, batch: int, device):
        shape = (batch, 0, cfg.n_heads, cfg.d_head)
        self.past_keys = torch.empty(shape, device=device, dtype=cfg.dtype)
        self.past_values = torch.empty(shape, device=device, dtype=cfg.dtype)

    def append(self, keys, values):
        self.past_keys = torch.cat([self.past_keys, keys], 1)
        self.past_values = torch.cat([self.past_values, values], 1)
        return self.past_keys, self.past_values


class KVCache:
    """Per-layer `KVCacheEntry`s and the attention mask of every position so far."""

    def __init__(self, cfg: ModelConfig, batch: int, device):
        self.entries = [KVCacheEntry(cfg, batch, device) for _ in range(cfg.n_layers)]
        self.previous_attention_mask = torch.empty(batch, 0, dtype=torch.long, device=device)

    def __getitem__(self, layer: int) -> KVCacheEntry:
        return self.entries[layer]

    @property
    def offset(self) -> int:
        """Positions already cached."""
        return self.entries[0].past_keys.size(1) if self.entries else 0

    def append_attention_mask(self, attention_mask):
        mask = attention_mask.to(self.previous_attention_mask.device)
        self.previous_attention_mask = torch.cat([self.previous_attention_mask, mask], -1)
        return self.previous_attention_mask


# --- attention --------------------------------------------------------------------------------
# Hook points whose value only the explicit path computes: a hook on any of them (a cache, a
# patch, an ablation) makes the layer take the explicit path.
EXPLICIT_HOOKS = ("hook_attn_scores", "hook_pattern", "hook_position_bias", "hook_logit_scale")


def _heads(x, W, b):
    """x [batch, pos, d_model] @ W [head, d_model, d_head] + b [head, d_head]
    -> [batch, pos, head, d_head], as one matmul."""
    n_heads, d_model, d_head = W.shape
    weight = W.permute(0, 2, 1).reshape(n_heads * d_head, d_model)
    return F.linear(x, weight, b.reshape(-1)).unflatten(-1, (n_heads, d_head))


class PEAttention(nn.Module):
    """Causal multi-head attention with TL's parameters (W_Q, W_K, W_V [head, d_model,
    d_head], W_O [head, d_head, d_model], b_Q, b_K, b_V [head, d_head], b_O [d_model]) and hook
    points (hook_q, hook_k, hook_v, hook_attn_scores, hook_pattern, hook_z), plus this layer's
    positional encoding: rotary (`RotaryAttention`, rotary.py; hook_rot_q, hook_rot_k), an
    additive position bias computed for the current shape (`position_bias`; its value in
    hook_position_bias), a logit scale per head and query position (`logit_scale`, NoPE's
    temperature; hook_logit_scale), attention-weight dropout.

    The bias module is owned by the model (so T5's table can be shared by all layers) and is
    kept here in a list, outside the module tree, so the state dict holds it once.

    When no hook watches the scores, the pattern or the position terms (`fused_ok`), the
    scores and pattern are never materialised: attention runs through
    `F.scaled_dot_product_attention` with the bias and masks as one additive mask. Otherwise
    the explicit path: scores -> causal and padding mask (-inf) -> softmax -> pattern @ v.
    """

    fused = True  # class switch, for tests and benchmarks of the explicit path
    softmax_fp32 = False  # softmax in float32 whatever the scores' dtype (T5's; arch="t5")

    def __init__(
        self, cfg: ModelConfig, layer_id=None, position_bias=None, logit_scale=None, dropout=0.0
    ):
        super().__init__()
        self.cfg, self.layer_id, self.dropout = cfg, layer_id, dropout
        heads, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(heads, d_model, d_head, dtype=cfg.dtype))
        self.W_O = nn.Parameter(torch.empty(heads, d_head, d_model, dtype=cfg.dtype))
        self.b_Q = nn.Parameter(torch.zeros(heads, d_head, dtype=cfg.dtype))
        self.b_O = nn.Parameter(torch.zeros(d_model, dtype=cfg.dtype))
        self.W_K = nn.Parameter(torch.empty(heads, d_model, d_head, dtype=cfg.dtype))
        self.W_V = nn.Parameter(torch.empty(heads, d_model, d_head, dtype=cfg.dtype))
        self.b_K = nn.Parameter(torch.zeros(heads, d_head, dtype=cfg.dtype))
        self.b_V = nn.Parameter(torch.zeros(heads, d_head, dtype=cfg.dtype))
        self.attn_scale = cfg.attn_scale
        self.hook_k = HookPoint()  # [batch, key_pos, head_index, d_head]
        self.hook_q = HookPoint()  # [batch, query_pos, head_index, d_head]
        self.hook_v = HookPoint()  # [batch, key_pos, head_index, d_head]
        self.hook_z = HookPoint()  # [batch, query_pos, head_index, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head_index, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head_index, query_pos, key_pos]
        self._position_bias = [position_bias]
        if position_bias is not None:
            self.hook_position_bias = HookPoint()  # [1, head_index, query_pos, key_pos]
        if logit_scale is not None:
            self.logit_scale = logit_scale
            self.hook_logit_scale = HookPoint()  # [batch or 1, head_index, query_pos, 1]
        self._query_positions = None

    rotary = False  # RotaryAttention: q and k rotated

    # --- positional terms ----------------------------------------------------------------
    def apply_rotary(self, x, past_kv_pos_offset=0, attention_mask=None):
        return x  # RotaryAttention rotates

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

    # --- the explicit path -----------------------------------------------------------------
    def attention_scores(self, q, k):
        """Logits [batch, head, q_len, k_len]: q.k / attn_scale, times the logit scale, plus
        the position bias."""
        scores = q.permute(0, 2, 1, 3) @ k.permute(0, 2, 3, 1) / self.attn_scale
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
        masks (-inf), for queries at offset..offset+q_len-1 (what `hook_attn_scores` sees)."""
        scores = self.attention_scores(q, k)
        visible = relative_distance(scores.shape[-2], scores.shape[-1], scores.device) >= 0
        visible = visible[None, None]
        if attention_mask is not None:
            visible = visible & attention_mask[:, None, None, :].bool().to(scores.device)
        return scores.masked_fill(~visible, -torch.inf)

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
        """Whether `attention_rows` gives what `forward` computes: no hook (a patch, an
        ablation) changes the scores, pattern or position terms."""
        return not self.explicit_hooks_attached()

    def explicit_hooks_attached(self) -> bool:
        return any(getattr(self, n).has_hooks() for n in EXPLICIT_HOOKS if hasattr(self, n))

    def empty_rows(self, attention_mask) -> bool:
        # Key 0 is visible to every query, so only a masked key 0 (left padding) can leave a
        # row with no visible key, whose softmax is NaN: it is zeroed.
        return attention_mask is not None and not bool(attention_mask[:, 0].all())

    def fused_ok(self) -> bool:
        """The allowlist of the fused path: no hook on a value only the explicit path
        computes. Anything else: explicit path."""
        return self.fused and not self.explicit_hooks_attached()

    # --- forward -------------------------------------------------------------------------
    def forward(self, x, past_kv_cache_entry=None, attention_mask=None):
        """x [batch, pos, d_model] (ln1's output) -> [batch, pos, d_model]. With a KV cache
        entry, x holds the new positions and `attention_mask` covers every position."""
        q = self.hook_q(_heads(x, self.W_Q, self.b_Q))
        k = self.hook_k(_heads(x, self.W_K, self.b_K))
        v = self.hook_v(_heads(x, self.W_V, self.b_V))
        offset = 0
        if past_kv_cache_entry is not None:
            offset = past_kv_cache_entry.past_keys.size(1)
            k, v = past_kv_cache_entry.append(k, v)
        if self.rotary:
            q = self.hook_rot_q(self.apply_rotary(q, offset, attention_mask))
            k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))  # keys are cached
        self._query_positions = attention_mask
        try:
            empty_rows = self.empty_rows(attention_mask)
            if self.fused_ok():
                z = self.fused_z(q, k, v, attention_mask, empty_rows)
            else:
                scores = self.hook_attn_scores(self.masked_scores(q, k, offset, attention_mask))
                pattern = self.hook_pattern(self.softmax_pattern(scores, empty_rows))
                if self.dropout and self.training:
                    pattern = F.dropout(pattern, self.dropout, training=True)
                z = (pattern @ v.transpose(1, 2)).transpose(1, 2)
        finally:
            self._query_positions = None
        z = self.hook_z(z)  # [batch, pos, head, d_head]
        w_o = self.W_O.reshape(-1, self.cfg.d_model)  # [head * d_head, d_model], a view
        return F.linear(z.flatten(-2), w_o.T, self.b_O)

    def fused_z(self, q, k, v, attention_mask, empty_rows):
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
        # not give NaN (its output is zeroed below, as the explicit path zeroes its pattern)
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


class PEBlock(nn.Module):
    """A pre-norm block: resid_mid = x + attn(ln1(x)), resid_post = resid_mid +
    mlp(ln2(resid_mid)), with dropout on the attention and MLP outputs before each is added to
    the residual stream (as T5's decoder layers do; `dropout`, in training mode only).
    hook_attn_out and hook_mlp_out see the outputs before dropout."""

    def __init__(self, cfg: ModelConfig, block_index: int, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout
        self.ln1 = NORMS[cfg.normalization_type](cfg)
        self.ln2 = NORMS[cfg.normalization_type](cfg)
        self.attn = PEAttention(cfg, block_index)  # the model installs its layer's PE
        self.mlp = MLP(cfg)
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, resid_pre, past_kv_cache_entry=None, attention_mask=None):
        p = self.dropout if self.training else 0.0
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(
            self.attn(self.ln1(resid_pre), past_kv_cache_entry, attention_mask)
        )
        if p:
            attn_out = F.dropout(attn_out, p, training=True)
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        if p:
            mlp_out = F.dropout(mlp_out, p, training=True)
        return self.hook_resid_post(resid_mid + mlp_out)


# --- the model --------------------------------------------------------------------------------
class PETransformer(HookedRootModule):
    """A decoder-only transformer with a positional encoding per layer; see the module
    docstring.

    `cfg`: a `ModelConfig`; `tokenizer`: a transformers tokenizer (or None: token ids only);
    `layer_pes`: the PE registry (name -> `LayerPE`, `nopeinterp.models.registry.LAYER_PES`),
    and `arch_layouts` (arch -> the function that lays the blocks out, `ARCH_LAYOUTS`), handed
    in by the builder so this base never imports the modules built on it;
    `layer_pe`: each layer's `LayerPE` name; `pe_options`: the options of every PE used
    (each PE takes its own keys); `dropout`: on the embeddings, the attention weights and the
    attention and MLP outputs, in training mode; `arch`: "default" (pre-LayerNorm blocks with
    biases) or "t5" (the paper's T5 decoder layout, `nopeinterp.models.t5_arch`).
    """

    pe: str = ""
    absolute_embedding = False
    layer_pe_default = "nope"

    def __init__(
        self,
        cfg: ModelConfig,
        tokenizer=None,
        *,
        layer_pes: Mapping[str, LayerPE],
        layer_pe=None,
        dropout: float = 0.0,
        arch: str = "default",
        arch_layouts: Mapping | None = None,
        **pe_options,
    ):
        super().__init__()
        layer_pe = list(layer_pe or [self.layer_pe_default] * cfg.n_layers)
        specs = [layer_pes[name] for name in layer_pe]
        cfg.positional_embedding_type = (
            "rotary" if any(spec.rotary for spec in specs) else "standard"
        )
        self.cfg = cfg
        self.tokenizer = None
        if tokenizer is not None:
            self.set_tokenizer(tokenizer)
        self.layer_pe = layer_pe
        self.dropout = dropout
        self.arch = arch
        self.pe_options = self.resolve_pe_options(specs, pe_options)

        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if self.absolute_embedding:
            self.pos_embed = self.make_pos_embed()
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList(PEBlock(cfg, i, dropout) for i in range(cfg.n_layers))
        self.ln_final = NORMS[cfg.normalization_type](cfg)
        self.unembed = Unembed(cfg)
        self.install_layer_pes(specs)
        if cfg.init_weights:  # False: the caller loads every weight
            self.init_weights()
        if arch != "default":  # e.g. t5: T5's norm, MLP, tied output, no biases; T5's init
            (arch_layouts or {})[arch](self)
        self.setup()  # name the hook points (HookedRootModule)
        self.eval()

    def make_pos_embed(self) -> nn.Module:
        """For absolute embeddings: the `pos_embed` module, forward(tokens, past_kv_pos_offset,
        attention_mask) -> [batch, pos, d_model]."""
        raise NotImplementedError

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
                layer,
                position_bias=bias_of_layer.get(layer),
                dropout=self.dropout,
                **spec.attention_kwargs(self.cfg, self.pe_options),
            )

    def init_weights(self) -> None:
        """Every weight matrix (a parameter named W_*) drawn from N(0, cfg.initializer_range),
        in parameter order, after seeding torch with cfg.seed; norms 1, biases 0 (TL's GPT-2
        scheme, so a seed gives the weights it gave when these models were TL's)."""
        if self.cfg.seed is not None:
            torch.manual_seed(self.cfg.seed)
        for name, param in self.named_parameters():
            if "W_" in name:
                nn.init.normal_(param, std=self.cfg.initializer_range)

    # --- forward ---------------------------------------------------------------------------
    def forward(
        self,
        input,
        *,
        attention_mask=None,
        past_kv_cache: KVCache | None = None,
        stop_at_layer: int | None = None,
        start_at_layer: int | None = None,
        return_type: str | None = "logits",
    ):
        """Logits [batch, pos, d_vocab] of `input` (token ids [batch, pos] or [pos], a text or
        a list of texts; with `start_at_layer`, the residual stream before that block).

        `attention_mask` [batch, pos]: 1 on real tokens, 0 on padding (left or right);
        `past_kv_cache` (`init_kv_cache`): the positions before `input` (their mask is kept
        in the cache); `stop_at_layer=i`: the residual stream before block i instead of the
        logits (blocks i.. are not run); `return_type=None`: nothing (after every block).
        """
        biases = [m for m in self.modules() if isinstance(m, PositionBias)]
        for module in biases:
            module.memo = {}
        try:
            if start_at_layer is None:
                residual, attention_mask = self.embed_input(input, attention_mask, past_kv_cache)
            else:
                residual = input
            for i, block in list(enumerate(self.blocks))[start_at_layer:stop_at_layer]:
                entry = past_kv_cache[i] if past_kv_cache is not None else None
                residual = block(residual, entry, attention_mask)
            if stop_at_layer is not None:
                return residual
            residual = self.ln_final(residual)
            return None if return_type is None else self.unembed(residual)
        finally:
            for module in biases:
                module.memo = None

    def embed_input(self, input, attention_mask, past_kv_cache):
        """(residual stream before block 0, attention mask over every position or None)."""
        tokens = self.to_tokens(input) if isinstance(input, str | list) else input
        if tokens.ndim == 1:
            tokens = tokens[None]
        tokens = tokens.to(self.embed.W_E.device)
        if past_kv_cache is not None:
            if attention_mask is None:
                attention_mask = torch.ones_like(tokens)
            attention_mask = past_kv_cache.append_attention_mask(attention_mask)
        elif attention_mask is not None:
            attention_mask = attention_mask.to(tokens.device)
        offset = 0 if past_kv_cache is None else past_kv_cache.offset
        residual = self.hook_embed(self.embed(tokens))
        if self.absolute_embedding:
            pos = self.hook_pos_embed(self.pos_embed(tokens, offset, attention_mask))
            residual = residual + pos
        if self.dropout and self.training:
            residual = F.dropout(residual, self.dropout, training=True)
        return residual, attention_mask

    def run_with_cache(self, *args, return_cache_object=True, remove_batch_dim=False, **kwargs):
        """(output, ActivationCache) of a forward with every hook point (or those of
        `names_filter`) cached: HookedRootModule's, with TL's cache object (a plain dict
        with `return_cache_object=False`)."""
        out, cache = super().run_with_cache(*args, remove_batch_dim=remove_batch_dim, **kwargs)
        if return_cache_object:
            cache = ActivationCache(cache, self, has_batch_dim=not remove_batch_dim)
        return out, cache

    def init_kv_cache(self, batch: int) -> KVCache:
        """An empty KV cache for `batch` sequences, for `forward(..., past_kv_cache=)`."""
        return KVCache(self.cfg, batch, self.embed.W_E.device)

    # --- tokens ----------------------------------------------------------------------------
    def set_tokenizer(self, tokenizer) -> None:
        """Attach `tokenizer` as it is (nothing re-loaded or changed)."""
        self.tokenizer = tokenizer
        self.cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0

    def to_tokens(self, input, prepend_bos: bool | None = None, truncate: bool = True):
        """Token ids [batch, pos] of a text or a list of texts (padded on the tokenizer's
        side), with <bos> first if `prepend_bos` (default cfg.default_prepend_bos)."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give it token ids")
        bos = self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        if bos and not self.cfg.tokenizer_prepends_bos:
            start = self.tokenizer.bos_token
            input = start + input if isinstance(input, str) else [start + t for t in input]
        tokens = self.tokenizer(
            input,
            return_tensors="pt",
            padding=True,
            truncation=truncate,
            max_length=self.cfg.n_ctx if truncate else None,
        )["input_ids"]
        if not bos and self.cfg.tokenizer_prepends_bos:
            tokens = tokens[:, 1:]
        return tokens.to(self.cfg.device)

    def to_str_tokens(self, input, prepend_bos: bool | None = None):
        """The tokens of a text (or of ids [pos] / [1, pos]) as strings; a list: one each."""
        if isinstance(input, list):
            return [self.to_str_tokens(item, prepend_bos) for item in input]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos)[0]
        else:
            ids = torch.as_tensor(input).reshape(-1)
        return self.tokenizer.batch_decode(
            [[int(t)] for t in ids.tolist()], clean_up_tokenization_spaces=False
        )

    def to_string(self, tokens):
        """The text of ids [pos], or a list of texts of ids [batch, pos]."""
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 2:
            return self.tokenizer.batch_decode(tokens, clean_up_tokenization_spaces=False)
        return self.tokenizer.decode(tokens, clean_up_tokenization_spaces=False)

    # --- weights, devices ------------------------------------------------------------------
    @property
    def W_E(self) -> torch.Tensor:
        return self.embed.W_E

    @property
    def W_U(self) -> torch.Tensor:
        return self.unembed.W_U

    def to(self, *args, **kwargs):
        """nn.Module.to, keeping cfg.device and cfg.dtype the model's (the analyses place
        their tokens on cfg.device)."""
        device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None:
            self.cfg.device = device
        if dtype is not None:
            self.cfg.dtype = dtype
        return super().to(*args, **kwargs)

    def cuda(self, device=None):
        return self.to(torch.device("cuda") if device is None else torch.device("cuda", device))

    def cpu(self):
        return self.to(torch.device("cpu"))

    def extra_repr(self) -> str:
        mixed = len(set(self.layer_pe)) > 1
        return (
            f"pe={self.pe!r}, "
            + (f"arch={self.arch!r}, " if self.arch != "default" else "")
            + (f"layer_pe={self.layer_pe}, " if mixed else "")
            + (f"pe_options={self.pe_options}")
        )
