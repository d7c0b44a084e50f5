"""Length generalization: exact match per length and PE, ID vs OOD, and the paper's MRR.

    python analyses/length_generalization.py [--checkpoints checkpoints] [--quick] [--n 100]

Every checkpoint `<task>-<pe>[-seed<k>].pt` is evaluated with `nopeinterp.evaluation.evaluate`
(greedy decoding, exact match, `n` examples per length: ID lengths from the val pool, OOD
lengths from the test pool) and summarised with `summarize` (ID / OOD accuracy, weighted by
examples). Mean reciprocal rank as in the paper: each (task, seed) is one split; within it the
PEs are ranked by OOD accuracy (rank 1 = best, ties get their average rank), and a PE's MRR is
the mean of 1/rank over the splits. A split is used only if it has every PE of its task (a
lone NoPE-prime seed would otherwise rank first by default). For ranking, OOD accuracy is over
all OOD examples: a sequence learned APE cannot read (past its table) counts as wrong. MRR is
relative to the PEs ranked, so it is computed twice: among the paper's five PEs (comparable to
the paper's figures; its APE is sinusoidal) and among all six.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from _common import parser, print_written, run_script, task_filter, write_figure, write_table

from nopeinterp.paper import reciprocal_ranks
from nopeinterp.zoo import find_checkpoints, over_seeds, pe_rank

# Kazemnejad et al. 2023, aggregate MRR over 17 task splits x 3 seeds (their APE is sinusoidal)
PAPER_MRR = {"nope": 0.69, "t5": 0.55, "alibi": 0.50, "rotary": 0.33, "sinusoidal": 0.22}
# MRR is relative to the PEs ranked: "paper" ranks the paper's five (comparable to PAPER_MRR),
# "all" adds our learned APE.
PE_SETS = {"paper": tuple(PAPER_MRR), "all": None}


def ood_accuracy(table: pd.DataFrame) -> pd.DataFrame:
    """OOD exact match per model over all its OOD examples, for ranking.

    Unlike `summarize` (which reports learned APE on the lengths it can read), a sequence the
    model cannot read at all counts as wrong here: a PE that cannot answer does not rank well.
    """
    ood = table[table["split"] == "OOD"]
    g = ood.groupby(["task", "seed", "pe", "model"], sort=False)[["correct", "n"]].sum()
    g["ood_accuracy"] = g["correct"] / g["n"]
    return g.reset_index()[["task", "seed", "pe", "model", "ood_accuracy"]]


def mean_reciprocal_rank(ood: pd.DataFrame, pes=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ranks per split, MRR per PE) from `ood_accuracy(...)`, ranking only `pes` if given.

    Ranks come from `nopeinterp.paper.reciprocal_ranks` (tied PEs share their average rank),
    per task among the PEs trained on it; a (task, seed) cell with two models of one PE is
    left out.
    """
    cols = ["task", "seed", "pe", "model", "ood_accuracy", "rank", "reciprocal_rank"]
    if pes is not None:
        ood = ood[ood["pe"].isin(pes)]
    runs = ood.rename(columns={"task": "split"})
    twice = runs.duplicated(["split", "seed", "pe"], keep=False)
    bad = set(map(tuple, runs.loc[twice, ["split", "seed"]].to_numpy().tolist()))
    runs = runs[[(sp, se) not in bad for sp, se in zip(runs["split"], runs["seed"], strict=True)]]
    ranks = [
        reciprocal_ranks(g, pes=tuple(g["pe"].unique()), tie_order=None)
        for _, g in runs.groupby("split", sort=True)
    ]
    if not ranks:
        return pd.DataFrame(columns=cols), pd.DataFrame(
            columns=["pe", "mrr", "n_splits", "paper_mrr"]
        )
    ranks = pd.concat(ranks, ignore_index=True).rename(columns={"split": "task"})[cols]
    ranks = ranks.sort_values(["task", "seed"], kind="stable").reset_index(drop=True)
    mrr = (
        ranks.groupby("pe", sort=False)["reciprocal_rank"]
        .agg(mrr="mean", n_splits="count")
        .reset_index()
        .sort_values("mrr", ascending=False, kind="stable")
    )
    mrr["paper_mrr"] = mrr["pe"].map(PAPER_MRR)
    return ranks, mrr.reset_index(drop=True)


def figure(table: pd.DataFrame):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    tasks = list(dict.fromkeys(table["task"]))
    fig = make_subplots(rows=len(tasks), cols=1, subplot_titles=tasks, vertical_spacing=0.12)
    for row, task in enumerate(tasks, start=1):
        t = table[table["task"] == task]
        for model, g in t.groupby("model", sort=False):
            g = g.sort_values("length")
            fig.add_trace(
                go.Scatter(x=g["length"], y=g["accuracy"], mode="lines+markers", name=model),
                row=row,
                col=1,
            )
        id_len = t.loc[t["split"] == "ID", "length"]
        if len(id_len):
            fig.add_vrect(
                x0=id_len.min() - 0.5, x1=id_len.max() + 0.5, fillcolor="lightgray",
                opacity=0.35, line_width=0, row=row, col=1,
            )  # fmt: skip
        fig.update_yaxes(title_text="exact match", range=[-0.05, 1.05], row=row, col=1)
    fig.update_xaxes(title_text="length (grey: training lengths)", row=len(tasks), col=1)
    fig.update_layout(
        title="Exact match vs length", height=380 * len(tasks), template="plotly_white"
    )
    return fig


def evaluate_available(info, n: int, progress: bool):
    """`evaluate` over the task's ID and OOD lengths (lengths without held-out examples, e.g.
    SCAN length 1, are in the result's meta)."""
    from nopeinterp.evaluation import evaluate

    return evaluate(info.path, n=n, progress=progress)


def main(argv=None) -> list[Path]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=None, help="examples per length (100; --quick 10)")
    args = p.parse_args(argv)
    n = args.n or (10 if args.quick else 100)
    from nopeinterp.evaluation import EvalResult, accuracy_by_split

    infos = find_checkpoints(args.checkpoints, task_filter(args))
    tables = []
    for info in infos:
        t0, c0 = time.perf_counter(), time.process_time()
        result = evaluate_available(info, n, args.progress)
        tables.append(result.table.assign(seed=info.seed))
        skipped = result.meta.get("lengths_without_examples")
        if skipped:
            print(f"  note: {info.name}: no held-out examples at lengths {skipped}: skipped")
        print(
            f"  evaluated {info.name} in {time.perf_counter() - t0:.1f} s "
            f"({time.process_time() - c0:.1f} s CPU)",
            flush=True,
        )
    table = pd.concat(tables, ignore_index=True)
    seeds = table[["model", "task", "seed"]].drop_duplicates()
    summary = EvalResult(table).summary.merge(seeds, on="model")
    wide = accuracy_by_split(summary, ["task", "model", "pe", "seed"])
    wide.columns.name = None
    wide["_pe"] = wide["pe"].map(pe_rank)
    wide = wide.sort_values(["task", "seed", "_pe"]).drop(columns="_pe").reset_index(drop=True)
    by_pe = over_seeds(wide, ["task", "pe"], ["ID", "OOD"])
    ood = ood_accuracy(table)
    ranked = {name: mean_reciprocal_rank(ood, pes) for name, pes in PE_SETS.items()}
    ranks = pd.concat([r.assign(among=name) for name, (r, _) in ranked.items()], ignore_index=True)
    mrr = pd.concat([m.assign(among=name) for name, (_, m) in ranked.items()], ignore_index=True)

    pd.set_option("display.width", 200)
    print(f"\n== Exact match, {n} examples per length: ID / OOD (mean over lengths) ==")
    print(wide.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if (by_pe["n_seeds"] > 1).any():
        print("\n== Per PE over training seeds ==")
        print(by_pe.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(
        "\n== Mean reciprocal rank of OOD accuracy (rank 1 = best; among: the paper's five PEs, "
        "or all six with learned APE; paper_mrr: the paper's) =="
    )
    print(mrr.to_string(index=False, float_format=lambda v: f"{v:.3f}"))

    out = Path(args.out)
    setting = f"{n} examples per length, greedy decoding, exact match." + (
        " QUICK RUN (--quick): too few examples for conclusions." if args.quick else ""
    )
    paths = [
        *write_table(table, out, "length_generalization_by_length",
                     title="Exact match per length", notes=setting),
        *write_table(wide, out, "length_generalization",
                     title="Exact match, ID vs OOD (mean over lengths)", notes=setting),
        *write_table(by_pe, out, "length_generalization_seeds",
                     title="Exact match per PE over training seeds (mean, min, max)",
                     notes=setting + " OOD as in the table above (learned APE: the lengths it "
                     "can read)."),
        *write_table(ranks, out, "length_generalization_ranks",
                     title="OOD-accuracy rank of each PE per (task, seed) split", notes=setting),
        *write_table(mrr, out, "length_generalization_mrr",
                     title="Mean reciprocal rank of OOD accuracy",
                     notes=setting + " OOD accuracy over all OOD examples (a sequence learned "
                     "APE cannot read counts as wrong). among: 'paper' ranks the paper's five PEs, "
                     "'all' adds learned APE. paper_mrr: Kazemnejad et al. 2023 (17 splits x 3 "
                     "seeds; their APE is sinusoidal)."),
        *write_figure(figure(table), out, "length_generalization"),
    ]  # fmt: skip
    print_written(paths)
    return paths


if __name__ == "__main__":
    run_script(main)
