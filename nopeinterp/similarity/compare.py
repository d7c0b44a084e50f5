"""Which positional encoding does NoPE attend like? The paper's ranking, with bootstrap CIs.

compare_attention(nope, {"t5": ..., "alibi": ...}, data) runs `attention_divergence(nope, ref)`
for every reference (NoPE is run once per batch for all of them) and summarises:
per (ref, layer, split) the mean over examples with a 95% bootstrap CI over examples, plus
layer "all" (each example's mean over layers first, then the CI over examples), and a ranking
per split, closest first. A second NoPE run (`nope_prime`, another seed) gives the noise floor
the paper compares against; it is included as ref "nope_prime".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pandas as pd
import torch

from nopeinterp.data import Splits, as_splits, make_sequences, max_positions
from nopeinterp.inputs import ModelInput, as_model, sequences
from nopeinterp.options import CompareOptions, DistanceOptions
from nopeinterp.results import Result
from nopeinterp.similarity.divergence import (
    attention_patterns,
    check_compatible,
    divergence_frames,
)

NOPE_PRIME = "nope_prime"


def bootstrap_ci(
    values, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(mean, low, high): percentile bootstrap CI of the mean, resampling `values`."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return np.nan, np.nan, np.nan
    mean = float(values.mean())
    if values.size == 1 or n_boot < 1:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    step = max(1, 2_000_000 // values.size)  # bound the index matrix
    for s in range(0, n_boot, step):
        k = min(step, n_boot - s)
        means[s : s + k] = values[rng.integers(0, values.size, (k, values.size))].mean(1)
    alpha = (1.0 - level) / 2
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    # A CI of the mean contains the mean; guard against float ties at degenerate samples.
    return mean, float(min(low, mean)), float(max(high, mean))


def summarize(per_example: pd.DataFrame, *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per (ref, layer, split): mean, ci_low, ci_high, n (examples); plus layer "all"."""
    df = per_example.assign(split=per_example["split"].fillna("all"))
    overall = df.groupby(["ref", "split", "example"], sort=False)["value"].mean().reset_index()
    overall["layer"] = "all"
    rows = []
    for frame in (df, overall):
        for (ref, layer, split), g in frame.groupby(["ref", "layer", "split"], sort=False):
            mean, low, high = bootstrap_ci(g["value"], n_boot=n_boot, seed=seed)
            rows.append((ref, layer, split, mean, low, high, int(g["value"].notna().sum())))
    table = pd.DataFrame(rows, columns=["ref", "layer", "split", "mean", "ci_low", "ci_high", "n"])
    table["layer"] = table["layer"].astype(object)
    return table


def rank_refs(table: pd.DataFrame) -> pd.DataFrame:
    """Per split, refs sorted by mean divergence over layers (closest to NoPE first)."""
    overall = table[table["layer"] == "all"].sort_values(["split", "mean"], kind="stable")
    overall = overall.drop(columns="layer").copy()
    overall.insert(1, "rank", overall.groupby("split").cumcount() + 1)
    return overall[["split", "rank", "ref", "mean", "ci_low", "ci_high", "n"]].reset_index(
        drop=True
    )


@dataclass(repr=False)
class ComparisonResult(Result):
    """Output of `compare_attention`: data only. `table`: mean divergence with bootstrap CI per
    (ref, layer, split); `per_example`: one row per (ref, example, layer); `ranking`: refs
    closest to NoPE first, per split; `example`: one example's first tokens (at most
    EXAMPLE_MAX_TOKENS) and, per model, its attention pattern at `example_layer` ([head, query, key]); `profile`: that example's
    attention mass by distance per model."""

    per_example: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranking: pd.DataFrame = field(default_factory=pd.DataFrame)
    example_tokens: list = field(default_factory=list)
    example_patterns: dict = field(default_factory=dict)  # model name -> np.ndarray [H, T, T]
    example_layer: int = 0
    profile: pd.DataFrame = field(default_factory=pd.DataFrame)

    name: ClassVar[str] = "attention_similarity"
    title: ClassVar[str] = "NoPE attention similarity"
    extra_tables: ClassVar[tuple[str, ...]] = ("per_example", "ranking")

    @property
    def metric(self) -> str:
        return self.meta.get("metric", "jsd")

    @property
    def reducer(self) -> str:
        return self.meta.get("reducer", "min")

    def save(self, out_dir, name: str | None = None, *, title: str | None = None, html=True):
        """Write the tables (per_example, ranking, table), meta and report.html into out_dir."""
        if title is not None:
            self.meta["title"] = title
        return super().save(out_dir, name, html=html)


def distance_profile(models: Mapping, tokens: torch.Tensor) -> pd.DataFrame:
    """Tidy (model, layer, distance, mass): attention mass at distance n - m, mean over heads.

    Uses `nopeinterp.probing.distance.run_distance_dependence` (mass averaged over valid query
    rows, summing to 1 over distances); layer "all" averages the layers. `tokens`: [T].
    """
    from nopeinterp.probing.distance import run_distance_dependence

    sets, opts = make_sequences(tokens.reshape(1, -1)), DistanceOptions(progress=False)
    frames = []
    for name, model in models.items():
        mass = run_distance_dependence(as_model(model, name), as_splits(sets, model), opts).mass
        per_layer = mass.groupby(["layer", "distance"], as_index=False)["mass"].mean()
        overall = per_layer.groupby("distance", as_index=False)["mass"].mean()
        both = pd.concat([per_layer.astype({"layer": object}), overall.assign(layer="all")])
        frames.append(both.assign(model=name))
    return pd.concat(frames, ignore_index=True)[["model", "layer", "distance", "mass"]]


def _vocab(tokenizer):
    if tokenizer is None:
        return None
    get = getattr(tokenizer, "get_vocab", None)
    return get() if callable(get) else None


def _task_name(mi) -> str | None:
    spec = mi.task_spec
    return spec.get("name") if isinstance(spec, Mapping) else spec


def _check_same_setup(base, other, name: str) -> None:
    check_compatible(base.model, other.model, name)
    task_a, task_b = _task_name(base), _task_name(other)
    if task_a and task_b and task_a != task_b:
        raise ValueError(f"{name!r} was trained on task {task_b!r}, NoPE on {task_a!r}")
    vocab_a, vocab_b = _vocab(base.tokenizer), _vocab(other.tokenizer)
    if vocab_a is not None and vocab_b is not None and vocab_a != vocab_b:
        raise ValueError(
            f"{name!r} has a different tokenizer vocabulary than NoPE: the same token ids "
            "would mean different words"
        )


def compare_attention(
    nope,
    refs: Mapping,
    data=None,
    *,
    nope_prime=None,
    options: CompareOptions | None = None,
    **changes,
) -> ComparisonResult:
    """Rank reference models by how close their attention is to NoPE's.

    nope, refs values, nope_prime: hooked models, Checkpoints or checkpoint paths.
    data: anything `nopeinterp.data.make_sequences` takes. None -> the task recorded in NoPE's
    checkpoint, with its task options; a task (None or given) is sampled the paper's way,
    `n_per_length` held-out examples at every ID and OOD length.
    id_lengths / ood_lengths: the task's ranges to sample (or, for token data, the ID range).
    heads / paper_compat / include_first_row / layers / batch_size: see
    `attention_divergence`. n_boot, seed: the bootstrap over examples (seed also draws the
    task examples). A model with a learned position table is compared on the sequences it
    can read (counted in meta["dropped"]).
    Raises ValueError if a model's vocabulary, tokenizer or task differs from NoPE's.
    Options (`nopeinterp.options.CompareOptions`): `options=` or any of its fields.
    """
    if not refs:
        raise ValueError("refs is empty: give at least one reference model")
    opts = CompareOptions.make(options, **changes)
    device = opts.device
    base = as_model(nope, "nope", device=device)
    loaded = {name: as_model(obj, name, device=device) for name, obj in refs.items()}
    if NOPE_PRIME in loaded:
        raise ValueError(f"{NOPE_PRIME!r} is reserved for nope_prime=")
    if nope_prime is not None:
        loaded[NOPE_PRIME] = as_model(nope_prime, NOPE_PRIME, device=device)
    for name, mi in (("nope", base), (NOPE_PRIME, loaded.get(NOPE_PRIME, base))):
        # one of ours must have NoPE layers (a SmolLM3-style mix does); a plain
        # hooked model is taken as given
        pe = getattr(mi.model, "pe", None)
        if pe is not None and "nope" not in mi.layer_pe:
            raise ValueError(
                f"{name} must be a NoPE model, got a {pe!r} model: the ranking is the divergence "
                "from NoPE's attention"
            )
    for name, other in loaded.items():
        _check_same_setup(base, other, name)

    return run_compare_attention(base, loaded, sequences(data, base, opts), opts)


def run_compare_attention(
    base: ModelInput, loaded: Mapping[str, ModelInput], sets: Splits, opts: CompareOptions
) -> ComparisonResult:
    """The comparison on resolved inputs: NoPE (`base`), the other models by name, `sets`."""
    # Each group of models that read the same number of positions sees what it can read.
    groups: dict = {}
    for name, other in loaded.items():
        groups.setdefault(max_positions(other.model), {})[name] = other.model
    frames, dropped = {}, {}
    n_total = sum(len(v) for v in sets.values())
    for limit, models in groups.items():
        group_sets = {k: v.readable_by(limit) for k, v in sets.items()}
        group_sets = {k: v for k, v in group_sets.items() if len(v)}
        n_kept = sum(len(v) for v in group_sets.values())
        dropped.update({name: n_total - n_kept for name in models})
        if not group_sets:
            continue
        frames.update(
            divergence_frames(
                base.model,
                models,
                group_sets,
                heads=opts.heads,
                paper_compat=opts.paper_compat,
                include_first_row=opts.include_first_row,
                batch_size=opts.batch_size,
                layers=opts.layers,
                progress=opts.progress,
            )
        )
    if not frames:
        raise ValueError("no reference model could read any of these sequences")
    frames = {name: frames[name] for name in loaded if name in frames}
    per_example = pd.concat([f.assign(ref=name) for name, f in frames.items()], ignore_index=True)
    per_example = per_example[["ref", *[c for c in per_example.columns if c != "ref"]]]
    table = summarize(per_example, n_boot=opts.n_boot, seed=opts.seed)
    first = next(iter(frames.values()))
    models = {"nope": base.model, **{name: other.model for name, other in loaded.items()}}
    tokens = _first_sequence(sets)
    readable = {n: m for n, m in models.items() if _fits(m, len(tokens))}
    layer = opts.example_layer if opts.example_layer < base.model.cfg.n_layers else 0
    meta = {
        "title": opts.title or f"NoPE attention similarity: {_task_name(base) or 'data'}",
        "metric": str(first["metric"].iloc[0]),
        "reducer": str(first["reducer"].iloc[0]),
        "refs": list(frames),
        "not_compared": [n for n in loaded if n not in frames],
        "dropped": {n: d for n, d in dropped.items() if d},
        "n_boot": opts.n_boot,
        "seed": opts.seed,
        **sets.meta(),
    }
    return ComparisonResult(
        table,
        meta,
        per_example=per_example,
        ranking=rank_refs(table),
        example_tokens=tokens.tolist(),
        example_patterns={
            n: attention_patterns(m, tokens[None], None, [layer])[layer][0].float().cpu().numpy()
            for n, m in readable.items()
            if layer < m.cfg.n_layers
        },
        example_layer=layer,
        profile=distance_profile(readable, tokens),
    )


# The example heatmap shows at most this many first tokens: a causal model's attention over a
# prefix is the top-left block of its attention over the whole sequence, and a longer map is
# neither readable nor small (16 heads x 2048^2 floats is 256 MiB per model).
EXAMPLE_MAX_TOKENS = 256


def _first_sequence(sets) -> torch.Tensor:
    s = next(iter(sets.values()))
    return s.tokens[0, : min(int(s.attention_mask[0].sum()), EXAMPLE_MAX_TOKENS)]


def _fits(model, n_tokens: int) -> bool:
    limit = max_positions(model)
    return limit is None or n_tokens <= limit
