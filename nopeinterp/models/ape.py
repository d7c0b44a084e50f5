"""Absolute position embeddings added to the residual stream.

`ape`: a learned table W_pos [n_ctx, d_model] (TL's PosEmbed); it has no row past n_ctx, so
longer inputs raise a ValueError naming the limit.
`sinusoidal`: the fixed sin/cos embedding of Vaswani et al. (the paper's "APE"); computed for
any length, no parameters. Two layouts of the same numbers: "interleaved" (even dims sin, odd
dims cos; the default architecture) and "halves" (all sines, then all cosines: the official
`abs_sinusoid`, used by the T5 architecture).
"""

import math

import torch
from torch import nn
from transformer_lens.components import PosEmbed
from transformer_lens.utilities import get_offset_position_ids

from nopeinterp.models.base import PETransformer


class SlicedPosEmbed(PosEmbed):
    """TL's learned PosEmbed. When every row of the attention mask is real tokens then padding
    (no left padding: what training and teacher forcing give), the position ids are 0..T-1, so a
    slice of W_pos replaces TL's per-token gather and the scatter in its backward; otherwise,
    TL's own forward. Pads get 0, as in TL."""

    def forward(self, tokens, past_kv_pos_offset=0, attention_mask=None):
        if attention_mask is None or not bool(
            (attention_mask[:, 1:] <= attention_mask[:, :-1]).all()
        ):
            return super().forward(tokens, past_kv_pos_offset, attention_mask)
        end = past_kv_pos_offset + tokens.size(-1)
        pad = ~attention_mask[:, past_kv_pos_offset:end].bool()
        return torch.where(pad[..., None], 0, self.W_pos[past_kv_pos_offset:end])


class LearnedAPETransformer(PETransformer):
    pe = "ape"
    absolute_embedding = True

    def configure_positional_encoding(self):
        self.pos_embed = SlicedPosEmbed(self.cfg)

    def get_residual(self, embed, pos_offset, *args, **kwargs):
        end = pos_offset + embed.shape[1]
        if end > self.cfg.n_ctx:
            raise ValueError(
                f"learned APE has {self.cfg.n_ctx} positions (n_ctx); "
                f"got a sequence reaching position {end}"
            )
        return super().get_residual(embed, pos_offset, *args, **kwargs)


SINUSOID_LAYOUTS = ("interleaved", "halves")


def sinusoidal_embedding(
    positions: torch.Tensor, d_model: int, layout: str = "interleaved"
) -> torch.Tensor:
    """sin/cos embedding [*positions.shape, d_model]: even dims sin, odd dims cos
    ("interleaved"), or the d_model/2 sines then the cosines ("halves")."""
    device = positions.device
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=device)
        * (-math.log(10000.0) / d_model)
    )
    angles = positions.float()[..., None] * inv_freq
    if layout == "halves":
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)[..., :d_model]
    emb = torch.zeros(*positions.shape, d_model, device=device)
    emb[..., 0::2] = torch.sin(angles)
    emb[..., 1::2] = torch.cos(angles)[..., : d_model // 2]
    return emb


class SinusoidalPosEmbed(nn.Module):
    """Drop-in for TL's PosEmbed (same forward signature), with no parameters."""

    def __init__(self, cfg, layout: str = "interleaved"):
        super().__init__()
        self.cfg = cfg
        self.layout = layout

    def forward(self, tokens, past_kv_pos_offset=0, attention_mask=None):
        batch, length = tokens.shape
        if attention_mask is None:
            positions = torch.arange(
                past_kv_pos_offset, past_kv_pos_offset + length, device=tokens.device
            )
            positions = positions.expand(batch, length)
        else:
            positions = get_offset_position_ids(past_kv_pos_offset, attention_mask)
        emb = sinusoidal_embedding(positions.to(tokens.device), self.cfg.d_model, self.layout).to(
            self.cfg.dtype
        )
        if attention_mask is not None:  # zero on pads, as TL's PosEmbed does
            pad = ~attention_mask[:, past_kv_pos_offset:].bool()
            emb = emb.masked_fill(pad[..., None], 0.0)
        return emb


class SinusoidalTransformer(PETransformer):
    pe = "sinusoidal"
    absolute_embedding = True

    def configure_positional_encoding(self):
        self.pos_embed = SinusoidalPosEmbed(self.cfg)
