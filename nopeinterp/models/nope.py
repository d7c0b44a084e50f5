"""NoPE: no positional encoding at all. Position can only come from the causal mask.

Optionally with an attention temperature (Wang et al. 2024, arXiv 2404.12224; Llama 4's NoPE
layers): the logits of head h at query position p are multiplied by
    logit_scale[h] * (1 + log_scale * log(floor((p + 1) / log_floor) + 1)),
`logit_scale` a per-head factor, set (a number or one per head) or learned ("learned",
initialised to 1); the second factor is Llama 4's log-length scaling (off when
log_scale == 0). The factor [batch or 1, head, query, 1] shows in `attn.hook_logit_scale`.
Positions are TL's position ids (left padding skipped), as rotary uses.
"""

from __future__ import annotations

import torch
from torch import nn

from nopeinterp.models.base import LayerPE, PETransformer


def log_length_scale(positions: torch.Tensor, floor: int, scale: float) -> torch.Tensor:
    """Llama 4's temperature: 1 + scale * log(floor((p + 1) / floor) + 1) per position p."""
    return 1.0 + scale * torch.log(torch.floor((positions.float() + 1.0) / floor) + 1.0)


class LogitScale(nn.Module):
    """positions [batch or 1, query] -> factor [batch or 1, head, query, 1] on the logits."""

    def __init__(self, n_heads: int, logit_scale, log_scale: float, log_floor: int):
        super().__init__()
        self.log_scale, self.log_floor = log_scale, log_floor
        if logit_scale == "learned":
            self.scale = nn.Parameter(torch.ones(n_heads))
        else:
            value = torch.as_tensor(1.0 if logit_scale is None else logit_scale, dtype=torch.float)
            self.register_buffer("scale", value.expand(n_heads).clone(), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        factor = self.scale[None, :, None, None].expand(1, -1, positions.shape[-1], 1)
        if self.log_scale:
            length = log_length_scale(positions, self.log_floor, self.log_scale)
            factor = factor * length[:, None, :, None].to(factor.dtype)
        return factor


class NoPE(LayerPE):
    name = "nope"

    def resolve_options(self, cfg, logit_scale=None, log_scale=0.0, log_floor=1):
        if isinstance(logit_scale, str) and logit_scale != "learned":
            raise ValueError(
                f"logit_scale must be a number, a list or 'learned', got {logit_scale!r}"
            )
        if isinstance(logit_scale, (list, tuple)):
            if len(logit_scale) != cfg.n_heads:
                raise ValueError(
                    f"logit_scale has {len(logit_scale)} values for {cfg.n_heads} heads"
                )
            logit_scale = [float(v) for v in logit_scale]
        elif logit_scale is not None and logit_scale != "learned":
            logit_scale = float(logit_scale)
        if int(log_floor) < 1:
            raise ValueError(f"log_floor must be >= 1, got {log_floor}")
        options = {
            "logit_scale": logit_scale,
            "log_scale": float(log_scale),
            "log_floor": int(log_floor),
        }
        # plain NoPE records no options, as before
        return {} if options == {"logit_scale": None, "log_scale": 0.0, "log_floor": 1} else options

    def attention_kwargs(self, cfg, options):
        if options.get("logit_scale") is None and not options.get("log_scale"):
            return {}
        return {
            "logit_scale": LogitScale(
                cfg.n_heads, options.get("logit_scale"), options["log_scale"], options["log_floor"]
            )
        }


class NoPETransformer(PETransformer):
    pe = "nope"
