"""nopeinterp.viz.legend: one colour per key and one legend entry per label across panels."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopeinterp.viz.legend import Legend


def test_legend_shows_each_label_once_and_keeps_colours_per_key():
    legend = Legend(["a", "b"], palette=["red", "blue", "green"])
    assert (legend.color("b"), legend.color("a"), legend.color("c")) == ("blue", "red", "green")
    assert legend.color("d") == "red"  # the palette cycles
    fig = make_subplots(rows=1, cols=2)
    for col in (1, 2):
        for label in ("a", "a [random_init]"):
            fig.add_trace(go.Scatter(x=[0], y=[col], **legend.entry(label)), row=1, col=col)
    shown = [(t.name, t.showlegend, t.legendgroup) for t in fig.data]
    assert shown == [
        ("a", True, "a"),
        ("a [random_init]", True, "a [random_init]"),
        ("a", False, "a"),
        ("a [random_init]", False, "a [random_init]"),
    ]
