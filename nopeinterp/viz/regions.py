"""Attention mass by region: one stacked bar per layer and region of the generated token."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopeinterp.tasks.scratchpad import REGIONS as ORDER
from nopeinterp.viz.legend import Legend


def region_figure(by_layer, title="Attention mass by region while generating") -> go.Figure:
    """`by_layer`: RegionResult.by_layer. One panel per (model, split); within it, bars per
    (layer, region of the generated token), stacked by the region of the attended keys."""
    panels = list(dict.fromkeys(zip(by_layer["model"], by_layer["split"], strict=True)))
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        subplot_titles=[f"{m} | {s}" for m, s in panels],
        shared_xaxes=False,
        vertical_spacing=0.25 / max(len(panels), 1),
    )
    legend = Legend()
    keys = [r for r in ORDER if r in set(by_layer["key_region"])]
    for row, (model, split) in enumerate(panels, start=1):
        t = by_layer[(by_layer["model"] == model) & (by_layer["split"] == split)]
        queries = [q for q in ORDER if q in set(t["query_region"])]
        x = [
            [f"layer {layer}" for layer in sorted(set(t["layer"])) for _ in queries],
            [q for _ in sorted(set(t["layer"])) for q in queries],
        ]
        for key in keys:
            k = t[t["key_region"] == key].set_index(["layer", "query_region"])["mass"]
            y = [k.get((layer, q), 0.0) for layer in sorted(set(t["layer"])) for q in queries]
            fig.add_trace(
                go.Bar(x=x, y=y, marker_color=legend.color(key), **legend.entry(key)),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text="attention mass", range=[0, 1], row=row, col=1)
    fig.update_layout(
        barmode="stack",
        title=title,
        legend_title_text="attended region",
        height=320 * len(panels) + 80,
    )
    return fig
