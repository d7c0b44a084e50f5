"""Figures of the probing analyses (nopeinterp.probing): position probes and distance scores."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

_METRIC_TITLES = {
    "r2": "R² (regression)",
    "mae": "MAE (positions)",
    "accuracy": "accuracy (classifier)",
}
_SPLIT_COLORS = {"ID": "#1f77b4", "OOD": "#d62728"}
_BASELINE_STYLE = {
    "random_init": dict(dash="dash", width=1.5),
    "shuffled": dict(dash="dot", width=1.5),
    "constant": dict(dash="dashdot", width=1),
}


def probe_figure(
    table: pd.DataFrame,
    metrics: Sequence[str] = ("r2", "mae", "accuracy"),
    title: str | None = None,
) -> go.Figure:
    """One panel per metric, value per layer: the trained model solid (ID blue, OOD red),
    baselines (random_init, shuffled, constant) dashed in the split's colour."""
    metrics = [m for m in metrics if m in set(table.metric)]
    fig = make_subplots(
        rows=1, cols=len(metrics), subplot_titles=[_METRIC_TITLES.get(m, m) for m in metrics]
    )
    for col, metric in enumerate(metrics, start=1):
        t = table[table.metric == metric]
        for model in ["trained", *_BASELINE_STYLE]:
            for split, color in _SPLIT_COLORS.items():
                d = t[(t.model == model) & (t.split == split)].sort_values("layer")
                if d.empty:
                    continue
                line = dict(color=color, **_BASELINE_STYLE.get(model, dict(width=2.5)))
                fig.add_trace(
                    go.Scatter(
                        x=d.layer,
                        y=d.value,
                        mode="lines+markers" if model == "trained" else "lines",
                        line=line,
                        name=f"{model} {split}",
                        legendgroup=f"{model} {split}",
                        showlegend=col == 1,
                        hovertemplate=f"{model} {split}<br>layer %{{x}}<br>{metric} %{{y:.4g}}"
                        "<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
        fig.update_xaxes(title_text="layer (0 = embeddings)", dtick=1, row=1, col=col)
        if metric in ("r2", "accuracy"):
            fig.update_yaxes(range=[-0.05, 1.05] if metric == "accuracy" else None, row=1, col=col)
    fig.update_layout(
        title=title or "Linear position probe per layer",
        height=420,
        width=max(500, 420 * len(metrics)),
        template="plotly_white",
    )
    return fig


def distance_heatmap(table: pd.DataFrame, split: str | None = None) -> go.Figure:
    """Layer x head heatmap of the distance-dependence score (1 = logits depend on n-m only)."""
    if split is None:
        split = table.split.iloc[0]
    t = table[table.split == split]
    grid = t.pivot_table(index="layer", columns="head", values="score", dropna=False)
    fig = go.Figure(
        go.Heatmap(
            z=grid.values,
            x=[f"H{h}" for h in grid.columns],
            y=[f"L{layer}" for layer in grid.index],
            zmin=0,
            zmax=1,
            colorscale="Viridis",
            colorbar=dict(title="R²"),
            hovertemplate="%{y} %{x}<br>score %{z:.4f}<extra></extra>",
            text=[[f"{v:.2f}" for v in row] for row in grid.values],
            texttemplate="%{text}",
        )
    )
    fig.update_layout(
        title=f"Distance dependence of attention logits ({split})",
        xaxis_title="head",
        yaxis_title="layer",
        yaxis_autorange="reversed",
        height=max(300, 40 * len(grid) + 150),
        width=max(400, 50 * len(grid.columns) + 200),
        template="plotly_white",
    )
    return fig


def attention_distance_histogram(
    mass: pd.DataFrame,
    *,
    layer: int | None = None,
    head: int | None = None,
    max_distance: int | None = None,
) -> go.Figure:
    """Attention mass by distance n - m (averaged over query rows).

    With `layer` and `head`: bars, one colour per split. Otherwise one panel per layer (or
    the given layer) with a line per head and split (OOD dashed).
    """
    m = mass
    if max_distance is not None:
        m = m[m.distance <= max_distance]
    if layer is not None:
        m = m[m.layer == layer]
    if head is not None:
        m = m[m["head"] == head]
    splits = list(dict.fromkeys(m.split))
    if layer is not None and head is not None:
        fig = go.Figure(
            [
                go.Bar(x=d.distance, y=d.mass, name=split)
                for split in splits
                for d in [m[m.split == split]]
            ]
        )
        fig.update_layout(
            title=f"Attention mass by distance, layer {layer} head {head}",
            xaxis_title="distance n - m",
            yaxis_title="mean attention",
            barmode="group",
            template="plotly_white",
        )
        return fig
    layers = sorted(set(m.layer))
    fig = make_subplots(
        rows=len(layers) or 1,
        cols=1,
        subplot_titles=[f"layer {x}" for x in layers],
        shared_xaxes=True,
    )
    palette = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
        "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    ]  # fmt: skip
    for row, lay in enumerate(layers, start=1):
        for split_i, split in enumerate(splits):
            for h in sorted(set(m["head"])):
                d = m[(m.layer == lay) & (m["head"] == h) & (m.split == split)]
                fig.add_trace(
                    go.Scatter(
                        x=d.distance,
                        y=d.mass,
                        mode="lines",
                        line=dict(
                            color=palette[h % len(palette)], dash="dash" if split_i else None
                        ),
                        name=f"head {h} ({split})",
                        legendgroup=f"{h} {split}",
                        showlegend=row == 1,
                    ),
                    row=row,
                    col=1,
                )
        fig.update_yaxes(title_text="mean attention", row=row, col=1)
    fig.update_xaxes(title_text="distance n - m", row=len(layers) or 1, col=1)
    fig.update_layout(
        title="Attention mass by distance",
        height=max(350, 260 * len(layers)),
        template="plotly_white",
    )
    return fig


__all__ = ["attention_distance_histogram", "distance_heatmap", "probe_figure"]
