"""Attention sinks, dilution (entropy against length) and a positional taxonomy of heads.

Rows. Everything here is computed per attention *row*: one real query token at position t
of one sequence, attending over its ``n = t + 1`` visible keys 0..t (right padding, so all
of them are real). "Length" is that ``n``, the number of keys of the row (per query
position), NOT the length of the sequence the row belongs to: rows of every sequence that
reach position t are pooled at n = t + 1. Attention is read batch by batch and by blocks of
query rows (`nopeinterp.probing._stream.AttentionRows`: on our models from cached q and k,
elsewhere from ``hook_pattern`` and, for the taxonomy's distance score, ``hook_attn_scores``).
Layers are block indices 0..n_layers-1 (the attention of block l), as in `distance.py`.

`attention_sinks` -> `SinkResult`, per (split, layer, head, n):
  - ``first_mass``: mean attention probability on key 0 (the first token, <bos> in our tasks);
    uniform attention gives 1/n;
  - ``entropy``: mean attention entropy of the rows (nats), against ``uniform_entropy`` =
    log(n), the entropy of uniform attention over n keys (the maximum); ``entropy_ratio`` =
    entropy / log(n). Dilution is entropy growing like log(n); a head that keeps a sharp
    pattern at every length stays flat.

`classify_heads` -> `HeadTaxonomy`, per (split, layer, head), pooled over the rows with
n >= MIN_KEYS keys (shorter rows cannot tell "local" from "everything"). The pattern scores
are *lifts over uniform attention*, per row ``(x - u) / (1 - u)`` with ``x`` the head's mass
on the keys in question and ``u`` the mass uniform attention puts there, averaged over rows:
0 = as uniform attention, 1 = all mass there, negative = less than uniform.
  - ``sink``: mass on key 0 (u = 1/n);
  - ``previous_token``: mass on key t - 1 (u = 1/n);
  - ``local``: mass on the LOCAL_WINDOW + 1 nearest keys t - LOCAL_WINDOW..t (u = that / n);
  - ``uniform``: 1 - TV(p, uniform) / (1 - 1/n), TV the total variation distance:
    1 = exactly uniform over the row (the Theorem 1 counting head), 0 = all mass on one key;
  - ``distance``: the distance-dependence R^2 of the head's logits (`distance.DistanceStats`,
    the same estimator as `distance_dependence`, on the same rows): 1 = logits are a row
    offset plus a function of n - m. 0 when the logits are constant (nothing to explain);
  - ``content``: 1 - distance, the share of the (row-centred) logit variance that relative
    distance does not explain (0 when the logits are constant).
Label: the first kind in LABEL_ORDER whose score reaches its threshold in THRESHOLDS,
    sink >= 0.5, previous_token >= 0.5, local >= 0.5, uniform >= 0.9, distance >= 0.8,
and ``content`` when none does (attention that is neither a fixed positional pattern nor a
function of distance, so it must depend on what the tokens are). The order puts the
specific patterns first: a previous-token head is also local and distance-based.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from nopeinterp.data import Splits
from nopeinterp.inputs import ModelInput, analysis_front, describe
from nopeinterp.options import HeadOptions, layer_list
from nopeinterp.probing._stream import attention_groups
from nopeinterp.probing.distance import DistanceDesign, DistanceStats
from nopeinterp.results import Result

_DTYPE = torch.float64
LOCAL_WINDOW = 3  # "local": the query itself and the 3 keys before it
MIN_KEYS = LOCAL_WINDOW + 2  # taxonomy rows: more keys than the local window holds
SINK_THRESHOLD = 0.5
PREVIOUS_TOKEN_THRESHOLD = 0.5
LOCAL_THRESHOLD = 0.5
UNIFORM_THRESHOLD = 0.9
DISTANCE_THRESHOLD = 0.8
THRESHOLDS = {
    "sink": SINK_THRESHOLD,
    "previous_token": PREVIOUS_TOKEN_THRESHOLD,
    "local": LOCAL_THRESHOLD,
    "uniform": UNIFORM_THRESHOLD,
    "distance": DISTANCE_THRESHOLD,
}
LABEL_ORDER = ("sink", "previous_token", "local", "uniform", "distance")
KINDS = (*LABEL_ORDER, "content")
SINK_COLUMNS = [
    "split",
    "layer",
    "head",
    "n_keys",
    "first_mass",
    "entropy",
    "uniform_entropy",
    "entropy_ratio",
    "n_rows",
]
DILUTION_COLUMNS = ["split", "layer", "head", "entropy_slope", "first_mass", "n_rows"]
TAXONOMY_COLUMNS = ["split", "layer", "head", *KINDS, "label", "n_rows"]


class PatternStats:
    """Per-row-length sums of attention statistics for the heads of one layer (streaming).

    Index n - 1 of every [H, N] sum holds the rows with n keys (query position n - 1).
    """

    _FIELDS = ("first", "prev", "local", "tv", "entropy")

    def __init__(self, n_heads: int):
        self.H = n_heads
        self.count = torch.zeros(0, dtype=_DTYPE)
        self.sums = {f: torch.zeros(n_heads, 0, dtype=_DTYPE) for f in self._FIELDS}

    def _grow(self, N: int):
        pad = N - self.count.shape[0]
        if pad > 0:
            self.count = torch.nn.functional.pad(self.count, (0, pad))
            self.sums = {f: torch.nn.functional.pad(v, (0, pad)) for f, v in self.sums.items()}

    def update(self, pattern: torch.Tensor, real: torch.Tensor) -> PatternStats:
        """pattern [B, H, N, N] (query, key); real [B, N] bool (right-padded real tokens)."""
        return self.update_rows(pattern, real, 0)

    def update_rows(self, pattern: torch.Tensor, real: torch.Tensor, row0: int) -> PatternStats:
        """update() for query rows row0..row0+R-1: pattern [B, H, R, N] over keys 0..N-1
        (N >= row0 + R); real [B, >= row0 + R] bool."""
        B, H, R, N = pattern.shape
        if H != self.H:
            raise ValueError(f"expected {self.H} heads, got {H}")
        p = pattern.to(_DTYPE)
        q = torch.arange(row0, row0 + R)  # query positions
        k = torch.arange(N)
        n = (q + 1).to(_DTYPE)  # keys per row
        causal = k[None, :] <= q[:, None]  # [query, key]
        p = p * causal
        real = real[:, row0 : row0 + R].to(_DTYPE)
        w = real[:, None, :]  # [B, 1, R] row weights
        dist = q[:, None] - k[None, :]
        previous = p.gather(-1, (q - 1).clamp(min=0).expand(B, H, R)[..., None])[..., 0]
        stats = {
            "first": p[..., 0],
            "prev": previous * (q >= 1),
            "local": (p * (causal & (dist <= LOCAL_WINDOW))).sum(-1),
            "tv": 0.5 * ((p - 1 / n[:, None]).abs() * causal).sum(-1),
            "entropy": -torch.special.xlogy(p, p).sum(-1),
        }
        self._grow(row0 + R)
        self.count[row0 : row0 + R] += real.sum(0)
        for f, v in stats.items():
            self.sums[f][:, row0 : row0 + R] += (v * w).sum(0)
        return self

    def means(self) -> dict[str, torch.Tensor]:
        """Per-length means [H, N] of every statistic (NaN where no row has that length)."""
        c = self.count.where(self.count > 0, torch.full_like(self.count, float("nan")))
        return {f: v / c for f, v in self.sums.items()}

    def lifts(self, min_keys: int = MIN_KEYS) -> dict[str, torch.Tensor]:
        """Row-weighted mean lifts over uniform attention [H] over rows with >= min_keys keys
        (see the module docstring), and their row count under "n_rows"."""
        N = self.count.shape[0]
        n = torch.arange(1, N + 1, dtype=_DTYPE)
        keep = (n >= min_keys) & (self.count > 0)
        rows = self.count[keep]
        total = rows.sum()
        if total == 0:
            nan = torch.full((self.H,), float("nan"), dtype=_DTYPE)
            return {k: nan for k in ("sink", "previous_token", "local", "uniform")} | {"n_rows": 0}
        n = n[keep]
        s = {f: v[:, keep] for f, v in self.sums.items()}  # sums over rows of each length
        u1 = 1 / n
        ul = (LOCAL_WINDOW + 1) / n

        def lift(total_mass, u):  # sum over rows of (x - u) / (1 - u), / number of rows
            return ((total_mass - rows * u) / (1 - u)).sum(-1) / total

        return {
            "sink": lift(s["first"], u1),
            "previous_token": lift(s["prev"], u1),
            "local": lift(s["local"], ul),
            "uniform": 1 - (s["tv"] / (1 - u1)).sum(-1) / total,
            "n_rows": int(total),
        }


def _attention_stats(
    mi: ModelInput,
    sets: Splits,
    opts: HeadOptions,
    *,
    with_scores: bool,
    desc: str,
    min_keys: int = MIN_KEYS,
):
    """{split: {layer: (PatternStats, DistanceStats | None)}} and the layers, on resolved
    inputs."""
    model = mi.model
    if isinstance(model, torch.nn.Module):
        model.eval()
    H = model.cfg.n_heads
    layers = layer_list(opts.layers, 0, model.cfg.n_layers - 1)
    if not sets:
        raise ValueError("no sequences this model can read")
    out = {}
    for split, s in sets.items():
        design = DistanceDesign()  # which cells the distance fit uses: one for all layers
        stats = {
            layer: (PatternStats(H), DistanceStats(H, design) if with_scores else None)
            for layer in layers
        }
        for real, blocks, attention, group in attention_groups(
            model, s, layers, opts, scores=with_scores, desc=f"{desc} {mi.name}: {split}"
        ):

            def valid(r0, r1, real=real):
                q = torch.arange(r0, r1)
                return (
                    real[:, r0:r1, None] & real[:, None, :r1] & (q >= min_keys - 1)[None, :, None]
                )

            if with_scores and group[0] == layers[0]:  # a new batch (its first group)
                design.update_batch(valid, blocks, real.shape[1])
            for layer in group:
                pst, dst = stats[layer]
                if with_scores:
                    dst.reserve(real.shape[1])
                for r0, r1 in blocks:
                    scores, pattern = attention.rows(layer, r0, r1)
                    pst.update_rows(pattern.cpu(), real, r0)
                    if with_scores:
                        dst.update_rows(scores.cpu(), valid(r0, r1), r0)
                del scores, pattern  # views of the layer's tensors
                attention.release(layer)
            del attention
        out[split] = stats
    return out, layers


def _each_layer(stats):
    """(split, layer, PatternStats, DistanceStats | None) of `_attention_stats`'s result."""
    for split, per_layer in stats.items():
        for layer, (pst, dst) in per_layer.items():
            yield split, layer, pst, dst


def _meta(sets, layers, title) -> dict:
    return {"title": title, "layers": layers, **sets.meta()}


# ------------------------------------------------------------------------------ sinks
@dataclass(repr=False)
class SinkResult(Result):
    """Per (split, layer, head, n_keys): first-token mass and attention entropy vs log(n).

    `dilution`: per (split, layer, head), the least-squares slope of the mean entropy against
    log(n) over the row lengths n >= 2 (weighted by rows): 1 = entropy grows like uniform
    attention's, 0 = the head stays as sharp at every length; and the mean first-token mass.
    """

    dilution: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DILUTION_COLUMNS))

    name = "attention_sinks"
    title = "Attention sinks and entropy by row length"
    extra_tables = ("dilution",)

    def pivot(self) -> pd.DataFrame:
        """Per (split, layer, head): mean first-token mass and the entropy slope on log(n)."""
        return self.dilution.set_index(["split", "layer", "head"])[["first_mass", "entropy_slope"]]


def run_attention_sinks(mi: ModelInput, sets: Splits, opts: HeadOptions) -> SinkResult:
    """`attention_sinks` on resolved inputs (`sets` of `mi`)."""
    stats, layers = _attention_stats(mi, sets, opts, with_scores=False, desc="sinks")
    rows = []
    for split, layer, pst, _ in _each_layer(stats):
        m = pst.means()
        for i in (pst.count > 0).nonzero().flatten().tolist():
            n = i + 1
            for h in range(pst.H):
                ent = float(m["entropy"][h, i])
                rows.append(
                    {
                        "split": split,
                        "layer": layer,
                        "head": h,
                        "n_keys": n,
                        "first_mass": float(m["first"][h, i]),
                        "entropy": ent,
                        "uniform_entropy": math.log(n),
                        "entropy_ratio": ent / math.log(n) if n > 1 else float("nan"),
                        "n_rows": int(pst.count[i]),
                    }
                )
    meta = _meta(sets, layers, opts.title or describe(mi, "Attention sinks"))
    meta["length"] = "n_keys: keys visible to the query (query position + 1), rows pooled"
    table = pd.DataFrame(rows, columns=SINK_COLUMNS)
    return SinkResult(table, meta, dilution=_dilution(table))


attention_sinks = analysis_front(
    run_attention_sinks,
    HeadOptions,
    name="attention_sinks",
    doc="""First-token mass and attention entropy per (split, layer, head, row length n).

`model`: a hooked model (ours, `from_hf`, a TL model), a Checkpoint or a path. `data`: anything
`nopeinterp.data.make_sequences` takes (None: the checkpoint's task, `n_eval` held-out ID
and OOD sequences), as for `distance_dependence`. See the module docstring for what
"length" is (keys per row).
""",
)


def _dilution(table: pd.DataFrame) -> pd.DataFrame:
    """Weighted least-squares slope of entropy on log(n) (n >= 2) per (split, layer, head)."""
    rows = []
    for (split, layer, head), d in table.groupby(["split", "layer", "head"], sort=False):
        w = d.n_rows.to_numpy(float)
        x, y = d.uniform_entropy.to_numpy(float), d.entropy.to_numpy(float)
        first = float((d.first_mass * w).sum() / w.sum())
        keep = d.n_keys.to_numpy() >= 2
        w, x, y = w[keep], x[keep], y[keep]
        slope = float("nan")
        if len(x) >= 2:
            xm, ym = (w * x).sum() / w.sum(), (w * y).sum() / w.sum()
            sxx = (w * (x - xm) ** 2).sum()
            slope = float((w * (x - xm) * (y - ym)).sum() / sxx) if sxx > 0 else float("nan")
        rows.append(
            {
                "split": split,
                "layer": layer,
                "head": head,
                "entropy_slope": slope,
                "first_mass": first,
                "n_rows": int(d.n_rows.sum()),
            }
        )
    return pd.DataFrame(rows, columns=DILUTION_COLUMNS)


# --------------------------------------------------------------------------- taxonomy
def label_head(scores: dict[str, float]) -> str:
    """The first kind of LABEL_ORDER whose score reaches THRESHOLDS[kind]; else "content"."""
    for kind in LABEL_ORDER:
        v = scores.get(kind)
        if v is not None and not math.isnan(v) and v >= THRESHOLDS[kind]:
            return kind
    return "content"


@dataclass(repr=False)
class HeadTaxonomy(Result):
    """Per (split, layer, head): the score of every kind and the label (module docstring)."""

    name = "heads"
    title = "Head taxonomy"

    def pivot(self) -> pd.DataFrame:
        """(split, layer) x head grid of labels."""
        t = self.table.assign(head=[f"H{h}" for h in self.table["head"]])
        p = t.pivot(index=["split", "layer"], columns="head", values="label")
        return p.loc[[s for s in dict.fromkeys(self.table.split)]]

    def labels(self, split: str | None = None) -> pd.DataFrame:
        """layer x head table of labels for one split (the first by default)."""
        t = self.table
        split = split or t.split.iloc[0]
        return t[t.split == split].pivot(index="layer", columns="head", values="label")


def label_counts(table: pd.DataFrame, keys=()) -> pd.DataFrame:
    """Heads per label (a column per kind of `KINDS`) per (*keys, split) of a
    `HeadTaxonomy.table` (or several, told apart by `keys`)."""
    counts = table.groupby([*keys, "split", "label"], sort=False).size().unstack(fill_value=0)
    return counts.reindex(columns=list(KINDS), fill_value=0).reset_index()


def run_classify_heads(mi: ModelInput, sets: Splits, opts: HeadOptions) -> HeadTaxonomy:
    """`classify_heads` on resolved inputs (`sets` of `mi`)."""
    stats, layers = _attention_stats(mi, sets, opts, with_scores=True, desc="heads")
    rows = []
    for split, layer, pst, dst in _each_layer(stats):
        lifts = pst.lifts()
        r2, _ = dst.solve()
        for h in range(pst.H):
            constant = not float(dst.ss_tot[h]) > 0  # no logit variation to explain
            dist = 0.0 if constant else float(r2[h])
            scores = {k: float(lifts[k][h]) for k in ("sink", "previous_token", "local")}
            scores["uniform"] = float(lifts["uniform"][h])
            scores["distance"] = dist
            scores["content"] = 0.0 if constant else 1.0 - dist
            rows.append(
                {
                    "split": split,
                    "layer": layer,
                    "head": h,
                    **scores,
                    "label": label_head(scores),
                    "n_rows": lifts["n_rows"],
                }
            )
    meta = _meta(sets, layers, opts.title or describe(mi, "Head taxonomy"))
    meta.update(
        thresholds=THRESHOLDS,
        label_order=list(LABEL_ORDER),
        local_window=LOCAL_WINDOW,
        min_keys=MIN_KEYS,
    )
    return HeadTaxonomy(pd.DataFrame(rows, columns=TAXONOMY_COLUMNS), meta)


classify_heads = analysis_front(
    run_classify_heads,
    HeadOptions,
    name="classify_heads",
    doc="""Score and label every head (sink, previous_token, local, uniform, distance, content).

`model` and `data` as for `attention_sinks`. Scores, thresholds and the labelling rule: module
docstring (named constants THRESHOLDS, LABEL_ORDER, LOCAL_WINDOW, MIN_KEYS).
""",
)


__all__ = [
    "DISTANCE_THRESHOLD",
    "KINDS",
    "LABEL_ORDER",
    "LOCAL_THRESHOLD",
    "LOCAL_WINDOW",
    "MIN_KEYS",
    "PREVIOUS_TOKEN_THRESHOLD",
    "SINK_THRESHOLD",
    "THRESHOLDS",
    "UNIFORM_THRESHOLD",
    "HeadTaxonomy",
    "PatternStats",
    "SinkResult",
    "attention_sinks",
    "classify_heads",
    "label_counts",
    "label_head",
    "run_attention_sinks",
    "run_classify_heads",
]
