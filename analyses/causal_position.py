"""Is the position that probes find used? Erasure, attention sinks / dilution and a head taxonomy.

    python analyses/causal_position.py [--checkpoints checkpoints] [--quick]

For every checkpoint of every task (all PEs, every seed found):
  - `nopeinterp.probing.erase_position`: at each layer (0 = embeddings, l = after block l),
    LEACE removes linearly decodable absolute position from the residual stream; a fresh probe's
    R2 after erasure, and the change in greedy exact match and target loss on held-out ID and
    OOD examples, against a random subspace of the same rank (the control);
  - `nopeinterp.probing.attention_sinks`: per head, mean attention on the first token (<bos>)
    and the slope of attention entropy on log(n) (1 = dilutes like uniform attention);
  - `nopeinterp.probing.classify_heads`: each head labelled sink / previous_token / local /
    uniform / distance / content by the thresholds in `nopeinterp.probing.heads`.
Tables (CSV + markdown) and figures (HTML) go into analyses/results/ as causal_*.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from _common import parser, print_written, run_script, task_filter, write_figure, write_table

from nopeinterp.probing.heads import label_counts
from nopeinterp.zoo import find_checkpoints, over_seeds

IDENT = ["checkpoint", "task", "pe", "seed"]
# The summary's columns: erased-model value minus the unerased one, per condition and split.
SUMMARY_METRICS = ("r2", "exact_match", "target_loss")


def erasure_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per checkpoint and layer: probe R2 (none / leace / random) and the change in
    exact match and target loss under leace and random, ID and OOD."""
    rows = []
    for key, g in table.groupby([*IDENT, "layer"], sort=False):
        row = dict(zip([*IDENT, "layer"], key, strict=True))
        row["rank"] = int(g[g.condition == "leace"]["rank"].max())
        v = g.set_index(["condition", "split", "metric"])
        for split in ("ID", "OOD"):
            for metric in SUMMARY_METRICS:
                for cond in ("none", "leace", "random"):
                    if (cond, split, metric) not in v.index:
                        continue
                    if metric == "r2" or cond == "none":
                        row[f"{split} {metric} {cond}"] = v.loc[(cond, split, metric), "value"]
                    else:
                        row[f"{split} {metric} d_{cond}"] = v.loc[(cond, split, metric), "delta"]
        rows.append(row)
    return pd.DataFrame(rows)


def sinks_by_layer(dilution: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint, split and layer: mean / max first-token mass and mean entropy slope."""
    g = dilution.groupby([*IDENT, "split", "layer"], sort=False)
    out = g.agg(
        first_mass_mean=("first_mass", "mean"),
        first_mass_max=("first_mass", "max"),
        entropy_slope_mean=("entropy_slope", "mean"),
        entropy_slope_min=("entropy_slope", "min"),
    )
    return out.reset_index()


def erasure_figure(summary: pd.DataFrame):
    """Change in exact match per erased layer, one line per checkpoint (leace solid, random
    dotted), one panel per task and split."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nopeinterp.viz.legend import Legend

    tasks = list(dict.fromkeys(summary.task))
    panels = [(t, s) for t in tasks for s in ("ID", "OOD")]
    fig = make_subplots(rows=len(tasks), cols=2, subplot_titles=[f"{t} {s}" for t, s in panels])
    names = list(dict.fromkeys(summary.checkpoint))
    legend = Legend(names)
    for i, (task, split) in enumerate(panels):
        row, col = i // 2 + 1, i % 2 + 1
        for name, g in summary[summary.task == task].groupby("checkpoint", sort=False):
            for cond, dash in (("leace", None), ("random", "dot")):
                y = f"{split} exact_match d_{cond}"
                if y not in g or g[y].isna().all():
                    continue
                label = f"{name} {cond}"
                fig.add_trace(
                    go.Scatter(
                        x=g.layer, y=g[y], **legend.entry(label), mode="lines+markers",
                        line=dict(color=legend.color(name), dash=dash),
                    ),
                    row=row, col=col,
                )  # fmt: skip
        fig.update_xaxes(title_text="erased layer (0 = embeddings)", dtick=1, row=row, col=col)
        fig.update_yaxes(title_text="change in exact match", row=row, col=col)
    fig.update_layout(
        title="Erasing position (LEACE, solid) vs a random subspace of the same rank (dotted)",
        height=380 * len(tasks), template="plotly_white",
    )  # fmt: skip
    return fig


def taxonomy_figure(counts: pd.DataFrame):
    """Stacked bars: heads per label, per checkpoint (ID split), one panel per task."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nopeinterp.probing.heads import KINDS

    c = counts[counts.split == "ID"]
    tasks = list(dict.fromkeys(c.task))
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks)
    for j, task in enumerate(tasks, start=1):
        t = c[c.task == task]
        for kind in KINDS:
            fig.add_trace(
                go.Bar(x=t.checkpoint, y=t[kind], name=kind, legendgroup=kind,
                       showlegend=j == 1),
                row=1, col=j,
            )  # fmt: skip
    fig.update_layout(
        barmode="stack", title="Head taxonomy (ID sequences): heads per label",
        template="plotly_white",
    )  # fmt: skip
    return fig


def sinks_figure(by_layer: pd.DataFrame):
    """Mean first-token mass and mean entropy slope per layer, one line per checkpoint (ID)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    t = by_layer[by_layer.split == "ID"]
    tasks = list(dict.fromkeys(t.task))
    titles = [f"{task}: {m}" for task in tasks for m in ("first-token mass", "entropy slope")]
    fig = make_subplots(rows=len(tasks), cols=2, subplot_titles=titles)
    for i, task in enumerate(tasks, start=1):
        for name, g in t[t.task == task].groupby("checkpoint", sort=False):
            for col, y in ((1, "first_mass_mean"), (2, "entropy_slope_mean")):
                fig.add_trace(
                    go.Scatter(x=g.layer, y=g[y], name=name, legendgroup=name,
                               showlegend=col == 1, mode="lines+markers"),
                    row=i, col=col,
                )  # fmt: skip
            fig.update_xaxes(title_text="block", dtick=1, row=i)
    fig.update_layout(
        title="Attention sinks and dilution per layer (mean over heads, ID sequences)",
        height=350 * len(tasks), template="plotly_white",
    )  # fmt: skip
    return fig


def analyse(info, n_train: int, n_eval: int, n_heads: int, progress: bool):
    """The three analyses of one checkpoint -> (erasure, dilution, taxonomy) tables."""
    import torch

    from nopeinterp.inputs import as_model
    from nopeinterp.probing import attention_sinks, classify_heads, erase_position

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    mi = as_model(info.path)
    ident = {"checkpoint": info.name, "task": info.task, "pe": info.pe, "seed": info.seed}
    er = erase_position(mi, n_train=n_train, n_eval=n_eval, progress=progress)
    kw = dict(n_eval=n_heads, progress=progress)
    dilution = attention_sinks(mi, **kw).dilution.assign(**ident)
    taxonomy = classify_heads(mi, **kw).table.assign(**ident)
    print(f"  {info.name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return er.table.assign(**ident), dilution, taxonomy


def main(argv=None) -> list[Path]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n-train", type=int, default=None, help="erasure: eraser + probe (128)")
    p.add_argument("--n-eval", type=int, default=None, help="erasure: ID/OOD sequences (32)")
    p.add_argument("--n-heads", type=int, default=None, help="sinks/taxonomy: ID/OOD seqs (32)")
    p.add_argument("--jobs", type=int, default=1, help="checkpoints analysed in parallel")
    args = p.parse_args(argv)
    n_train = args.n_train or (24 if args.quick else 128)
    n_eval = args.n_eval or (8 if args.quick else 32)
    n_heads = args.n_heads or (8 if args.quick else 32)
    entries = find_checkpoints(args.checkpoints, task_filter(args))
    work = [(info, n_train, n_eval, n_heads, args.progress) for info in entries]
    if args.jobs > 1:  # checkpoints in parallel processes (same results, in the same order)
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs) as pool:
            done = list(pool.map(analyse, *zip(*work, strict=True)))
    else:
        done = [analyse(*w) for w in work]
    erasure, dilution, taxonomy = (list(x) for x in zip(*done, strict=True))

    def front(df):
        return df[IDENT + [c for c in df.columns if c not in IDENT]]

    erasure = front(pd.concat(erasure, ignore_index=True))
    dilution = front(pd.concat(dilution, ignore_index=True))
    taxonomy = front(pd.concat(taxonomy, ignore_index=True))
    summary = erasure_summary(erasure)
    values = [c for c in summary.columns if c not in (*IDENT, "layer", "rank")]
    by_pe = over_seeds(summary, ["task", "pe", "layer"], values)
    counts = label_counts(taxonomy, IDENT)  # per checkpoint and split
    by_layer = sinks_by_layer(dilution)

    pd.set_option("display.width", 250)
    show = [c for c in summary.columns if "exact_match" in c or c.endswith("r2 leace")]
    print("\n== Position erasure: change in exact match (d_) and probe R2 after LEACE ==")
    print(
        summary[["checkpoint", "layer", *show]].to_string(index=False, float_format="{:.3f}".format)
    )
    print("\n== Head taxonomy (ID) ==")
    print(counts[counts.split == "ID"].to_string(index=False))

    out = Path(args.out)
    quick = " QUICK RUN (--quick): too few sequences for conclusions." if args.quick else ""
    setting = (
        f"Erasure: {n_train} training sequences (ID lengths; half fit the LEACE eraser, half "
        f"the probe refitted on erased activations), {n_eval} held-out ID and {n_eval} OOD "
        "sequences (probe R2, greedy exact match, target loss). Layer 0 = embeddings, l = after "
        "block l. d_leace / d_random: erased minus unerased; random = a random subspace of the "
        "LEACE eraser's rank." + quick
    )
    head_setting = (
        f"{n_heads} held-out ID and {n_heads} OOD sequences per checkpoint; layers are blocks "
        "(the attention of block l). Labels and thresholds: nopeinterp.probing.heads." + quick
    )
    paths = [
        *write_table(erasure, out, "causal_erasure", title="Position erasure (tidy)",
                     notes=setting),
        *write_table(summary, out, "causal_erasure_summary",
                     title="Position erasure per checkpoint and layer", notes=setting),
        *write_table(by_pe, out, "causal_erasure_seeds",
                     title="Position erasure per PE and layer over training seeds (mean, min, max)",
                     notes=setting),
        *write_table(dilution, out, "causal_sinks", title="Attention sinks and dilution per head",
                     notes=head_setting + " entropy_slope: slope of entropy on log(n), 1 = "
                     "uniform-like dilution, 0 = as sharp at every length."),
        *write_table(by_layer, out, "causal_sinks_by_layer",
                     title="Attention sinks and dilution per layer", notes=head_setting),
        *write_table(taxonomy, out, "causal_heads", title="Head taxonomy: scores and labels",
                     notes=head_setting),
        *write_table(counts, out, "causal_heads_counts", title="Heads per label",
                     notes=head_setting),
        *write_figure(erasure_figure(summary), out, "causal_erasure"),
        *write_figure(sinks_figure(by_layer), out, "causal_sinks"),
        *write_figure(taxonomy_figure(counts), out, "causal_heads"),
    ]  # fmt: skip
    print_written(paths)
    return paths


if __name__ == "__main__":
    run_script(main)
