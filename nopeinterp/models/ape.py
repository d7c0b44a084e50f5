"""Absolute position embeddings added to the residual stream.

`ape`: a learned table W_pos [n_ctx, d_model]; it has no row past n_ctx, so
longer inputs raise a ValueError naming the limit.
`sinusoidal`: the fixed sin/cos embedding of Vaswani et al. (the paper's "APE"); computed for
any length, no parameters. Two layouts of the same numbers: "interleaved" (even dims sin, odd
dims cos; the default architecture) and "halves" (all sines, then all cosines: the official
`abs_sinusoid`, used by the T5 architecture).
"""

import math

import torch
from torch import nn

from nopeinterp._tl import get_offset_position_ids
from nopeinterp.models.base import PETransformer


class LearnedPosEmbed(nn.Module):
    """A learned table W_pos [n_ctx, d_model]: row p for a token at position p, counted from
    each sequence's first real token under left padding; pads get 0. When every row of the
    attention mask is real tokens then padding (no left padding: what training and teacher
    forcing give), the positions are 0..T-1 and a slice of W_pos is used (no per-token gather,
    no scatter in the backward)."""

    def __init__(self, cfg):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens, past_kv_pos_offset=0, attention_mask=None):
        end = past_kv_pos_offset + tokens.size(-1)
        if end > self.W_pos.shape[0]:
            raise ValueError(
                f"learned APE has {self.W_pos.shape[0]} positions (n_ctx); "
                f"got a sequence reaching position {end}"
            )
        if attention_mask is None:
            return self.W_pos[past_kv_pos_offset:end].expand(tokens.size(0), -1, -1).clone()
        pad = ~attention_mask[:, past_kv_pos_offset:end].bool()
        if bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
            return torch.where(pad[..., None], 0, self.W_pos[past_kv_pos_offset:end])
        positions = get_offset_position_ids(past_kv_pos_offset, attention_mask)
        return torch.where(pad[..., None], 0, self.W_pos[positions])


class LearnedAPETransformer(PETransformer):
    pe = "ape"
    absolute_embedding = True

    def make_pos_embed(self):
        return LearnedPosEmbed(self.cfg)


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
    """The sin/cos embedding of each token's position (counted from its sequence's first real
    token under left padding; pads get 0), with no parameters. The rows are computed once per
    layout and device (at least n_ctx of them) and looked up: they are a fixed function of
    position, and computing them per token at every step cost a few percent of a step."""

    def __init__(self, cfg, layout: str = "interleaved"):
        super().__init__()
        self.cfg = cfg
        self.layout = layout
        self._rows: tuple[tuple, torch.Tensor] | None = None  # ((layout, device), table)

    def table(self, length: int, device) -> torch.Tensor:
        """Rows 0..length-1 (at least) of the embedding, float32 on `device`."""
        key = (self.layout, torch.device(device))
        if self._rows is None or self._rows[0] != key or self._rows[1].shape[0] < length:
            positions = torch.arange(max(length, self.cfg.n_ctx), device=device)
            self._rows = (key, sinusoidal_embedding(positions, self.cfg.d_model, self.layout))
        return self._rows[1]

    def forward(self, tokens, past_kv_pos_offset=0, attention_mask=None):
        batch, length = tokens.shape
        end = past_kv_pos_offset + length
        table = self.table(end, tokens.device)
        if attention_mask is None:
            emb = table[past_kv_pos_offset:end].expand(batch, length, -1)
            return emb.to(self.cfg.dtype, copy=True)
        positions = get_offset_position_ids(past_kv_pos_offset, attention_mask)
        emb = table[positions.to(tokens.device)].to(self.cfg.dtype)
        # zero on pads, as a learned table gives
        pad = ~attention_mask[:, past_kv_pos_offset:].bool()
        return emb.masked_fill(pad[..., None], 0.0)


class SinusoidalTransformer(PETransformer):
    pe = "sinusoidal"
    absolute_embedding = True

    def make_pos_embed(self):
        return SinusoidalPosEmbed(self.cfg)
