"""ALiBi: a fixed, head-specific linear penalty -slope_h * (query_pos - key_pos) on the logits.

Slopes follow the ALiBi paper (Press et al. 2022): for n heads a power of two, the geometric
sequence starting at 2^(-8/n); otherwise the slopes of the closest lower power of two p,
followed by every other slope of 2p, as in the paper's code. The bias is rebuilt for each
input shape: TL 3.9's own ALiBi caches it at the longest length seen and then offsets the
scores of shorter inputs per row.

Two forms with the same attention pattern (they differ by a constant per query row, which the
softmax removes): "distance", -slope_h * (query_pos - key_pos) (the default architecture), and
"keys", +slope_h * key_pos (the official code's and BLOOM's `build_alibi_tensor`, used by the
T5 architecture), key positions counted from each sequence's first real token.
"""

import math

import torch

from nopeinterp.models.base import LayerPE, PETransformer, PositionBias, relative_distance


def _geometric_slopes(n: int) -> torch.Tensor:
    """The power-of-two case: the geometric sequence 2^(-8/n), (2^(-8/n))^2, ..."""
    start = 2 ** (-8 / n)
    return start * start ** torch.arange(n)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    power_of_two = 2 ** math.floor(math.log2(n_heads))
    slopes = _geometric_slopes(power_of_two)
    if power_of_two < n_heads:
        extra = _geometric_slopes(2 * power_of_two)[0::2]
        slopes = torch.cat([slopes, extra[: n_heads - power_of_two]])
    return slopes


ALIBI_FORMS = ("distance", "keys")


class ALiBiBias(PositionBias):
    def __init__(self, n_heads: int, form: str = "distance"):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)
        self.form = form

    @property
    def reads_query_positions(self) -> bool:  # the key form counts from the first real token
        return self.form == "keys"

    def forward(self, q_len: int, k_len: int, query_positions=None) -> torch.Tensor:
        device = self.slopes.device
        if self.form == "distance":
            distance = relative_distance(q_len, k_len, device).clamp(min=0)
            return (-self.slopes[:, None, None] * distance).unsqueeze(0)
        keys = torch.arange(k_len, device=device)[None]  # [batch or 1, key]
        if query_positions is not None:  # left padding: shift each row by its pad count
            pads = (k_len - 1) - query_positions.to(device)[:, -1:]
            keys = (keys - pads).clamp(min=0)
        bias = self.slopes[None, :, None, None] * keys[:, None, None, :].to(self.slopes.dtype)
        return bias.expand(-1, -1, q_len, -1)


class ALiBi(LayerPE):
    name = "alibi"
    bias_attr = "alibi_bias"

    def shared(self, options):
        return True  # no parameters: one module serves every layer

    def make_bias(self, cfg, options):
        return ALiBiBias(cfg.n_heads)


class ALiBiTransformer(PETransformer):
    pe = layer_pe_default = "alibi"
