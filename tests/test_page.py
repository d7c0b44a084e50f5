"""nopeinterp.viz.page: one offline page, plotly.js once, verdicts, TOC, collapsed tables."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pandas as pd
import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from nopeinterp.errors import NopeinterpError
from nopeinterp.results import Result
from nopeinterp.viz.page import COLLAPSE_ROWS, Page


class _Outline(HTMLParser):
    """Sequence of (tag, attrs, text) for the tags a page's structure is made of."""

    KEEP = {"section", "h2", "p", "details", "summary", "table", "a", "div", "nav"}

    def __init__(self):
        super().__init__()
        self.items, self._open = [], None

    def handle_starttag(self, tag, attrs):
        if tag in self.KEEP:
            self.items.append([tag, dict(attrs), ""])
            self._open = self.items[-1]

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag):
        self._open = None


def _outline(text):
    p = _Outline()
    p.feed(text)
    return p.items


def _fig(y):
    return go.Figure(go.Scatter(y=y))


def _page():
    short = pd.DataFrame({"pe": ["nope", "t5"], "acc": [0.5, 0.25]})
    long = pd.DataFrame({"length": range(COLLAPSE_ROWS + 5), "acc": 0.5})
    page = Page("Main job")
    (
        page.section("Length generalization", verdict="NoPE ahead OOD")
        .add(_fig([1, 2]))
        .add(short)
        .add(long, caption="per length")
        .section("Theorem 1", verdict="position decodable at layer 1")
        .add(_fig([3, 1]))
        .text("a <b> note")
        .section("Theorem 1")  # same title: gets its own anchor
        .add(_fig([2, 2]))
    )
    return page


def test_plotlyjs_is_embedded_once_whatever_the_number_of_figures():
    text = _page().html()
    js = get_plotlyjs()
    assert text.count(js[:2000]) == 1 and text.count(js[-2000:]) == 1
    assert len(text) < len(js) + 200_000
    ids = re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', text)
    assert ids == ["fig-1", "fig-2", "fig-3"]
    for gid in ids:
        assert re.search(r'Plotly\.newPlot\(\s*"' + gid + '"', text)
    rest = text.replace(js, "")  # plotly.js itself names its CDN (topojson); the page must not
    assert "cdn.plot.ly" not in rest and "<script src=" not in rest


def test_each_section_starts_with_its_verdict_and_the_toc_links_every_section():
    items = _outline(_page().html())
    sections = [(i, a["id"]) for i, (t, a, _) in enumerate(items) if t == "section"]
    assert [s for _, s in sections] == ["length-generalization", "theorem-1", "theorem-1-2"]
    for i, _ in sections:
        assert items[i + 1][0] == "h2"
    first, second = sections[0][0], sections[1][0]
    assert items[first + 2][0] == "p" and items[first + 2][1]["class"] == "verdict"
    assert items[first + 2][2] == "NoPE ahead OOD"
    assert items[second + 2][2] == "position decodable at layer 1"
    assert items[sections[2][0] + 2][0] != "p"  # no verdict given, none drawn
    toc = [a["href"] for t, a, _ in items if t == "a"]
    assert toc == ["#length-generalization", "#theorem-1", "#theorem-1-2"]


def test_long_tables_are_collapsed_short_ones_are_not_and_text_is_escaped():
    text = _page().html()
    assert text.count("<details>") == 1
    assert f"<summary>per length ({COLLAPSE_ROWS + 5} rows)</summary>" in text
    details = text[text.index("<details>") : text.index("</details>")]
    assert details.count("<tr") == COLLAPSE_ROWS + 5 + 1  # rows + header
    before = text[: text.index("<details>")]
    assert "<td>nope</td>" in before  # the short table is shown as is
    assert "<p>a &lt;b&gt; note</p>" in text


def test_a_result_adds_its_figure_and_every_table():
    class Two(Result):
        name = "two"
        extra_tables = ("per_layer",)

        def __init__(self):
            super().__init__(pd.DataFrame({"a": [1.5]}), {})
            self.per_layer = pd.DataFrame({"layer": range(40), "v": 0.0})

    text = Page("r").section("s").add(Two()).page.html()
    assert len(re.findall(r'class="plotly-graph-div"', text)) == 1
    assert "<p><em>two</em></p>" in text and "<summary>two_per_layer (40 rows)" in text


def test_write_is_atomic_deterministic_and_respects_the_size_limit(tmp_path):
    page = _page()
    out = page.write(tmp_path / "sub" / "index.html")
    assert out.read_text(encoding="utf-8") == page.html() == _page().html()
    assert sorted(p.name for p in out.parent.iterdir()) == ["index.html"]
    out.write_text("old")
    with pytest.raises(NopeinterpError, match="over the"):
        page.write(out, max_bytes=len(get_plotlyjs()))  # plotly.js alone fills the budget
    assert out.read_text() == "old"
    assert sorted(p.name for p in out.parent.iterdir()) == ["index.html"]


def test_unknown_items_are_refused_with_a_clear_error():
    with pytest.raises(NopeinterpError, match="cannot add a int"):
        Page("x").section("s").add(3)
