"""Rotary (RoPE), as TransformerLens implements it, on a fraction of each head's dims.

The paper rotates the first 25% of each head's dimensions with base 10000. TL caps its sin/cos
table at n_ctx and then fails on longer inputs; we grow the table instead, since rotary itself
has no length limit.
"""

from nopeinterp.models.base import PEAttention, PETransformer


class UncappedRotaryAttention(PEAttention):
    def apply_rotary(self, x, past_kv_pos_offset=0, attention_mask=None):
        needed = past_kv_pos_offset + x.size(1)
        if needed > self.rotary_cos.shape[0]:
            self._extend_rotary_embeddings(max(needed, 2 * self.rotary_cos.shape[0]))
        return super().apply_rotary(x, past_kv_pos_offset, attention_mask)


def rotary_dim(d_head: int, fraction: float) -> int:
    """Number of rotated dims: `fraction` of d_head, rounded down to an even number (>= 2)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"rotary fraction must be in (0, 1], got {fraction}")
    return max(2, int(d_head * fraction) // 2 * 2)


class RotaryTransformer(PETransformer):
    pe = "rotary"
    tl_positional_embedding_type = "rotary"

    def resolve_pe_options(self, fraction=0.25, base=10000):
        if self.cfg.rotary_dim != rotary_dim(self.cfg.d_head, fraction):
            raise ValueError("rotary_dim in the config does not match the rotary fraction")
        return {"fraction": fraction, "base": base}

    def configure_positional_encoding(self):
        self.use_attention(UncappedRotaryAttention)
