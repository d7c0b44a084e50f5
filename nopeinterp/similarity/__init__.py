"""Attention similarity between models (Kazemnejad et al. 2023, "NoPE attends like T5").

- `jsd`, `paper_jsd`: the Jensen-Shannon divergence and the official code's variant.
- `attention_divergence(model_a, model_b, data)`: tidy per-(example, layer) frame.
- the paper's inputs: `nopeinterp.data.make_sequences(task, n_per_length=10)`.
- `compare_attention(nope, refs, data)`: bootstrap table, ranking, figures, HTML report.
- the report's attention-mass-by-distance profile comes from nopeinterp.probing.distance.
- `explorer_data(models, examples)`: attention patterns for the explorer (drawn by viz).
"""

from nopeinterp.similarity.compare import (
    ComparisonResult,
    bootstrap_ci,
    compare_attention,
    distance_profile,
    rank_refs,
    summarize,
)
from nopeinterp.similarity.divergence import (
    HEAD_REDUCERS,
    attention_divergence,
    attention_patterns,
    head_pair_divergence,
    paper_head_pairs,
    reduce_heads,
)
from nopeinterp.similarity.explorer import explorer_data
from nopeinterp.similarity.jsd import jsd, paper_jsd

__all__ = [
    "HEAD_REDUCERS",
    "ComparisonResult",
    "attention_divergence",
    "attention_patterns",
    "bootstrap_ci",
    "compare_attention",
    "distance_profile",
    "explorer_data",
    "head_pair_divergence",
    "jsd",
    "paper_head_pairs",
    "paper_jsd",
    "rank_refs",
    "reduce_heads",
    "summarize",
]
