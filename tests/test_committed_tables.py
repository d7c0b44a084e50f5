"""The summary tables that both the main job (`nopeinterp report`) and analyses/ derive from an
analysis's tidy table are computed by one function each; recomputed from the committed tidy
tables in analyses/results/, they give the committed summary tables exactly (no model runs)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pandas.testing import assert_frame_equal

from nopeinterp.evaluation import EvalResult, accuracy_by_split
from nopeinterp.main_job import distance_summary
from nopeinterp.probing.distance import DistanceResult, layer_scores
from nopeinterp.probing.heads import label_counts
from nopeinterp.zoo import pe_rank

RESULTS = Path(__file__).resolve().parents[1] / "analyses" / "results"
IDENT = ["checkpoint", "task", "pe", "seed"]


def committed(name: str) -> pd.DataFrame:
    return pd.read_csv(RESULTS / f"{name}.csv")


def test_distance_scores_per_layer_are_the_committed_ones():
    tidy = committed("distance_dependence_tidy")
    assert_frame_equal(layer_scores(tidy, IDENT), committed("distance_dependence"))
    # the main job's distance table: the same numbers, per (task, pe) of seed 0
    seed0 = tidy[tidy.seed == 0]
    results = {
        (task, pe): DistanceResult(g.drop(columns=IDENT).reset_index(drop=True))
        for (task, pe), g in seed0.groupby(["task", "pe"], sort=False)
    }
    got = distance_summary(results)
    want = committed("distance_dependence").query("seed == 0")
    want = want.rename(columns={"mean": "mean_score", "max": "max_score"})[got.columns]
    assert_frame_equal(got, want.reset_index(drop=True))


def test_head_label_counts_are_the_committed_ones():
    counts = label_counts(committed("causal_heads"), IDENT)
    counts.columns.name = None
    assert_frame_equal(counts, committed("causal_heads_counts"))


def test_exact_match_by_split_is_the_committed_one():
    table = committed("length_generalization_by_length")
    seeds = table[["model", "task", "seed"]].drop_duplicates()
    summary = EvalResult(table.drop(columns="seed")).summary.merge(seeds, on="model")
    wide = accuracy_by_split(summary, ["task", "model", "pe", "seed"])
    wide.columns.name = None
    order = [wide.task, wide.seed, wide.pe.map(pe_rank)]
    wide = wide.iloc[sorted(range(len(wide)), key=lambda i: [o.iloc[i] for o in order])]
    assert_frame_equal(wide.reset_index(drop=True), committed("length_generalization"))
