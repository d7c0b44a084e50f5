"""Plotly figures and self-contained (offline) HTML reports."""

from nopeinterp.viz.html import save_figure, write_report

__all__ = ["save_figure", "write_report"]
