"""Fused attention for the HookedTransformers `from_hf` builds (TransformerLens 3.x).

TransformerLens' attention always materialises the [batch, head, query, key] scores and
pattern, so at real size (T = 1024 and more) a forward that reads only the residual stream
spends most of its time and memory on them. `install_fused_attention` gives each supported
attention module a forward that runs `F.scaled_dot_product_attention` instead whenever nothing
needs the explicit tensors, as our own models' `PEAttention` does: no hook on
`hook_attn_scores` or `hook_pattern`, no KV cache, no extra additive mask or position bias.
When a hook reads them (a `run_with_cache` or `run_with_hooks` that names them adds one), the
same forward computes TL's explicit attention with the same hook values, but masks the scores
in place and zeroes NaN rows of the pattern in place: at most the scores and the pattern of
one layer are alive at once (TL's own forward also holds a masked copy, a `zeros_like` and a
NaN mask of the same size). A KV cache, an additive mask or a position bias gets TL's own
forward. Every other hook (q, k, v, rot_q, rot_k, z, and those outside attention) fires as
before.

Supported: TL's `Attention` and `GroupedQueryAttention` with learned or rotary positions,
global causal attention, and none of the options that change the scores (soft-capping, log-n
scaling, attention sinks, QK clipping, OLMo's norm, a split attention result); any other
module keeps TL's forward.

`install_fused_activation` does the same for the MLP's tanh-approximated GELU (GPT-2's
`gelu_new`, `gelu_fast`, `gelu_pytorch_tanh`): TL evaluates the formula in eager steps, each a
[batch, pos, d_mlp] temporary (three or four alive at once, the largest term of a long
forward's memory); `F.gelu(approximate="tanh")` is one kernel for the same function (within
float32 rounding; in bfloat16 it rounds once where the formula rounds at every step).
`install_fused_unembed` skips the unembedding's bias while it is zero (a Hugging Face LM head
has none; TL's zero `b_U` made the matmul an addmm that first broadcasts it into the whole
[batch, pos, vocab] output).
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

EXPLICIT_HOOKS = ("hook_attn_scores", "hook_pattern")


def fusable(attn) -> bool:
    """Whether `attn` (a TL 3.x attention module) computes nothing SDPA would not."""
    from transformer_lens.components import Attention, GroupedQueryAttention

    cfg = attn.cfg
    return (
        type(attn) in (Attention, GroupedQueryAttention)
        and cfg.positional_embedding_type in ("standard", "rotary")
        and getattr(attn, "attn_type", "global") == "global"
        and cfg.attention_dir == "causal"
        and getattr(attn, "_attention_dir_override", None) in (None, "causal")
        and not (cfg.attn_scores_soft_cap is not None and cfg.attn_scores_soft_cap > 0)
        and not getattr(cfg, "use_logn_attn", False)
        and not getattr(cfg, "use_attention_sinks", False)
        and getattr(cfg, "clip_qkv", None) is None
        and not getattr(cfg, "load_in_4bit", False)
        and not cfg.use_attn_result
        and not str(cfg.original_architecture).startswith("Olmo")
    )


def install_fused_attention(model) -> int:
    """Give every fusable attention module of `model` the fused forward; returns how many."""
    count = 0
    for block in model.blocks:
        attn = block.attn
        if fusable(attn):
            attn.forward = types.MethodType(_forward, attn)
            count += 1
    return count


TANH_GELUS = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh")


def install_fused_activation(model) -> int:
    """Give every MLP of `model` whose activation is a tanh-approximated GELU the one-kernel
    GELU; returns how many. `hook_pre` and `hook_post` fire as before."""
    if model.cfg.act_fn not in TANH_GELUS:
        return 0
    count = 0
    for block in model.blocks:
        mlp = getattr(block, "mlp", None)
        if mlp is not None and hasattr(mlp, "act_fn"):
            mlp.act_fn = functools.partial(F.gelu, approximate="tanh")
            count += 1
    return count


def install_fused_unembed(model) -> bool:
    """Give `model.unembed` a forward that adds `b_U` only while it is nonzero (checked at
    each call, so a bias set later is used); `hook_in` and `hook_out` fire as before."""
    unembed = getattr(model, "unembed", None)
    if unembed is None or not isinstance(getattr(unembed, "b_U", None), torch.Tensor):
        return False
    unembed.forward = types.MethodType(_unembed_forward, unembed)
    return True


def _unembed_forward(self, residual):
    residual = self.hook_in(residual)
    bias = self.b_U if bool(self.b_U.any()) else None
    # TL's layout (nn.Linear's weight), so bfloat16 accumulates as in the Hugging Face model
    return self.hook_out(F.linear(residual, self.W_U.T.contiguous(), bias))


def _forward(
    self,
    query_input,
    key_input,
    value_input,
    past_kv_cache_entry=None,
    additive_attention_mask=None,
    attention_mask=None,
    position_bias=None,
):
    if any(x is not None for x in (past_kv_cache_entry, additive_attention_mask, position_bias)):
        # TL's own forward, unchanged
        return type(self).forward(
            self, query_input, key_input, value_input, past_kv_cache_entry,
            additive_attention_mask, attention_mask, position_bias,
        )  # fmt: skip
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
    if self.cfg.positional_embedding_type == "rotary":
        q = self.hook_rot_q(self.apply_rotary(q, 0, attention_mask))
        k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))
    repeat = getattr(self, "repeat_kv_heads", 1)
    if repeat > 1 and not self.cfg.ungroup_grouped_query_attention:
        k = torch.repeat_interleave(k, dim=2, repeats=repeat)
        v = torch.repeat_interleave(v, dim=2, repeats=repeat)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, head, pos, d_head]
    padded = attention_mask is not None and not bool(attention_mask.all())
    n = q.shape[2]
    explicit = any(getattr(self, name).has_hooks() for name in EXPLICIT_HOOKS)
    visible = None
    if padded or explicit:
        # TL's mask: causal and the key's padding flag
        visible = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()[None, None]
        if padded:
            visible = visible & attention_mask[:, None, None, :].bool().to(q.device)
    if not explicit:
        scale = 1.0 / float(self.attn_scale)
        if visible is None:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            # a row with no visible key (a left pad) has a NaN pattern that TL zeroes, so its
            # z is zero here too
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
            z = z.masked_fill(~visible.any(-1, keepdim=True), 0.0)
    else:  # TL's explicit attention, the same values at its hooks
        scores = (q @ k.transpose(-1, -2)).div_(self.attn_scale)
        scores = self.hook_attn_scores(scores.masked_fill_(~visible, float("-inf")))
        pattern = F.softmax(scores, dim=-1)
        del scores  # unless a hook keeps it
        pattern = self.hook_pattern(pattern.nan_to_num_(0.0))  # rows with no visible key
        z = pattern.to(v.dtype) @ v
        del pattern
    z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
    w = self.W_O.reshape(-1, self.W_O.shape[-1])  # [(head d_head), d_model]
    z = z.reshape(z.shape[0], z.shape[1], -1).to(w.dtype)
    return F.linear(z, w.T, self.b_O.to(z.device))
