"""One offline report page: a section per claim, a verdict line on top of each, plotly.js once.

    page = Page("nopeinterp: main job")
    (page.section("Length generalization", verdict="NoPE beats APE and Rotary OOD")
         .add(fig)                      # a plotly Figure
         .add(table)                    # a DataFrame; long tables are collapsed (<details>)
         .text("Models trained 2,000 steps.")
     .section("Theorem 1", verdict="...")
         .add(result))                  # a nopeinterp Result: its figure, then its tables
    page.write("reports/main/index.html")

Items are rendered when `write` (or `html`) is called, in the order added. A `str` item is
trusted HTML (use `text` for plain text); an `ExplorerData` becomes an attention explorer
(drawn by nopeinterp.viz.explorer). plotly.js is inlined once, in the head, whatever the number of
figures; figure divs get stable ids (`fig-1`, `fig-2`, ...) so the page is deterministic.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from nopeinterp.errors import NopeinterpError
from nopeinterp.viz.html import atomic_write_text

COLLAPSE_ROWS = 15  # tables longer than this are folded into a <details> element

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1250px;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
nav.toc ol{line-height:1.6} nav.toc .v{color:#555}
p.verdict{font-weight:600;background:#f3f6fb;border-left:4px solid #4a78c2;padding:.5em .8em}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:right}
details{margin:.5em 0} summary{cursor:pointer;color:#345}
.explorer .controls{display:flex;flex-wrap:wrap;gap:1em;margin:.5em 0}
.explorer .panels{display:flex;flex-wrap:wrap;gap:1em}
.explorer .panels>div{flex:1 1 480px;min-height:420px}
"""


def _slug(text: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    slug, i = base, 2
    while slug in taken:
        slug, i = f"{base}-{i}", i + 1
    taken.add(slug)
    return slug


def table_html(df: pd.DataFrame, *, collapse_rows: int = COLLAPSE_ROWS, caption=None) -> str:
    """A DataFrame as an HTML table; folded into <details> when it has more than
    `collapse_rows` rows (the summary line says how many)."""
    # a named column axis (a pivot's "split", "column") would get a header cell of its own
    # over an empty first column: its values are the headers already
    df = df.rename_axis(columns=[None] * df.columns.nlevels)
    body = df.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
    label = html.escape(caption) if caption else "Table"
    if len(df) <= collapse_rows:
        return (f"<p><em>{label}</em></p>" if caption else "") + body
    return f"<details><summary>{label} ({len(df)} rows)</summary>{body}</details>"


@dataclass
class Section:
    """One section of a Page: a heading, an optional verdict line, then items in order."""

    page: Page
    title: str
    verdict: str | None = None
    items: list = field(default_factory=list)

    def add(self, item, *, caption: str | None = None) -> Section:
        """Add a Figure, DataFrame, Result, ExplorerData or (trusted) HTML string."""
        from nopeinterp.results import ExplorerData, Result

        if not isinstance(item, go.Figure | pd.DataFrame | Result | ExplorerData | str):
            raise NopeinterpError(
                f"cannot add a {type(item).__name__} to a page; expected a plotly Figure, "
                "a DataFrame, a Result, an ExplorerData or an HTML string"
            )
        self.items.append((item, caption))
        return self

    def text(self, text: str) -> Section:
        """A paragraph of plain text (escaped)."""
        return self.add(f"<p>{html.escape(text)}</p>")

    def section(self, title: str, verdict: str | None = None) -> Section:
        """Start the page's next section (lets calls chain)."""
        return self.page.section(title, verdict=verdict)


class Page:
    """An offline HTML page built from sections; see the module docstring."""

    def __init__(self, title: str, *, intro: str | None = None, collapse_rows=COLLAPSE_ROWS):
        self.title = title
        self.intro = intro
        self.collapse_rows = collapse_rows
        self.sections: list[Section] = []

    def section(self, title: str, verdict: str | None = None) -> Section:
        s = Section(self, title, verdict)
        self.sections.append(s)
        return s

    # -- rendering -----------------------------------------------------------------------
    def _render_item(self, item, caption, next_id) -> str:
        from nopeinterp.results import ExplorerData, Result
        from nopeinterp.viz.explorer import explorer_html

        parts = [f"<p><em>{html.escape(caption)}</em></p>"] if caption else []
        if isinstance(item, go.Figure):
            parts.append(
                pio.to_html(item, include_plotlyjs=False, full_html=False, div_id=next_id("fig"))
            )
        elif isinstance(item, pd.DataFrame):
            parts = [table_html(item, collapse_rows=self.collapse_rows, caption=caption)]
        elif isinstance(item, Result):
            fig = item.figure()
            parts.append(
                pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=next_id("fig"))
            )
            for name, df in item.tables().items():
                parts.append(table_html(df, collapse_rows=self.collapse_rows, caption=name))
        elif isinstance(item, ExplorerData):
            parts.append(explorer_html(item, element_id=next_id("explorer")))
        else:
            parts.append(item)
        return "\n".join(parts)

    def html(self) -> str:
        """The whole page as one string (plotly.js inlined once)."""
        from plotly.offline import get_plotlyjs

        counters: dict[str, int] = {}

        def next_id(kind: str) -> str:
            counters[kind] = counters.get(kind, 0) + 1
            return f"{kind}-{counters[kind]}"

        taken: set[str] = set()
        anchors = [_slug(s.title, taken) for s in self.sections]
        esc = html.escape
        toc = "".join(
            f"<li><a href='#{a}'>{esc(s.title)}</a>"
            + (f" <span class='v'>: {esc(s.verdict)}</span>" if s.verdict else "")
            + "</li>"
            for a, s in zip(anchors, self.sections, strict=True)
        )
        body = []
        for anchor, s in zip(anchors, self.sections, strict=True):
            body.append(f"<section id='{anchor}'><h2>{esc(s.title)}</h2>")
            if s.verdict:
                body.append(f"<p class='verdict'>{esc(s.verdict)}</p>")
            body.extend(self._render_item(item, cap, next_id) for item, cap in s.items)
            body.append("</section>")
        return "\n".join(
            [
                "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
                f"<title>{esc(self.title)}</title><style>{_STYLE}</style>",
                f"<script type='text/javascript'>{get_plotlyjs()}</script>",
                f"</head><body><h1>{esc(self.title)}</h1>",
                f"<p>{esc(self.intro)}</p>" if self.intro else "",
                f"<nav class='toc'><h2>Contents</h2><ol>{toc}</ol></nav>" if self.sections else "",
                *body,
                "</body></html>",
            ]
        )

    def write(self, path: str | os.PathLike, *, max_bytes: int | None = None) -> Path:
        """Write the page atomically; with `max_bytes`, refuse (NopeinterpError, nothing
        written) a page larger than that."""
        text = self.html()
        size = len(text.encode("utf-8"))
        if max_bytes is not None and size > max_bytes:
            raise NopeinterpError(
                f"report page {self.title!r} would be {size / 2**20:.1f} MiB, over the "
                f"{max_bytes / 2**20:.1f} MiB limit; not written"
            )
        return atomic_write_text(path, text)
