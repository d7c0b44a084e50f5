"""Plotly figures for the attention-similarity analysis (nopeinterp.similarity)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

_SPLIT_DASH = {"ID": "solid", "OOD": "dash", "all": "dot"}


def _colors(names) -> dict:
    palette = qualitative.Plotly
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


def attention_heatmaps(
    pattern_a,
    pattern_b,
    layer: int,
    names: tuple[str, str] = ("NoPE", "reference"),
    *,
    head: int | str = "mean",
    str_tokens: list[str] | None = None,
) -> go.Figure:
    """Side-by-side attention patterns of two models on one sequence at `layer`.

    `pattern_a`, `pattern_b`: [head, query, key] arrays (one unpadded sequence, e.g.
    `ComparisonResult.example_patterns`). `head`: an index, or "mean" over heads.
    """
    pattern_a, pattern_b = np.asarray(pattern_a), np.asarray(pattern_b)
    if pattern_a.ndim != 3 or pattern_a.shape[1:] != pattern_b.shape[1:]:
        raise ValueError("attention_heatmaps needs two [head, query, key] patterns of one sequence")
    T = pattern_a.shape[-1]
    labels = str_tokens or [str(i) for i in range(T)]
    if len(labels) != T:
        raise ValueError("str_tokens must have one label per token")
    # Plotly merges equal category labels; prefix the position to keep repeats apart.
    labels = [f"{i}:{s}" for i, s in enumerate(labels)] if str_tokens else labels
    fig = make_subplots(rows=1, cols=2, subplot_titles=list(names), horizontal_spacing=0.08)
    for col, pattern in enumerate((pattern_a, pattern_b), start=1):
        z = pattern.mean(0) if head == "mean" else pattern[int(head)]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=labels,
                y=labels,
                coloraxis="coloraxis",
                hovertemplate="query %{y}<br>key %{x}<br>attention %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_xaxes(title_text="key", row=1, col=col)
    fig.update_yaxes(title_text="query", row=1, col=1)
    head_txt = "mean over heads" if head == "mean" else f"head {head}"
    fig.update_layout(
        title=f"Attention at layer {layer} ({head_txt})",
        coloraxis={"colorscale": "Viridis", "cmin": 0.0, "cmax": 1.0},
        height=480,
    )
    return fig


def _error_bars(df: pd.DataFrame) -> dict:
    return {
        "type": "data",
        "symmetric": False,
        "array": (df["ci_high"] - df["mean"]).tolist(),
        "arrayminus": (df["mean"] - df["ci_low"]).tolist(),
    }


def _add_layer_traces(fig, table, row=None, col=None):
    per_layer = table[table["layer"] != "all"]
    colors = _colors(per_layer["ref"].unique())
    for (ref, split), df in per_layer.groupby(["ref", "split"], sort=False):
        df = df.assign(layer=df["layer"].astype(int)).sort_values("layer")
        fig.add_trace(
            go.Scatter(
                x=df["layer"],
                y=df["mean"],
                error_y=_error_bars(df),
                mode="lines+markers",
                name=f"{ref} ({split})",
                legendgroup=str(ref),
                line={"color": colors[ref], "dash": _SPLIT_DASH.get(split, "solid")},
            ),
            row=row,
            col=col,
        )


def _add_split_traces(fig, table, row=None, col=None, showlegend=True):
    overall = table[table["layer"] == "all"]
    for split, df in overall.groupby("split", sort=True):
        fig.add_trace(
            go.Bar(
                x=df["ref"],
                y=df["mean"],
                error_y=_error_bars(df),
                name=str(split),
                showlegend=showlegend,
            ),
            row=row,
            col=col,
        )


def layer_figure(table: pd.DataFrame, *, metric: str = "JSD") -> go.Figure:
    """Divergence to NoPE per layer, one line per (ref, split), 95% CI error bars."""
    fig = go.Figure()
    _add_layer_traces(fig, table)
    fig.update_layout(
        title=f"{metric} to NoPE per layer", xaxis_title="layer", yaxis_title=metric, height=450
    )
    fig.update_xaxes(dtick=1)
    return fig


def split_bars(table: pd.DataFrame, *, metric: str = "JSD") -> go.Figure:
    """Mean over layers of the divergence to NoPE per ref, ID vs OOD bars, 95% CI."""
    fig = go.Figure()
    _add_split_traces(fig, table)
    fig.update_layout(
        title=f"{metric} to NoPE (mean over layers): ID vs OOD",
        barmode="group",
        yaxis_title=metric,
        height=450,
    )
    return fig


def comparison_figure(table: pd.DataFrame, *, metric: str = "JSD") -> go.Figure:
    """Both views in one figure: per-layer lines (left) and ID vs OOD bars (right)."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("per layer", "mean over layers"), column_widths=[0.6, 0.4]
    )
    _add_layer_traces(fig, table, row=1, col=1)
    _add_split_traces(fig, table, row=1, col=2)
    fig.update_xaxes(title_text="layer", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text=metric, row=1, col=1)
    # the legend (a line per reference and split, two bars) below the plots, in rows: at the
    # side it outgrew the plot's height and scrolled, its last entries hidden
    fig.update_layout(
        title=f"Attention {metric} to NoPE",
        barmode="group",
        height=560,
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.15, "yanchor": "top"},
    )
    return fig


def distance_figure(profile: pd.DataFrame, *, layer="all", max_distance: int | None = None):
    """Attention mass per distance n - m, one line per model (`distance_profile` frame)."""
    df = profile[profile["layer"].astype(str) == str(layer)]
    if max_distance is not None:
        df = df[df["distance"] <= max_distance]
    fig = go.Figure()
    colors = _colors(df["model"].unique())
    for name, g in df.groupby("model", sort=False):
        fig.add_trace(
            go.Scatter(
                x=g["distance"],
                y=g["mass"],
                mode="lines+markers",
                name=str(name),
                line={"color": colors[name]},
            )
        )
    where = "mean over layers" if str(layer) == "all" else f"layer {layer}"
    fig.update_layout(
        title=f"Attention mass by distance n - m ({where}, mean over heads and rows)",
        xaxis_title="distance (query - key)",
        yaxis_title="attention mass",
        height=420,
    )
    return fig
