"""Probing analyses: linear position probes (Theorem 1) and distance dependence of attention
logits (Theorem 2).

    probe_position(model_or_ckpt, data=None) -> ProbeResult      # .table, .pivot(), .figure(), .save(dir)
    distance_dependence(model_or_ckpt, data=None) -> DistanceResult  # .table, .mass, .rel_mass
    fit_ridge(X, Y, alphas) -> RidgeProbe               # closed-form ridge (torch, float64)
    distance_r2(scores, valid_mask)                     # the score on raw logit tensors
"""

from nopeinterp.probing.distance import (
    DistanceResult,
    DistanceStats,
    distance_dependence,
    distance_r2,
)
from nopeinterp.probing.position import (
    ProbeResult,
    probe_layers,
    probe_position,
)
from nopeinterp.probing.ridge import DEFAULT_ALPHAS, RidgePath, RidgeProbe, RidgeStats, fit_ridge

__all__ = [
    "DEFAULT_ALPHAS",
    "DistanceResult",
    "DistanceStats",
    "ProbeResult",
    "RidgePath",
    "RidgeProbe",
    "RidgeStats",
    "distance_dependence",
    "distance_r2",
    "fit_ridge",
    "probe_layers",
    "probe_position",
]
