"""Language-model figures: loss against position (training context marked) and the passkey
length x depth heat map."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopeinterp.viz.legend import Legend

POSITION_BINS = 64  # points per line: positions are averaged in this many equal bins


def binned(rows, bins: int = POSITION_BINS):
    """(bin centre, mean loss weighted by n) of one model's rows at one length."""
    rows = rows[rows["n"] > 0]
    width = max(1, -(-int(rows["position"].max()) // bins))
    key = (rows["position"] - 1) // width
    w = rows["loss"] * rows["n"]
    g = rows.assign(w=w, key=key).groupby("key")
    centre = g["position"].mean()
    return centre.to_numpy(), (g["w"].sum() / g["n"].sum()).to_numpy()


def loss_by_position_figure(table, contexts: dict | None = None, *, title=None) -> go.Figure:
    """`table`: LMEvalResult.table (model, length, position, loss, n). One line per model at
    its longest evaluated length (positions averaged in bins); a dashed line at each training
    context (the first position never seen in training)."""
    fig = go.Figure()
    legend = Legend()
    for model, rows in table.groupby("model", sort=False):
        longest = rows[rows["length"] == rows["length"].max()]
        x, y = binned(longest)
        fig.add_trace(
            go.Scatter(
                x=x, y=y, mode="lines", line_color=legend.color(model), **legend.entry(str(model))
            )
        )
    for context in sorted({c for c in (contexts or {}).values() if c}):
        fig.add_vline(
            x=context,
            line_dash="dash",
            line_color="gray",
            annotation_text=f"training context {context}",
            annotation_position="top right",
        )
    fig.update_xaxes(title_text="position in the window (tokens of context)")
    fig.update_yaxes(title_text="mean loss (nats)")
    fig.update_layout(title=title or "Loss by position", height=420)
    return fig


def passkey_figure(table, *, title=None) -> go.Figure:
    """`table`: LMEvalResult.passkey (model, length, depth, accuracy): one heat map per model,
    evaluated length across, key depth down."""
    models = list(dict.fromkeys(table["model"]))
    fig = make_subplots(
        rows=1, cols=len(models), subplot_titles=[str(m) for m in models], shared_yaxes=True
    )
    for col, model in enumerate(models, start=1):
        grid = table[table["model"] == model].pivot(
            index="depth", columns="length", values="accuracy"
        )
        fig.add_trace(
            go.Heatmap(
                z=grid.to_numpy(),
                x=[str(c) for c in grid.columns],
                y=[f"{d:g}" for d in grid.index],
                zmin=0,
                zmax=1,
                colorscale="Viridis",
                showscale=col == len(models),
                text=grid.round(2).to_numpy(),
                texttemplate="%{text}",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="length (tokens)", type="category", row=1, col=col)
    fig.update_yaxes(title_text="depth of the key", type="category", row=1, col=1)
    fig.update_layout(title=title or "Passkey retrieval accuracy", height=380)
    return fig
