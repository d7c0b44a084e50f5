"""Offline HTML output: plotly.js is embedded once per file, never fetched from a CDN."""

from __future__ import annotations

import html
import os
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from nopeinterp._io import atomic_write_text  # re-exported: callers import it from here


def save_figure(fig: go.Figure, path: str | os.PathLike) -> Path:
    """One figure as a standalone HTML file that works offline."""
    return atomic_write_text(path, pio.to_html(fig, include_plotlyjs=True, full_html=True))


def write_report(path: str | os.PathLike, title: str, sections) -> Path:
    """A self-contained HTML report.

    `sections`: iterable of (heading, item) with item a plotly Figure, a DataFrame (rendered
    as a table) or a str (HTML). plotly.js is inlined once, at the top.
    """
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
        "font-size:13px;text-align:right}</style>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script>",
        f"</head><body><h1>{html.escape(title)}</h1>",
    ]
    for heading, item in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if isinstance(item, go.Figure):
            parts.append(pio.to_html(item, include_plotlyjs=False, full_html=False))
        elif isinstance(item, pd.DataFrame):
            parts.append(item.to_html(index=False, float_format=lambda v: f"{v:.4g}"))
        else:
            parts.append(str(item))
    parts.append("</body></html>")
    return atomic_write_text(path, "\n".join(parts))
