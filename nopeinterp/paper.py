"""Our OOD accuracy beside the paper's: per-split summaries, PE ranks, Kendall's tau and MRR.

Input everywhere is a *run table*: one row per trained model with columns ``split``, ``pe``,
``seed``, ``ood_accuracy`` (exact match on the whole OOD test set of the best-by-validation
checkpoint). ``paper_runs()`` gives the paper's own table in that form (split names of
``nopeinterp.tasks.PAPER_SPLITS``, PE names of ``nopeinterp.models``), and the same functions
are run on ours and on the paper's, so the two sides of every comparison come from one code.

Mean reciprocal rank (the paper's aggregate, reproduced from its public analysis notebook):
within each (split, seed) cell the PEs are ranked by OOD accuracy, rank 1 = best; ties take
the order of ``tie_order`` (the paper's pandas ``rank(method="first")`` broke them by row
order, which in its results is Rotary, ALiBi, T5, sinusoidal APE, NoPE: ``PAPER_TIE_ORDER``);
a PE's MRR is the mean of 1/rank over the cells. Only cells that have every PE compared are
used (the paper dropped incomplete columns). The bootstrap resamples (split, seed) cells.

The paper's per-run table ships as ``paper_results/official_ood_accuracy.csv``: the rows of the
paper's public results files (``results/classic.jsonl``, ``results/sanity_check.jsonl`` of
McGill-NLP/length-generalization, job type ``best_run_seed_exp``) with each run's training seed
(``cfg__global_vars.seed``: 146317, 234054 or 256788). The seed matters: ranking within a cell
needs the runs of one seed, and the run order in those files differs between PEs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from nopeinterp.errors import NopeinterpError
from nopeinterp.results import Result

PAPER_RESULTS = Path(__file__).with_name("paper_results") / "official_ood_accuracy.csv"
# The paper's PE names -> ours (its APE is the fixed sinusoidal one)
PAPER_PES = {
    "none": "nope",
    "t5_relative_bias": "t5",
    "alibi": "alibi",
    "rotary": "rotary",
    "abs_sinusoid": "sinusoidal",
}
FIVE_PES = ("nope", "t5", "alibi", "rotary", "sinusoidal")
PAPER_TIE_ORDER = ("rotary", "alibi", "t5", "sinusoidal", "nope")
RUN_COLUMNS = ("split", "pe", "seed", "ood_accuracy")
# The paper's MRR left out these two splits (its notebook's ds_configs_to_exclude)
PAPER_MRR_EXCLUDED = ("len", "pcfg/productivity")


PAPER_SCRATCHPAD = PAPER_RESULTS.with_name("official_scratchpad_addition.csv")
_PAPER_COMPONENTS = "icovr"  # the letters of its i{0,1}_c{0,1}_o{0,1}_v{0,1}_r{0,1} names


def paper_scratchpad_runs(path: str | Path | None = None) -> pd.DataFrame:
    """The paper's scratchpad runs on addition (ID <= 8 digits, OOD 9-16), one row per PE and
    seed: task, scratchpad (our format letters, e.g. 'icovr'), pe (our name), seed,
    ood_accuracy, val_accuracy. Runs with no recorded result (one Rotary seed) are left out."""
    raw = pd.read_csv(PAPER_SCRATCHPAD if path is None else path)
    unknown = sorted(set(raw["pe"]) - set(PAPER_PES))
    if unknown:
        raise ComparisonError(f"{path}: unknown positional encodings {unknown}")
    raw = raw.dropna(subset=["test_acc_overall"])

    def letters(name: str) -> str:  # 'i1_c1_o1_v0_r1' -> 'icor'
        flags = [part[-1] == "1" for part in name.split("_")]
        return "".join(c for c, on in zip(_PAPER_COMPONENTS, flags, strict=True) if on) or "none"

    return pd.DataFrame(
        {
            "task": raw["dataset"].str.replace("s2s_", "", regex=False),
            "scratchpad": raw["scratchpad"].map(letters),
            "pe": raw["pe"].map(PAPER_PES),
            "seed": raw["seed"].astype(int),
            "ood_accuracy": raw["test_acc_overall"].astype(float),
            "val_accuracy": raw["valid_acc_overall"].astype(float),
        }
    ).reset_index(drop=True)


class ComparisonError(NopeinterpError, ValueError):
    """A run table that cannot be compared (missing columns, duplicate runs, bad values)."""


PAPER_AGGREGATES = PAPER_RESULTS.with_name("official_len_gen_aggregates.csv")
# the aggregates file's PE names -> ours (it has only these three)
_AGGREGATE_PES = {"none": "nope", "t5": "t5", "abs_sin": "sinusoidal"}
# its model names: the paper's base-size decoder and the authors' extra-small one
PAPER_MODELS = {"t5_dec_base": "base", "t5a_dec_xsmall": "xsmall"}


def paper_aggregates(path: str | Path | None = None) -> pd.DataFrame:
    """The paper's mean and standard deviation over seed runs of OOD accuracy from its
    ``len_gen_experiments.csv`` (parity and LEGO with and without a scratchpad; copy splits at
    two model sizes). Columns: model (``base`` or ``xsmall``: ``PAPER_MODELS``), split (our
    ``PAPER_SPLITS`` name where the split is one of ours, else ``<dataset>/<split>``), pe (our
    name), scratchpad (bool), n_seeds, ood_mean, ood_std."""
    from nopeinterp.tasks import PAPER_SPLITS

    raw = pd.read_csv(PAPER_AGGREGATES if path is None else path)
    for column, known in (("pe", _AGGREGATE_PES), ("model", PAPER_MODELS)):
        unknown = sorted(set(raw[column]) - set(known))
        if unknown:
            raise ComparisonError(f"{path or PAPER_AGGREGATES}: unknown {column} {unknown}")
    ours = {(s.paper_dataset, s.paper_split): s.name for s in PAPER_SPLITS.values()}
    pairs = zip(raw["dataset"], raw["split"], strict=True)
    return pd.DataFrame(
        {
            "model": raw["model"].map(PAPER_MODELS),
            "split": [ours.get((d, s), f"{d}/{s}") for d, s in pairs],
            "pe": raw["pe"].map(_AGGREGATE_PES),
            "scratchpad": raw["scratchpad"].astype(bool),
            "n_seeds": raw["n_seeds"].astype(int),
            "ood_mean": raw["test_acc_mean"].astype(float),
            "ood_std": raw["test_acc_std"].astype(float),
        }
    )


def paper_runs(path: str | Path | None = None) -> pd.DataFrame:
    """The paper's per-run OOD accuracy as a run table.

    Columns: split (``PAPER_SPLITS`` name; PCFG as ``pcfg/<split>``), pe (our name), seed,
    ood_accuracy, val_accuracy, paper_dataset, paper_split, paper_pe.
    """
    from nopeinterp.tasks import PAPER_SPLITS

    raw = pd.read_csv(PAPER_RESULTS if path is None else path)
    ours = {(s.paper_dataset, s.paper_split): s.name for s in PAPER_SPLITS.values()}
    split = [
        ours.get((d, s), f"{d}/{s}") for d, s in zip(raw["dataset"], raw["split"], strict=True)
    ]
    unknown = sorted(set(raw["pe"]) - set(PAPER_PES))
    if unknown:
        raise ComparisonError(f"{path}: unknown positional encodings {unknown}")
    return check_runs(
        pd.DataFrame(
            {
                "split": split,
                "pe": raw["pe"].map(PAPER_PES),
                "seed": raw["seed"].astype(int),
                "ood_accuracy": raw["test_acc_overall"].astype(float),
                "val_accuracy": raw["valid_acc"].astype(float),
                "paper_dataset": raw["dataset"],
                "paper_split": raw["split"],
                "paper_pe": raw["pe"],
            }
        )
    )


def check_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` if it is a valid run table, else a ComparisonError saying what is wrong."""
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise ComparisonError(f"run table lacks columns {missing} (needs {list(RUN_COLUMNS)})")
    acc = pd.to_numeric(runs["ood_accuracy"], errors="coerce")
    if acc.isna().any() or not acc.between(0, 1).all():
        raise ComparisonError("ood_accuracy must be a number in [0, 1] in every row")
    dup = runs.duplicated(["split", "pe", "seed"])
    if dup.any():
        first = runs.loc[dup, ["split", "pe", "seed"]].iloc[0].tolist()
        raise ComparisonError(f"two runs for the same (split, pe, seed): {first}")
    return runs


def _select(runs, splits, pes) -> pd.DataFrame:
    runs = check_runs(runs)
    if splits is not None:
        runs = runs[runs["split"].isin(list(splits))]
    if pes is not None:
        runs = runs[runs["pe"].isin(list(pes))]
    return runs


def ood_summary(runs: pd.DataFrame, *, splits=None, pes=None) -> pd.DataFrame:
    """Per (split, pe): mean, min and max of OOD accuracy over seeds, and n_seeds."""
    g = _select(runs, splits, pes).groupby(["split", "pe"], sort=False)["ood_accuracy"]
    out = g.agg(mean="mean", min="min", max="max", n_seeds="count").reset_index()
    return out


def pe_ranks(runs: pd.DataFrame, *, splits=None, pes=None) -> pd.DataFrame:
    """Per split, the rank of each PE by mean OOD accuracy over seeds (1 = best; equal means
    share their average rank)."""
    s = ood_summary(runs, splits=splits, pes=pes)
    s["rank"] = s.groupby("split", sort=False)["mean"].rank(ascending=False, method="average")
    return s[["split", "pe", "mean", "rank"]]


def kendall_tau(a: pd.Series, b: pd.Series) -> tuple[float, float]:
    """Kendall's tau-b (and its p-value) between two scorings of the same items (aligned on the
    index; items in only one are dropped). NaN when fewer than 2 items are shared."""
    from scipy.stats import kendalltau

    both = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner")
    if len(both) < 2:
        return float("nan"), float("nan")
    res = kendalltau(both["a"], both["b"])
    return float(res.statistic), float(res.pvalue)


def _order(means: pd.Series) -> str:
    """'t5 > nope = alibi > ...': PEs best first, equal means joined by '='."""
    means = means.sort_values(ascending=False, kind="stable")
    groups = [" = ".join(g.index) for _, g in means.groupby(means, sort=False)]
    return " > ".join(groups)


def rank_agreement(ours: pd.DataFrame, paper: pd.DataFrame, *, splits=None, pes=FIVE_PES):
    """Per split shared by both run tables: Kendall's tau between our ranking of the PEs (by
    mean OOD accuracy) and the paper's, with both orders written best first."""
    a, b = ood_summary(ours, splits=splits, pes=pes), ood_summary(paper, splits=splits, pes=pes)
    rows = []
    for split in [s for s in a["split"].unique() if s in set(b["split"])]:
        x = a[a["split"] == split].set_index("pe")["mean"]
        y = b[b["split"] == split].set_index("pe")["mean"]
        tau, p = kendall_tau(x, y)
        rows.append(
            {
                "split": split,
                "kendall_tau": tau,
                "p_value": p,
                "n_pes": len(x.index.intersection(y.index)),
                "ours_order": _order(x),
                "paper_order": _order(y),
            }
        )
    return pd.DataFrame(
        rows, columns=["split", "kendall_tau", "p_value", "n_pes", "ours_order", "paper_order"]
    )


def reciprocal_ranks(
    runs: pd.DataFrame, *, splits=None, pes=FIVE_PES, tie_order=PAPER_TIE_ORDER
) -> pd.DataFrame:
    """Per (split, seed, pe): the PE's rank among ``pes`` in that cell and 1/rank.

    Cells lacking any of ``pes`` are dropped. Ties are broken by position in ``tie_order``
    (earlier = better rank); ``tie_order`` must list every PE compared. ``tie_order=None``:
    tied PEs share their average rank. Columns other than the run table's are kept.
    """
    runs = _select(runs, splits, pes)
    pes = tuple(pes) if pes is not None else tuple(runs["pe"].unique())
    if tie_order is not None:
        absent = [p for p in pes if p not in tie_order]
        if absent:
            raise ComparisonError(f"tie_order {tuple(tie_order)} does not list {absent}")
        order = {p: i for i, p in enumerate(tie_order)}
    extra = [c for c in runs.columns if c not in (*RUN_COLUMNS, "rank", "reciprocal_rank")]
    cols = ["split", "seed", "pe", *extra, "ood_accuracy", "rank", "reciprocal_rank"]
    cells = []
    for _, g in runs.groupby(["split", "seed"], sort=False):
        if set(g["pe"]) != set(pes):
            continue
        if tie_order is None:
            g = g.assign(rank=g["ood_accuracy"].rank(ascending=False, method="average"))
        else:
            g = g.assign(_tie=g["pe"].map(order)).sort_values(
                ["ood_accuracy", "_tie"], ascending=[False, True], kind="stable"
            )
            g = g.assign(rank=np.arange(1, len(g) + 1))
        cells.append(g.assign(reciprocal_rank=1.0 / g["rank"])[cols])
    if not cells:
        return pd.DataFrame(columns=cols)
    return pd.concat(cells, ignore_index=True)


def mean_reciprocal_rank(
    runs: pd.DataFrame,
    *,
    splits=None,
    pes=FIVE_PES,
    tie_order=PAPER_TIE_ORDER,
    n_boot: int = 2000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Per PE: MRR over the complete (split, seed) cells, with a percentile bootstrap interval
    over those cells (``n_boot`` resamples, ``seed`` fixes them; ``n_boot=0``: no interval).

    Columns: pe, mrr, ci_low, ci_high, n_cells, n_splits; rows in ``pes`` order.
    """
    rr = reciprocal_ranks(runs, splits=splits, pes=pes, tie_order=tie_order)
    if rr.empty:
        raise ComparisonError("no (split, seed) cell has every PE compared: no MRR")
    wide = rr.pivot_table(index=["split", "seed"], columns="pe", values="reciprocal_rank")
    pes = [p for p in (pes or wide.columns) if p in wide.columns]
    wide = wide[pes]
    point = wide.mean()
    lo = hi = pd.Series(np.nan, index=pes)
    if n_boot:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, len(wide), size=(n_boot, len(wide)))
        boots = wide.to_numpy()[idx].mean(axis=1)  # [n_boot, n_pes]
        alpha = (1 - ci) / 2
        lo = pd.Series(np.quantile(boots, alpha, axis=0), index=pes)
        hi = pd.Series(np.quantile(boots, 1 - alpha, axis=0), index=pes)
    return pd.DataFrame(
        {
            "pe": pes,
            "mrr": point.to_numpy(),
            "ci_low": lo.to_numpy(),
            "ci_high": hi.to_numpy(),
            "n_cells": len(wide),
            "n_splits": wide.index.get_level_values("split").nunique(),
        }
    )


def mrr_by_side(sides: dict, **kwargs) -> pd.DataFrame:
    """``mean_reciprocal_rank`` of each run table in ``sides`` (name -> runs), stacked with a
    ``side`` column; ``kwargs`` go to ``mean_reciprocal_rank`` for every side alike."""
    return pd.concat(
        [mean_reciprocal_rank(runs, **kwargs).assign(side=name) for name, runs in sides.items()],
        ignore_index=True,
    )


def mrr_separation(mrr: pd.DataFrame) -> pd.DataFrame:
    """The protocol's decision rule on an MRR table (``mean_reciprocal_rank``, optionally with
    a ``side`` column): per pair of PEs (and side), "A above B" only if A's interval lies wholly
    above B's, else "not separated". Columns: [side,] pe_a, pe_b, verdict, n_cells (the cells
    the two MRRs rest on: the rule was fixed for the full grid's 27); pairs by MRR order."""
    rows = []
    groups = mrr.groupby("side", sort=False) if "side" in mrr else [(None, mrr)]
    for side, g in groups:
        g = g.sort_values("mrr", ascending=False, kind="stable").reset_index(drop=True)
        if g[["ci_low", "ci_high"]].isna().any().any():
            raise ComparisonError("MRR separation needs bootstrap intervals (n_boot > 0)")
        for i in range(len(g)):
            for j in range(i + 1, len(g)):
                a, b = g.iloc[i], g.iloc[j]
                above = a["ci_low"] > b["ci_high"]
                verdict = f"{a['pe']} above {b['pe']}" if above else "not separated"
                row = {"pe_a": a["pe"], "pe_b": b["pe"], "verdict": verdict,
                       "n_cells": int(min(a["n_cells"], b["n_cells"]))}  # fmt: skip
                rows.append({"side": side, **row} if side is not None else row)
    cols = ["side"] * ("side" in mrr) + ["pe_a", "pe_b", "verdict", "n_cells"]
    return pd.DataFrame(rows, columns=cols)


def claim1_verdict(separation: pd.DataFrame, *, side: str = "ours", pes=FIVE_PES) -> str:
    """Claim 1 (NoPE length-generalizes better than the explicit PEs) by the protocol's
    decision rule on ``mrr_separation``'s table: "reproduced" if NoPE is above every explicit
    PE, "contradicted" if any explicit PE is above NoPE, else "not separated" (naming the PEs
    NoPE is above, if any)."""
    rows = separation[separation["side"] == side] if "side" in separation else separation
    verdicts = set(rows["verdict"])
    others = [p for p in pes if p != "nope"]
    above_nope = [p for p in others if f"{p} above nope" in verdicts]
    nope_above = [p for p in others if f"nope above {p}" in verdicts]
    if above_nope:
        return f"contradicted: {', '.join(above_nope)} above NoPE"
    if len(nope_above) == len(others):
        return "reproduced: NoPE above every explicit PE"
    return "not separated" + (f" (NoPE above {', '.join(nope_above)} only)" if nope_above else "")


def tie_counts(runs: pd.DataFrame, *, splits=None, pes=FIVE_PES) -> pd.DataFrame:
    """Per split: how many complete (split, seed) cells have PEs with equal OOD accuracy
    (``cells_with_tie``: their ranks then come from the tie order, not the data) and how many
    have all PEs equal (``cells_all_equal``, e.g. every PE at 0)."""
    rr = reciprocal_ranks(runs, splits=splits, pes=pes, tie_order=None)
    rows = []
    for split, g in rr.groupby("split", sort=False):
        cells = g.groupby("seed")["ood_accuracy"]
        rows.append(
            {
                "split": split,
                "cells": cells.ngroups,
                "cells_with_tie": int((cells.nunique() < cells.size()).sum()),
                "cells_all_equal": int((cells.nunique() == 1).sum()),
            }
        )
    return pd.DataFrame(rows, columns=["split", "cells", "cells_with_tie", "cells_all_equal"])


@dataclass(repr=False)
class PaperComparison(Result):
    """Ours beside the paper's. ``table``: per (split, pe) the OOD accuracy mean [min, max]
    over seeds and the PE's rank, ours and the paper's. ``agreement``: Kendall's tau per split.
    ``mrr``: per PE and side, MRR over the identical split set with its bootstrap interval.
    ``separation``: which PEs the intervals separate (``mrr_separation``; empty without them).
    ``ties``: per side and split, the cells whose ranks rest on ties (``tie_counts``)."""

    agreement: pd.DataFrame = field(default_factory=pd.DataFrame)
    mrr: pd.DataFrame = field(default_factory=pd.DataFrame)
    separation: pd.DataFrame = field(default_factory=pd.DataFrame)
    ties: pd.DataFrame = field(default_factory=pd.DataFrame)

    name: ClassVar[str] = "paper_comparison"
    title: ClassVar[str] = "OOD accuracy: ours vs the paper's"
    extra_tables: ClassVar[tuple[str, ...]] = ("agreement", "mrr", "separation", "ties")


def compare_with_paper(
    ours: pd.DataFrame,
    paper: pd.DataFrame | None = None,
    *,
    splits=None,
    pes=FIVE_PES,
    tie_order=PAPER_TIE_ORDER,
    n_boot: int = 2000,
    seed: int = 0,
) -> PaperComparison:
    """Compare our run table with the paper's (default ``paper_runs()``) on the splits both
    have (or ``splits``, which must all be in both): summaries, ranks, Kendall's tau and MRR,
    each side computed by the same functions. The MRR leaves out the splits the paper's MRR
    left out (``PAPER_MRR_EXCLUDED``: ``len`` is reported per split only)."""
    paper = paper_runs() if paper is None else paper
    check_runs(ours), check_runs(paper)
    shared = [s for s in ours["split"].unique() if s in set(paper["split"])]
    if splits is not None:
        absent = [s for s in splits if s not in shared]
        if absent:
            raise ComparisonError(f"splits {absent} are not in both run tables")
        shared = list(splits)
    if not shared:
        raise ComparisonError("the two run tables share no split")
    sides = {"ours": ours, "paper": paper}
    summary = {
        k: ood_summary(v, splits=shared, pes=pes).merge(
            pe_ranks(v, splits=shared, pes=pes)[["split", "pe", "rank"]], on=["split", "pe"]
        )
        for k, v in sides.items()
    }
    table = summary["ours"].merge(
        summary["paper"], on=["split", "pe"], how="outer", suffixes=("_ours", "_paper")
    )
    mrr_splits = [s for s in shared if s not in PAPER_MRR_EXCLUDED]
    if not mrr_splits:
        raise ComparisonError(f"no split for the MRR: {PAPER_MRR_EXCLUDED} are left out of it")
    mrr = mrr_by_side(
        sides, splits=mrr_splits, pes=pes, tie_order=tie_order, n_boot=n_boot, seed=seed
    )
    meta = {
        "splits": shared,
        "mrr_splits": mrr_splits,
        "n_splits": len(mrr_splits),
        "pes": list(pes),
        "tie_order": list(tie_order),
        "n_boot": n_boot,
        "bootstrap_seed": seed,
        "bootstrap_unit": "(split, seed) cell",
    }
    agreement = rank_agreement(ours, paper, splits=shared, pes=pes)
    separation = mrr_separation(mrr) if n_boot else pd.DataFrame()
    ties = pd.concat(
        [tie_counts(v, splits=shared, pes=pes).assign(side=k) for k, v in sides.items()],
        ignore_index=True,
    )
    return PaperComparison(
        table=table, meta=meta, agreement=agreement, mrr=mrr, separation=separation, ties=ties
    )
