"""One colour per model and one legend entry per label across the panels of a figure."""

from __future__ import annotations


class Legend:
    """Colours by key (in order of first use, from ``palette``) and legend entries by label:
    a label's first trace shows in the legend, its later ones (other panels) join its group,
    so clicking the entry hides the line in every panel."""

    def __init__(self, keys=(), palette=None):
        from plotly.colors import qualitative

        self.palette = list(palette or qualitative.Plotly)
        self.colors: dict = {}
        self.shown: set = set()
        for key in keys:
            self.color(key)

    def color(self, key) -> str:
        return self.colors.setdefault(key, self.palette[len(self.colors) % len(self.palette)])

    def entry(self, label: str) -> dict:
        """``name``, ``legendgroup`` and ``showlegend`` of a trace labelled ``label``."""
        first = label not in self.shown
        self.shown.add(label)
        return {"name": label, "legendgroup": label, "showlegend": first}

    def line(self, label: str, x, y):
        """A lines-and-markers trace of `label` in its colour, with its legend entry."""
        import plotly.graph_objects as go

        return go.Scatter(
            x=x, y=y, mode="lines+markers", line_color=self.color(label), **self.entry(label)
        )
