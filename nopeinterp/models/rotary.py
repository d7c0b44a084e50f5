"""Rotary (RoPE) on a fraction of each head's dims, with optional RoPE scaling for inputs
longer than the training context.

The paper rotates the first 25% of each head's dimensions with base 10000. The sin/cos table
grows with the input, since rotary itself has no length limit (TL 3.9 caps its table at n_ctx
and then fails on longer inputs).

RoPE scaling (`rope_scaling`, spelled as transformers' `rope_parameters`): "linear" (position
interpolation), "dynamic" (dynamic NTK: the base grows with the current length past
`original_max_position_embeddings`), "yarn" (NTK-by-parts interpolation plus YaRN's attention
factor, which multiplies cos and sin, so the rotated part of each logit by its square). It is an
inference-time setting of an existing rotary model: `set_rope_scaling(model, {...})` or
`load_checkpoint(path, rope_scaling={...})`; `original_max_position_embeddings` defaults to
the model's n_ctx. `rope_frequencies` is checked against transformers' `ROPE_INIT_FUNCTIONS`
in tests/test_new_pes.py.
"""

from __future__ import annotations

import math

import torch

from nopeinterp._tl import HookPoint, get_offset_position_ids
from nopeinterp.errors import check_choice
from nopeinterp.models.base import LayerPE, PEAttention, PETransformer
from nopeinterp.options import ROPE_TYPES

_ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor", "original_max_position_embeddings"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
}


def check_rope_scaling(rope_scaling, base, n_ctx) -> dict | None:
    """Validate a rope_parameters-style dict; returns it with `rope_type` and (for dynamic and
    yarn) `original_max_position_embeddings` filled in, or None for no scaling."""
    if rope_scaling is None:
        return None
    if not isinstance(rope_scaling, dict):
        raise ValueError(f"rope_scaling must be a dict, got {type(rope_scaling).__name__}")
    params = dict(rope_scaling)
    kind = params.pop("rope_type", params.pop("type", None))
    check_choice(kind, ROPE_TYPES, "rope_scaling rope_type", error=ValueError)
    theta = params.pop("rope_theta", base)
    if float(theta) != float(base):
        raise ValueError(f"rope_scaling: rope_theta {theta} differs from the model's base {base}")
    unknown = set(params) - _ROPE_KEYS[kind]
    if unknown:
        raise ValueError(f"rope_scaling: {kind} takes no {sorted(unknown)}")
    if kind == "default":
        return None
    if "factor" not in params or not float(params["factor"]) >= 1.0:
        raise ValueError(f"rope_scaling: {kind} needs a factor >= 1, got {params.get('factor')}")
    if kind in ("dynamic", "yarn"):
        params.setdefault("original_max_position_embeddings", n_ctx)
        if int(params["original_max_position_embeddings"]) < 1:
            raise ValueError("rope_scaling: original_max_position_embeddings must be >= 1")
    return {"rope_type": kind, **params}


def rope_frequencies(
    rotary_dim: int, base: float, rope_scaling: dict | None = None, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim // 2], attention factor) of RoPE with `rope_scaling`
    (a dict as `check_rope_scaling` returns) at the current length `seq_len` (dynamic only)."""
    d = rotary_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64).float() / d
    inv_freq = 1.0 / (base**exponents)
    if rope_scaling is None:
        return inv_freq, 1.0
    kind, factor = rope_scaling["rope_type"], float(rope_scaling["factor"])
    if kind == "linear":  # position interpolation: positions / factor
        return inv_freq / factor, 1.0
    original = int(rope_scaling["original_max_position_embeddings"])
    if kind == "dynamic":
        if d <= 2:
            raise ValueError("dynamic NTK scaling needs rotary_dim > 2 (its exponent is d/(d-2))")
        length = max(seq_len or original, original)
        new_base = base * ((factor * length / original) - (factor - 1)) ** (d / (d - 2))
        return 1.0 / (new_base**exponents), 1.0

    # yarn: interpolate the low frequencies, keep the high ones, ramp between
    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope_scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
        attention_factor = (
            mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        )
    beta_fast = rope_scaling.get("beta_fast") or 32
    beta_slow = rope_scaling.get("beta_slow") or 1

    def correction_dim(rotations):  # the dim whose wavelength fits `rotations` times in original
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    inv_freq = (inv_freq / factor) * ramp + inv_freq * (1 - ramp)
    return inv_freq, float(attention_factor)


class RotaryAttention(PEAttention):
    """Rotary on the first cfg.rotary_dim dims of each head's q and k (GPT-NeoX's halves, or
    GPT-J's adjacent pairs with cfg.rotary_adjacent_pairs), positions counted from each
    sequence's first real token under left padding. The sin/cos table grows with the input
    (rotary itself has no length limit); with `rope_scaling`, its frequencies and attention
    factor are `rope_frequencies`'."""

    rotary = True

    def __init__(self, *args, rope_scaling=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.hook_rot_k = HookPoint()  # [batch, key_pos, head_index, d_head]
        self.hook_rot_q = HookPoint()  # [batch, query_pos, head_index, d_head]
        self.rope_scaling = rope_scaling
        self._table_key = None  # what the current table was built for
        self.register_buffer("rotary_sin", torch.empty(0), persistent=False)
        self.register_buffer("rotary_cos", torch.empty(0), persistent=False)
        self._build_table(self.cfg.n_ctx, None)

    def set_rope_scaling(self, rope_scaling) -> None:
        self.rope_scaling = rope_scaling
        self._build_table(self.rotary_cos.shape[0], None)

    def _build_table(self, size: int, seq_len) -> None:
        cfg = self.cfg
        positions = torch.arange(size, dtype=torch.float32)[:, None]
        if self.rope_scaling is None:  # divided by the frequencies, as TL 3.9 computed it
            exponents = torch.arange(0, cfg.rotary_dim, 2, dtype=torch.float32) / cfg.rotary_dim
            angles, factor = positions / (cfg.rotary_base**exponents), 1.0
        else:
            inv_freq, factor = rope_frequencies(
                cfg.rotary_dim, cfg.rotary_base, self.rope_scaling, seq_len
            )
            angles = positions * inv_freq
        angles = (
            angles.repeat_interleave(2, -1) if cfg.rotary_adjacent_pairs else angles.repeat(1, 2)
        )
        device = self.W_Q.device
        self.rotary_sin = (angles.sin() * factor).to(device, cfg.dtype)
        self.rotary_cos = (angles.cos() * factor).to(device, cfg.dtype)
        self._table_key = (
            size,
            seq_len,
            None if self.rope_scaling is None else repr(self.rope_scaling),
        )

    def rotate_every_two(self, x):
        """The rotation's partner of each dim: [x0, x1] -> [-x1, x0] per pair."""
        if self.cfg.rotary_adjacent_pairs:
            return torch.stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)
        half = x.size(-1) // 2
        return torch.cat([-x[..., half:], x[..., :half]], -1)

    def apply_rotary(self, x, past_kv_pos_offset=0, attention_mask=None):
        """x [batch, pos, head, d_head] at positions past_kv_pos_offset.. rotated."""
        needed = past_kv_pos_offset + x.size(1)
        size = self.rotary_cos.shape[0]
        dynamic = self.rope_scaling is not None and self.rope_scaling["rope_type"] == "dynamic"
        if dynamic:  # frequencies depend on the current length, as in transformers
            original = self.rope_scaling["original_max_position_embeddings"]
            seq_len = max(needed, original)
            if self._table_key[1] != seq_len or needed > size:
                self._build_table(max(needed, size), seq_len)
        elif needed > size:
            self._build_table(max(needed, 2 * size), None)
        if attention_mask is None:
            cos = self.rotary_cos[None, past_kv_pos_offset:needed, None]
            sin = self.rotary_sin[None, past_kv_pos_offset:needed, None]
        else:
            positions = get_offset_position_ids(past_kv_pos_offset, attention_mask)
            positions = positions.to(self.rotary_cos.device)
            cos, sin = self.rotary_cos[positions, None], self.rotary_sin[positions, None]
        d = self.cfg.rotary_dim
        x_rot, x_pass = x[..., :d], x[..., d:]
        rotated = x_rot * cos + self.rotate_every_two(x_rot) * sin
        return torch.cat([rotated, x_pass], -1)


def rotary_dim(d_head: int, fraction: float) -> int:
    """Number of rotated dims: `fraction` of d_head, rounded down to an even number (>= 2)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"rotary fraction must be in (0, 1], got {fraction}")
    return max(2, int(d_head * fraction) // 2 * 2)


class Rotary(LayerPE):
    name = "rotary"
    rotary = True
    attention_cls = RotaryAttention

    def resolve_options(self, cfg, fraction=0.25, base=10000, rope_scaling=None):
        if cfg.rotary_dim != rotary_dim(cfg.d_head, fraction):
            raise ValueError("rotary_dim in the config does not match the rotary fraction")
        options = {"fraction": fraction, "base": base}
        scaling = check_rope_scaling(rope_scaling, base, cfg.n_ctx)
        if scaling is not None:
            options["rope_scaling"] = scaling
        return options

    def attention_kwargs(self, cfg, options):
        return {"rope_scaling": options.get("rope_scaling")}


class RotaryTransformer(PETransformer):
    pe = layer_pe_default = "rotary"
