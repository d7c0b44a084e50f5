"""Probing analyses: linear position probes (Theorem 1) and distance dependence of attention
logits (Theorem 2).

    probe_position(model_or_ckpt, data=None) -> ProbeResult      # .table, .pivot(), .figure(), .save(dir)
    distance_dependence(model_or_ckpt, data=None) -> DistanceResult  # .table, .mass, .rel_mass
    fit_ridge(X, Y, alphas) -> RidgeProbe               # closed-form ridge (torch, float64)
    distance_r2(scores, valid_mask)                     # the score on raw logit tensors
    erase_position(model_or_ckpt, data=None) -> ErasureResult   # LEACE erasure + random control
    attention_sinks(model_or_ckpt, data=None) -> SinkResult     # first-token mass, entropy vs log n
    classify_heads(model_or_ckpt, data=None) -> HeadTaxonomy    # positional head labels
    attention_regions(model_or_ckpt, data=None) -> RegionResult # mass on prompt / scratchpad parts
"""

from nopeinterp.probing.distance import (
    DistanceResult,
    DistanceStats,
    distance_dependence,
    distance_r2,
)
from nopeinterp.probing.erasure import ErasureResult, erase_position
from nopeinterp.probing.heads import HeadTaxonomy, SinkResult, attention_sinks, classify_heads
from nopeinterp.probing.position import (
    ProbeResult,
    probe_layers,
    probe_position,
)
from nopeinterp.probing.regions import RegionResult, attention_regions
from nopeinterp.probing.ridge import DEFAULT_ALPHAS, RidgePath, RidgeProbe, RidgeStats, fit_ridge

__all__ = [
    "DEFAULT_ALPHAS",
    "DistanceResult",
    "DistanceStats",
    "ErasureResult",
    "HeadTaxonomy",
    "ProbeResult",
    "RegionResult",
    "RidgePath",
    "RidgeProbe",
    "RidgeStats",
    "SinkResult",
    "attention_regions",
    "attention_sinks",
    "classify_heads",
    "distance_dependence",
    "distance_r2",
    "erase_position",
    "fit_ridge",
    "probe_layers",
    "probe_position",
]
