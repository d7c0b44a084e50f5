"""Which positional encoding does NoPE attend like? The paper's ranking, with bootstrap CIs.

compare_attention(nope, {"t5": ..., "alibi": ...}, data) runs `attention_divergence(nope, ref)`
for every reference (NoPE is run once per batch for all of them) and summarises:
per (ref, layer, split) the mean over examples with a 95% bootstrap CI over examples, plus
layer "all" (each example's mean over layers first, then the CI over examples), and a ranking
per split, closest first. A second NoPE run (`nope_prime`, another seed) gives the noise floor
the paper compares against; it is included as ref "nope_prime".
"""

from __future__ import annotations

import html
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from nopeinterp.similarity.divergence import (
    AttentionBatch,
    _as_batch,
    _is_batch_like,
    attention_data,
    check_compatible,
    divergence_frames,
)
from nopeinterp.viz.html import write_report

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


@dataclass
class ComparisonResult:
    """Output of `compare_attention`. `models` and `example_tokens` feed the report's plots."""

    per_example: pd.DataFrame
    table: pd.DataFrame
    ranking: pd.DataFrame
    metric: str = "jsd"
    reducer: str = "min"
    models: dict = field(default_factory=dict, repr=False)  # "nope" and every ref
    example_tokens: torch.Tensor | None = field(default=None, repr=False)

    def figure(self):
        """Plotly figure: divergence per layer per ref (left), ID vs OOD bars (right)."""
        from nopeinterp.viz.similarity import comparison_figure

        return comparison_figure(self.table, metric=self.metric)

    def save(self, directory, *, layer: int = 0, title: str | None = None) -> Path:
        """Write per_example.csv, table.csv, ranking.csv and report.html into `directory`.

        The report (self-contained, works offline) has the ranking, the per-layer and ID/OOD
        figures, NoPE-vs-ref attention heatmaps at `layer` for one example, and the
        attention-mass-by-distance profile. Returns the report path.
        """
        from nopeinterp.viz.html import atomic_write_text
        from nopeinterp.viz.similarity import (
            attention_heatmaps,
            distance_figure,
            layer_figure,
            split_bars,
        )

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("per_example", "table", "ranking"):
            atomic_write_text(directory / f"{name}.csv", getattr(self, name).to_csv(index=False))
        label = "JSD (nats)" if self.metric == "jsd" else "paper_jsd"
        intro = (
            f"<p>metric: <b>{html.escape(self.metric)}</b>, head reduction: "
            f"<b>{html.escape(self.reducer)}</b>. Mean over examples with 95% bootstrap CIs "
            "(over examples); 'all' averages each example's layers first. Lower = attends "
            "more like NoPE. <code>nope_prime</code> (a second NoPE seed) is the noise floor."
            "</p>"
        )
        sections = [
            ("Setup", intro),
            ("Ranking (closest to NoPE first)", self.ranking),
            ("Divergence per layer", layer_figure(self.table, metric=label)),
            ("ID vs OOD", split_bars(self.table, metric=label)),
        ]
        if self.models and self.example_tokens is not None and "nope" in self.models:
            nope = self.models["nope"]
            tokens = self.example_tokens
            for ref, model in self.models.items():
                if ref == "nope" or layer >= min(nope.cfg.n_layers, model.cfg.n_layers):
                    continue
                fig = attention_heatmaps(nope, model, tokens, layer, names=("nope", ref))
                sections.append((f"Attention: nope vs {ref} (layer {layer}, example 0)", fig))
            profile = distance_profile(self.models, tokens)
            sections.append(("Attention mass by distance (example 0)", distance_figure(profile)))
        report = directory / "report.html"
        write_report(report, title or "NoPE attention similarity", sections)
        return report


def distance_profile(models: Mapping, tokens: torch.Tensor) -> pd.DataFrame:
    """Tidy (model, layer, distance, mass): attention mass at distance n - m, mean over heads.

    Uses `nopeinterp.probing.distance.distance_dependence` (mass averaged over valid query
    rows, summing to 1 over distances); layer "all" averages the layers. `tokens`: [T].
    """
    from nopeinterp.probing.distance import distance_dependence

    frames = []
    for name, model in models.items():
        mass = distance_dependence(model, tokens.reshape(1, -1), progress=False).mass
        per_layer = mass.groupby(["layer", "distance"], as_index=False)["mass"].mean()
        overall = per_layer.groupby("distance", as_index=False)["mass"].mean()
        both = pd.concat([per_layer.astype({"layer": object}), overall.assign(layer="all")])
        frames.append(both.assign(model=name))
    return pd.concat(frames, ignore_index=True)[["model", "layer", "distance", "mass"]]


def _load(obj, name: str):
    """(model, tokenizer, meta) from a model, a Checkpoint or a checkpoint path."""
    if isinstance(obj, str | os.PathLike):
        from nopeinterp.checkpoint import load_checkpoint

        obj = load_checkpoint(obj)
    if hasattr(obj, "model") and hasattr(obj, "meta"):
        return obj.model, getattr(obj, "tokenizer", None), dict(obj.meta or {})
    if not hasattr(obj, "cfg") or not hasattr(obj, "run_with_cache"):
        raise TypeError(f"{name!r}: expected a HookedTransformer, a Checkpoint or a path")
    return obj, getattr(obj, "tokenizer", None), {}


def _vocab(tokenizer):
    if tokenizer is None:
        return None
    get = getattr(tokenizer, "get_vocab", None)
    return get() if callable(get) else None


def _task_name(meta: Mapping):
    task = meta.get("task")
    if isinstance(task, Mapping):
        task = task.get("name")
    return task


def _check_same_setup(base, other, name: str) -> None:
    (model_a, tok_a, meta_a), (model_b, tok_b, meta_b) = base, other
    check_compatible(model_a, model_b, name)
    task_a, task_b = _task_name(meta_a), _task_name(meta_b)
    if task_a and task_b and task_a != task_b:
        raise ValueError(f"{name!r} was trained on task {task_b!r}, NoPE on {task_a!r}")
    vocab_a, vocab_b = _vocab(tok_a), _vocab(tok_b)
    if vocab_a is not None and vocab_b is not None and vocab_a != vocab_b:
        raise ValueError(
            f"{name!r} has a different tokenizer vocabulary than NoPE: the same token ids "
            "would mean different words"
        )


def _reusable(data):
    """Data that can be iterated once per call: materialise one-shot iterators (token ids
    only -- small next to the attention patterns, which are never kept)."""
    if data is None or _is_batch_like(data) or isinstance(data, list | tuple):
        return data
    return list(data)


def _batches(data) -> list:
    return [data] if _is_batch_like(data) else list(data)


def _first_example(data) -> torch.Tensor | None:
    item = data if _is_batch_like(data) else next(iter(data), None)
    if item is None:
        return None
    batch: AttentionBatch = _as_batch(item)
    tokens = batch.tokens[0]
    if batch.attention_mask is not None:
        tokens = tokens[: int(batch.attention_mask[0].sum())]
    return tokens


def compare_attention(
    nope,
    refs: Mapping,
    data=None,
    *,
    nope_prime=None,
    heads: str = "min",
    paper_compat: bool = False,
    include_first_row: bool | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    batch_size: int = 32,
    layers=None,
    n_per_length: int = 10,
    id_lengths: tuple[int, int] | None = None,
    progress: bool = True,
) -> ComparisonResult:
    """Rank reference models by how close their attention is to NoPE's.

    nope, refs values, nope_prime: HookedTransformers, Checkpoints or checkpoint paths.
    data: as in `attention_divergence`; None -> `attention_data(task)` for the task recorded
    in NoPE's checkpoint (n_per_length per ID and OOD length).
    heads / paper_compat / include_first_row / layers / batch_size / id_lengths: see
    `attention_divergence`. n_boot, seed: the bootstrap over examples.
    Raises ValueError if a model's vocabulary, tokenizer or task differs from NoPE's.
    """
    if not refs:
        raise ValueError("refs is empty: give at least one reference model")
    base = _load(nope, "nope")
    loaded = {name: _load(obj, name) for name, obj in refs.items()}
    if NOPE_PRIME in loaded:
        raise ValueError(f"{NOPE_PRIME!r} is reserved for nope_prime=")
    if nope_prime is not None:
        loaded[NOPE_PRIME] = _load(nope_prime, NOPE_PRIME)
    for name, (model, _, _) in (("nope", base), (NOPE_PRIME, loaded.get(NOPE_PRIME, base))):
        pe = getattr(model, "pe", "nope")  # a plain HookedTransformer is taken as given
        if pe != "nope":
            raise ValueError(
                f"{name} must be a NoPE model, got a {pe!r} model: the ranking is the divergence "
                "from NoPE's attention"
            )
    for name, other in loaded.items():
        _check_same_setup(base, other, name)

    if data is None:
        task = _task_name(base[2])
        if not task:
            raise ValueError("data=None needs a NoPE checkpoint that records its task")
        data = attention_data(task, base[1], n_per_length=n_per_length, seed=seed)
    data = _reusable(data)

    # A learned-APE model cannot read past its table: it is compared only on the sequences it
    # can read (OOD lengths usually drop out); the other refs see all of them.
    from nopeinterp.evaluation import max_positions

    groups: dict = {}
    for name, other in loaded.items():
        groups.setdefault(max_positions(other[0]), {})[name] = other[0]
    frames = {}
    for limit, models in groups.items():
        group_data = data
        if limit is not None:
            group_data = [b for b in _batches(data) if _as_batch(b).tokens.shape[1] <= limit]
            if not group_data:
                warnings.warn(
                    f"{', '.join(models)}: no sequence fits in {limit} positions; skipped",
                    stacklevel=2,
                )
                continue
        frames.update(
            divergence_frames(
                base[0],
                models,
                group_data,
                heads=heads,
                paper_compat=paper_compat,
                include_first_row=include_first_row,
                batch_size=batch_size,
                layers=layers,
                id_lengths=id_lengths,
                progress=progress,
            )
        )
    if not frames:
        raise ValueError("no reference model could be compared on this data")
    frames = {name: frames[name] for name in loaded if name in frames}
    per_example = pd.concat([f.assign(ref=name) for name, f in frames.items()], ignore_index=True)
    per_example = per_example[["ref", *[c for c in per_example.columns if c != "ref"]]]
    table = summarize(per_example, n_boot=n_boot, seed=seed)
    first = next(iter(frames.values()))
    return ComparisonResult(
        per_example=per_example,
        table=table,
        ranking=rank_refs(table),
        metric=str(first["metric"].iloc[0]),
        reducer=str(first["reducer"].iloc[0]),
        models={"nope": base[0], **{name: other[0] for name, other in loaded.items()}},
        example_tokens=_first_example(data),
    )
