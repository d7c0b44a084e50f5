"""KERPLE, log variant (Chi et al. 2022, arXiv 2205.09921): a learned causal score bias

    bias_h(i, j) = -r1_h * log(1 + r2_h * (i - j)),   r1_h, r2_h > 0,

one (r1, r2) pair per head, initialised to 1 and clamped to >= 1e-2 in the forward (as the
paper's code clamps them). The bias [1, head, query, key] shows in `attn.hook_position_bias`.
One module is shared by the layers that use it unless `shared=False`.
"""

from __future__ import annotations

import torch
from torch import nn

from nopeinterp.models.base import LayerPE, PETransformer, PositionBias, relative_distance

MIN_PARAM = 1e-2


class KerpleLogBias(PositionBias):
    def __init__(self, n_heads: int):
        super().__init__()
        self.r1 = nn.Parameter(torch.ones(n_heads))
        self.r2 = nn.Parameter(torch.ones(n_heads))

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        distance = relative_distance(q_len, k_len, self.r1.device).clamp(min=0).float()
        r1 = self.r1.clamp(min=MIN_PARAM)[:, None, None]
        r2 = self.r2.clamp(min=MIN_PARAM)[:, None, None]
        return (-r1 * torch.log1p(r2 * distance)).unsqueeze(0)


class Kerple(LayerPE):
    name = "kerple"
    bias_attr = "kerple_bias"

    def resolve_options(self, cfg, shared=True):
        return {"shared": shared}

    def make_bias(self, cfg, options):
        return KerpleLogBias(cfg.n_heads)


class KerpleTransformer(PETransformer):
    pe = layer_pe_default = "kerple"
