"""Figures of the report page (`nopeinterp report`) drawn across several results."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopeinterp.viz.legend import Legend


def distance_figure(summary: pd.DataFrame, split: str = "OOD"):
    """Best head's distance R2 per layer, one panel per task, a line per PE."""
    tasks = list(dict.fromkeys(summary["task"]))
    fig = make_subplots(rows=1, cols=max(len(tasks), 1), subplot_titles=tasks, shared_yaxes=True)
    legend = Legend()
    for col, task in enumerate(tasks, start=1):
        t = summary[summary["task"] == task]
        s = split if (t["split"] == split).any() else t["split"].iloc[0]
        for pe, rows in t[t["split"] == s].groupby("pe", sort=False):
            fig.add_trace(legend.line(pe, rows["layer"], rows["max_score"]), row=1, col=col)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=col)
    fig.update_yaxes(title_text=f"max over heads of distance R2 ({split})", range=[0, 1.02])
    fig.update_layout(title="Distance dependence of the attention logits", height=400)
    return fig


def rel_mass_figure(results: dict[tuple[str, str], object], pe: str = "nope", split="OOD"):
    """Attention mass by relative distance d / n (mean over heads), a line per layer, one
    panel per task; dashed: uniform attention over the same rows."""
    items = [(task, r) for (task, p), r in results.items() if p == pe]
    fig = make_subplots(
        rows=1, cols=max(len(items), 1), subplot_titles=[t for t, _ in items], shared_yaxes=True
    )
    for col, (_, r) in enumerate(items, start=1):
        m = r.rel_mass
        s = split if (m["split"] == split).any() else m["split"].iloc[0]
        m = m[m["split"] == s].assign(mid=lambda d: (d["rel_lo"] + d["rel_hi"]) / 2)
        for layer, rows in m.groupby("layer", sort=True):
            per_bin = rows.groupby("mid", sort=True)[["mass", "uniform"]].mean().reset_index()
            fig.add_trace(
                go.Scatter(
                    x=per_bin["mid"],
                    y=per_bin["mass"],
                    mode="lines+markers",
                    name=f"layer {layer}",
                    legendgroup=f"layer {layer}",
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
        fig.add_trace(
            go.Scatter(
                x=per_bin["mid"],
                y=per_bin["uniform"],
                mode="lines",
                line_dash="dash",
                line_color="gray",
                name="uniform attention",
                legendgroup="uniform",
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="relative distance d / n (0 = the query, 1 = first token)")
    fig.update_yaxes(title_text="attention mass (mean over heads)", row=1, col=1)
    fig.update_layout(title=f"{pe}: attention mass by relative distance ({split})", height=400)
    return fig
