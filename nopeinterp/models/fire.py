"""FIRE (Li et al. 2023, arXiv 2310.04418): a learned causal score bias

    bias_h(i, j) = f_h( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

for query position i and key position j <= i; f a small MLP (1 -> hidden -> heads, ReLU),
c > 0 and the threshold L learned (used as |c| and |L|). Position i counts from the sequence's
first token: under left padding from its first real token, so a padded batch gets the bias
each sequence gets alone. The bias [1, head, query, key] shows in
`attn.hook_position_bias`. One FIRE module is shared by the layers that use it unless
`shared=False`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nopeinterp.models.base import LayerPE, PETransformer, PositionBias, relative_distance


class FIREBias(PositionBias):
    def __init__(self, n_heads: int, hidden: int, c: float, threshold: float):
        super().__init__()
        # "W_" names: TL's init_weights initialises them like the other weight matrices.
        self.W_in = nn.Parameter(torch.empty(1, hidden))
        self.b_in = nn.Parameter(torch.zeros(hidden))
        self.W_out = nn.Parameter(torch.empty(hidden, n_heads))
        self.b_out = nn.Parameter(torch.zeros(n_heads))
        self.c = nn.Parameter(torch.tensor(float(c)))
        self.threshold = nn.Parameter(torch.tensor(float(threshold)))

    reads_query_positions = True

    def forward(self, q_len: int, k_len: int, query_positions=None) -> torch.Tensor:
        device = self.W_in.device
        distance = relative_distance(q_len, k_len, device).clamp(min=0).float()
        if query_positions is None:
            query = torch.arange(k_len - q_len, k_len, device=device).float()[None]
        else:  # left padding: a query's position counts from its sequence's first token
            query = query_positions.to(device).float()
        c = self.c.abs()
        normaliser = torch.log(c * torch.maximum(query, self.threshold.abs()) + 1)
        x = torch.log(c * distance + 1) / normaliser[..., None]  # [batch or 1, query, key]
        hidden = F.relu(x[..., None] * self.W_in[0] + self.b_in)
        return (hidden @ self.W_out + self.b_out).permute(0, 3, 1, 2)


class FIRE(LayerPE):
    name = "fire"
    bias_attr = "fire_bias"

    def resolve_options(self, cfg, fire_hidden=32, fire_c=1.0, fire_threshold=None, shared=True):
        threshold = float(cfg.n_ctx if fire_threshold is None else fire_threshold)
        if int(fire_hidden) < 1 or not fire_c > 0 or not threshold > 0:
            raise ValueError("fire needs fire_hidden >= 1, fire_c > 0 and fire_threshold > 0")
        return {
            "fire_hidden": int(fire_hidden),
            "fire_c": float(fire_c),
            "fire_threshold": threshold,
            "shared": shared,
        }

    def make_bias(self, cfg, options):
        return FIREBias(
            cfg.n_heads, options["fire_hidden"], options["fire_c"], options["fire_threshold"]
        )


class FIRETransformer(PETransformer):
    pe = layer_pe_default = "fire"
