"""Theorem 2 on trained models: how much attention logits depend on relative distance, per PE,
and where attention goes (the paper's "NoPE and T5 attention is bimodal" observation).

    python analyses/distance_dependence.py [--checkpoints checkpoints] [--quick]

For every checkpoint, `nopeinterp.probing.distance_dependence` on `n_eval` ID (val
pool) and OOD (test pool) sequences: per (split, layer, head) the R2 of the least-squares fit
logit[n, m] ~ a_row + f(n - m) over the valid causal cells (1 = the head's logits are a
function of relative distance only), and the attention mass per distance d = n - m (mean over
query rows, summing to 1 over d: the attention-distance histogram).

A distance in tokens means different things in rows of different lengths, so the bands are
read off the relative histogram (`rel_mass`: key binned by d / n within its own row, 10 bins):
per (checkpoint, split, layer), mean over heads, `near` = the most recent tenth of the row
(d / n < 0.1), `far` = the oldest tenth (d / n >= 0.9, the first tokens), `middle` = the rest;
`near_uniform` / `far_uniform` = what uniform attention over the same rows puts there; per head
too, with `bimodal` = near and far both at least BIMODAL_FACTOR (1.5) times their uniform
shares, counted per layer in `bimodal_heads`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from _common import parser, print_written, run_script, task_filter, write_figure, write_table

from nopeinterp.probing.distance import layer_scores
from nopeinterp.zoo import find_checkpoints, over_seeds

IDENT = ["checkpoint", "task", "pe", "seed"]


BIMODAL_FACTOR = 1.5  # a head is "bimodal" with near and far both >= 1.5x their uniform shares


def head_bands(rel_mass: pd.DataFrame) -> pd.DataFrame:
    """Per head: near (d/n < 0.1), middle, far (d/n >= 0.9) attention mass, the uniform
    shares of near and far, and whether the head is bimodal (see BIMODAL_FACTOR)."""
    m = rel_mass.copy()
    m["band"] = "middle"
    m.loc[m["rel_lo"] >= 0.9 - 1e-9, "band"] = "far"
    m.loc[m["rel_hi"] <= 0.1 + 1e-9, "band"] = "near"
    keys = IDENT + ["split", "layer", "head"]
    sums = m.groupby(keys + ["band"], sort=False)[["mass", "uniform"]].sum()
    out = sums["mass"].unstack("band").reindex(columns=["near", "middle", "far"]).fillna(0.0)
    uniform = sums["uniform"].unstack("band")
    out["near_uniform"], out["far_uniform"] = uniform["near"], uniform["far"]
    out["bimodal"] = (out["near"] >= BIMODAL_FACTOR * out["near_uniform"]) & (
        out["far"] >= BIMODAL_FACTOR * out["far_uniform"]
    )
    return out.reset_index()


def mass_summary(heads: pd.DataFrame) -> pd.DataFrame:
    """`head_bands` per (checkpoint, split, layer): mean over heads, bimodal heads counted."""
    keys = IDENT + ["split", "layer"]
    g = heads.groupby(keys, sort=False)
    out = g[["near", "middle", "far", "near_uniform", "far_uniform"]].mean()
    out["bimodal_heads"] = g["bimodal"].sum().astype(int)
    out["heads"] = g.size()
    return out.reset_index()


def score_figure(table: pd.DataFrame):
    """Score per layer per PE: mean over heads (line), max over heads (dotted); ID / OOD."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nopeinterp.viz.legend import Legend

    tasks = list(dict.fromkeys(table["task"]))
    splits = list(dict.fromkeys(table["split"]))
    fig = make_subplots(
        rows=len(tasks),
        cols=len(splits),
        subplot_titles=[f"{t} {s}" for t in tasks for s in splits],
    )
    names = list(dict.fromkeys(table["checkpoint"]))
    legend = Legend(names)
    agg = layer_scores(table, IDENT)
    for row, task in enumerate(tasks, start=1):
        for col, split in enumerate(splits, start=1):
            t = agg[(agg.task == task) & (agg.split == split)]
            for name, g in t.groupby("checkpoint", sort=False):
                for stat, dash in (("mean", None), ("max", "dot")):
                    label = f"{name} ({stat} over heads)"
                    fig.add_trace(
                        go.Scatter(
                            x=g.layer, y=g[stat], **legend.entry(label), mode="lines+markers",
                            line=dict(color=legend.color(name), dash=dash),
                        ),
                        row=row, col=col,
                    )  # fmt: skip
            fig.update_xaxes(title_text="layer (block)", dtick=1, row=row, col=col)
            fig.update_yaxes(range=[-0.05, 1.05], row=row, col=col)
    fig.update_layout(
        title="Distance dependence of attention logits (R² of logit ~ row + f(n-m))",
        height=380 * len(tasks), template="plotly_white",
    )  # fmt: skip
    return fig


def histogram_figure(mass: pd.DataFrame, x: str = "distance", x_title: str = "distance n - m"):
    """Attention mass by `x`, mean over heads: one panel per (task, layer), line per PE."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nopeinterp.viz.legend import Legend

    m = mass.groupby(IDENT + ["split", "layer", x], sort=False)["mass"].mean()
    m = m.reset_index()
    panels = list(dict.fromkeys(zip(m.task, m.layer, strict=True)))
    fig = make_subplots(
        rows=len(panels), cols=1, subplot_titles=[f"{t}, layer {lay}" for t, lay in panels],
        vertical_spacing=0.2 / max(len(panels), 1),
    )  # fmt: skip
    names = list(dict.fromkeys(m["checkpoint"]))
    legend = Legend(names)
    for row, (task, layer) in enumerate(panels, start=1):
        t = m[(m.task == task) & (m.layer == layer)]
        for (name, split), g in t.groupby(["checkpoint", "split"], sort=False):
            label = f"{name} ({split})"
            fig.add_trace(
                go.Scatter(
                    x=g[x], y=g.mass, **legend.entry(label), mode="lines",
                    line=dict(color=legend.color(name), dash="dash" if split == "OOD" else None),
                ),
                row=row, col=1,
            )  # fmt: skip
        fig.update_yaxes(title_text="attention", row=row, col=1)
    fig.update_xaxes(title_text=x_title, row=len(panels), col=1)
    fig.update_layout(
        title="Attention mass by distance (mean over heads and query rows; OOD dashed)",
        height=260 * len(panels), template="plotly_white",
    )  # fmt: skip
    return fig


def main(argv=None) -> list[Path]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n-eval", type=int, default=None, help="sequences per split (128; --quick 16)")
    args = p.parse_args(argv)
    n_eval = args.n_eval or (16 if args.quick else 128)
    from nopeinterp.probing import distance_dependence

    tables, masses, rel_masses = [], [], []
    for info in find_checkpoints(args.checkpoints, task_filter(args)):
        t0, c0 = time.perf_counter(), time.process_time()
        result = distance_dependence(info.path, n_eval=n_eval, progress=args.progress)
        ident = {"checkpoint": info.name, "task": info.task, "pe": info.pe, "seed": info.seed}
        tables.append(result.table.assign(**ident))
        masses.append(result.mass.assign(**ident))
        rel_masses.append(result.rel_mass.assign(**ident))
        print(
            f"  scored {info.name} in {time.perf_counter() - t0:.1f} s "
            f"({time.process_time() - c0:.1f} s CPU)",
            flush=True,
        )
    table = pd.concat(tables, ignore_index=True)
    table = table[IDENT + [c for c in table.columns if c not in IDENT]]
    mass = pd.concat(masses, ignore_index=True)
    mass = mass[IDENT + [c for c in mass.columns if c not in IDENT]]
    rel_mass = pd.concat(rel_masses, ignore_index=True)
    rel_mass = rel_mass[IDENT + [c for c in rel_mass.columns if c not in IDENT]]
    wide = layer_scores(table, IDENT)
    heads = head_bands(rel_mass)
    bands = mass_summary(heads)
    keys = ["task", "pe", "split", "layer"]
    scores = wide.rename(columns={"mean": "score_mean_heads", "max": "score_max_heads"})
    by_pe = over_seeds(scores, keys, ["score_mean_heads", "score_max_heads"]).merge(
        over_seeds(bands, keys, ["near", "far", "bimodal_heads"]).drop(columns="n_seeds"), on=keys
    )

    pd.set_option("display.width", 250)
    fmt = {"float_format": lambda v: f"{v:.3f}", "index": False}
    print("\n== Distance-dependence score per layer and head (1 = logits depend on n-m only) ==")
    print(wide.to_string(**fmt))
    print(
        "\n== Attention mass by relative distance d/n: near (< 0.1) / middle / far (>= 0.9), "
        "mean over heads; *_uniform: uniform attention =="
    )
    print(bands.to_string(**fmt))
    out = Path(args.out)
    quick = " QUICK RUN (--quick): too few sequences for conclusions." if args.quick else ""
    setting = f"{n_eval} ID and {n_eval} OOD sequences per checkpoint.{quick}"
    paths = [
        *write_table(table, out, "distance_dependence_tidy", title="Distance dependence (tidy)",
                     notes=setting),
        *write_table(wide, out, "distance_dependence",
                     title="Distance-dependence score (R2 of logit ~ row offset + f(n-m)) per head",
                     notes=setting),
        *write_table(mass, out, "attention_distance_histogram",
                     title="Attention mass per distance (histogram data)", notes=setting),
        *write_table(rel_mass, out, "attention_relative_distance_histogram",
                     title="Attention mass per relative distance d/n (histogram data)",
                     notes=setting + " uniform: uniform attention over the same rows."),
        *write_table(bands, out, "attention_distance_bands",
                     title="Attention mass near (d/n < 0.1), middle, far (d/n >= 0.9)",
                     notes=setting + " d/n: distance relative to the query's own row (0 = "
                     "itself, 1 = the first token); mean over heads; near_uniform / far_uniform:"
                     f" uniform attention over the same rows. bimodal_heads: heads with near and "
                     f"far both >= {BIMODAL_FACTOR}x their uniform shares."),
        *write_table(heads, out, "attention_distance_bands_per_head",
                     title="Attention mass near / middle / far per head", notes=setting),
        *write_table(by_pe, out, "distance_dependence_seeds",
                     title="Distance-dependence score (mean / max over heads) and near / far mass "
                     "per PE and layer, over training seeds (mean, min, max)", notes=setting),
        *write_figure(score_figure(table), out, "distance_dependence"),
        *write_figure(histogram_figure(mass), out, "attention_distance_histogram"),
        *write_figure(histogram_figure(rel_mass.assign(rel=(rel_mass.rel_lo + rel_mass.rel_hi) / 2), "rel",
                                       "relative distance d/n (bin centre)"),
                      out, "attention_relative_distance_histogram"),
    ]  # fmt: skip
    print_written(paths)
    return paths


if __name__ == "__main__":
    run_script(main)
