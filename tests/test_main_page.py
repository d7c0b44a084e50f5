"""The main job's page (`nopeinterp report`), run as a user runs it: a subprocess whose output
goes to a pipe (a log), on the tiny checkpoint zoo of conftest.

- the log has progress lines but no carriage-return frames; --quiet removes the progress lines;
- index.html in headless Chromium, networking blocked (test_report_browser's runner): every
  figure draws, the explorer's heatmaps draw, choosing another head changes the heatmap, no
  console message, under 8 MB.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from nopeinterp.main_job import PAGE_MAX_BYTES, length_verdict, similarity_verdict
from nopeinterp.results import ExplorerData

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("NOPEINTERP_QUIET", None)
    return subprocess.run(
        [sys.executable, "-m", "nopeinterp.cli", *args],
        capture_output=True,  # pipes: what `make main 2>&1 | cat` or a CI log sees
        env=env,
        timeout=900,
    )


@pytest.fixture(scope="module")
def report(ckpt_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("main")
    proc = _cli("report", "--checkpoints", str(ckpt_dir), "--out", str(out), "--n", "2",
                "--n-attention", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return out / "index.html", proc.stdout + proc.stderr


def test_report_log_has_progress_lines_and_no_carriage_returns(report):
    _, log = report
    assert b"\r" not in log
    text = log.decode()
    # each analysis reported its progress as plain lines ending in "done"
    for desc in ("eval copy-nope", "attention divergence"):
        assert re.search(rf"^{re.escape(desc)}: \d+/\d+ .* done ", text, re.M), desc


def test_quiet_flag_silences_progress(ckpt_dir):
    ckpt = str(ckpt_dir / "copy-nope.pt")
    loud = _cli("eval", ckpt, "--n", "2")
    quiet = _cli("--quiet", "eval", ckpt, "--n", "2")
    assert loud.returncode == quiet.returncode == 0
    assert b"eval copy-nope:" in loud.stderr
    assert quiet.stderr == b""
    assert quiet.stdout == loud.stdout  # the results themselves are unchanged


def test_verdicts_follow_the_numbers():
    import pandas as pd

    summary = pd.DataFrame(
        {
            "task": ["copy"] * 3,
            "pe": ["nope", "t5", "ape"],
            "seed": [0, 0, 0],
            "split": ["OOD"] * 3,
            "accuracy": [0.4, 0.6, float("nan")],
            "n": [200, 200, 0],
        }
    )
    assert length_verdict(summary) == (
        "Not supported on these checkpoints: NoPE generalizes to longer inputs better than the "
        "other PEs. copy: NoPE OOD exact match 0.40, rank 2 of 2 PEs (best t5 0.60)"
    )
    summary.loc[0, "accuracy"] = 0.9
    assert length_verdict(summary).startswith("Supported on these checkpoints: ")
    assert "rank 1 of 2 PEs (best nope 0.90)" in length_verdict(summary)
    summary.loc[0, "accuracy"] = 0.55  # within two standard errors of t5's 0.60 on 200 items
    assert length_verdict(summary).startswith("Inconclusive on these checkpoints: ")
    summary.loc[:, "accuracy"] = [0.01, 0.02, float("nan")]  # no PE generalizes at all
    assert length_verdict(summary).startswith("Inconclusive")
    two = pd.concat([summary.assign(accuracy=[0.9, 0.1, None]), summary.assign(task="scan",
                     accuracy=[0.1, 0.9, None])])  # fmt: skip
    assert length_verdict(two).startswith("Inconclusive on these checkpoints (tasks disagree)")

    ranking = pd.DataFrame(
        {
            "split": ["OOD", "OOD", "OOD", "ID"],
            "rank": [1, 2, 3, 1],
            "ref": ["alibi", "nope_prime", "t5", "t5"],
            "mean": [0.1, 0.2, 0.3, 0.2],
            "ci_low": [0.08, 0.18, 0.28, 0.1],
            "ci_high": [0.12, 0.22, 0.32, 0.3],
        }  # fmt: skip
    )
    verdict = similarity_verdict("scan", ranking)
    assert verdict.startswith("Not supported on these checkpoints: NoPE's attention looks most")
    assert "scan, OOD, divergence from NoPE: alibi 0.100 < nope_prime 0.200 < t5 0.300" in verdict
    ranking.loc[2, ["rank", "mean", "ci_low", "ci_high"]] = [0, 0.05, 0.04, 0.06]
    assert similarity_verdict("scan", ranking).startswith("Supported on these checkpoints")
    ranking.loc[2, ["ci_low", "ci_high"]] = [0.0, 0.2]  # its CI overlaps alibi's
    assert similarity_verdict("scan", ranking).startswith("Inconclusive on these checkpoints")


def test_theorem_verdicts_follow_the_numbers():
    import pandas as pd

    from nopeinterp.main_job import distance_verdict, probe_verdict

    def probe(trained, random_init):
        return pd.DataFrame(
            [{"model": m, "layer": 1, "split": "ID", "metric": "r2", "value": v}
             for m, v in (("trained", trained), ("random_init", random_init))]
        )  # fmt: skip

    verdict = probe_verdict({"copy": probe(0.9, 0.2)})
    assert verdict == (
        "Supported on these checkpoints: NoPE's residual stream encodes absolute position (a "
        "linear probe recovers it, beyond an untrained model). copy: ID R2 0.90 (layer 1, "
        "random-init 0.20)"
    )
    assert probe_verdict({"copy": probe(0.3, 0.25)}).startswith("Not supported")
    assert probe_verdict({"copy": probe(0.9, 0.85)}).startswith("Inconclusive")
    # a degenerate control (NaN) is no control to beat
    verdict = probe_verdict({"copy": probe(0.9, float("nan"))})
    assert verdict.startswith("Inconclusive") and "random-init n/a" in verdict, verdict

    def distance(later, first):
        return pd.DataFrame(
            [{"task": "copy", "pe": "nope", "split": "OOD", "layer": layer, "max_score": v}
             for layer, v in ((0, first), (1, later))]
        )  # fmt: skip

    assert distance_verdict(distance(0.8, 0.1)).startswith("Supported")
    assert "best head distance R2 0.80 in layer 1 (OOD; layer 0: 0.10)" in distance_verdict(
        distance(0.8, 0.1)
    )
    assert distance_verdict(distance(0.15, 0.1)).startswith("Not supported")
    assert distance_verdict(distance(0.3, 0.1)).startswith("Inconclusive")


# -- the page in a browser ---------------------------------------------------------------------
PROBE = """<script>
window.addEventListener("load", function () {
  var root = document.querySelector(".explorer"), log = [];
  function state(side) {
    var gd = document.getElementById(root.id + "-" + side), img = gd.querySelector("image");
    return {z: gd.data[0].z, title: gd.layout.title.text,
            img: img ? img.getAttribute("href") : null};
  }
  setTimeout(function () {
    log.push({a: state("a"), b: state("b")});
    var s = root.querySelector("select[data-k=head]");
    s.value = "1";
    s.dispatchEvent(new Event("change"));
    setTimeout(function () {
      log.push({a: state("a"), b: state("b")});
      var out = document.createElement("pre");
      out.id = "probe";
      out.textContent = JSON.stringify(log);
      document.body.appendChild(out);
    }, 400);
  }, 400);
});
</script></body></html>"""


def _same(z, expected: np.ndarray) -> bool:
    got = np.array([[np.nan if v is None else v for v in row] for row in z], dtype=float)
    return got.shape == expected.shape and np.allclose(got, expected, equal_nan=True, atol=1e-9)


def test_index_page_renders_offline_and_explorer_responds(report, tmp_path):
    test_report_browser = pytest.importorskip("test_report_browser")
    if test_report_browser.CHROMIUM is None:
        pytest.skip("chromium not installed; .ci/run installs it")
    path, _ = report
    assert path.stat().st_size < PAGE_MAX_BYTES
    source = path.read_text(encoding="utf-8")
    figures = test_report_browser._figure_ids(source)
    assert len(figures) >= 4  # accuracy, probes, distance (2), similarity

    dom, console = test_report_browser._render(path, tmp_path / "profile")
    assert console == []
    graphs = test_report_browser._Graphs()
    graphs.feed(dom)
    graphs.close()
    assert sorted(graphs.graphs) == sorted([*figures, "explorer-1-a", "explorer-1-b"])
    assert all(graphs.graphs.values()), graphs.graphs

    blob = re.search(r"<script type='application/json' id='explorer-1-data'>(.*?)</script>",
                     source, re.S).group(1)  # fmt: skip
    data = ExplorerData.from_json(blob)
    probed = tmp_path / "probed.html"
    probed.write_text(source.replace("</body></html>", PROBE), encoding="utf-8")
    dom, console = test_report_browser._render(probed, tmp_path / "profile2")
    assert console == []
    start, head1 = json.loads(
        html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1))
    )
    layer = data.layers[0]
    assert start["a"]["title"] == f"nope: layer {layer}, head 0"
    assert _same(start["a"]["z"], data.pattern("nope", layer, 0, 0))
    assert _same(head1["a"]["z"], data.pattern("nope", layer, 1, 0))
    ref = start["b"]["title"].split(":")[0]
    assert _same(head1["b"]["z"], data.pattern(ref, layer, 1, 0))
    assert head1["a"]["img"] and head1["a"]["img"] != start["a"]["img"]
    assert head1["b"]["img"] != start["b"]["img"]


# Geometry of the drawn page: labels inside their figure, axis titles clear of the tick
# labels, titles clear of the mode bar, legends whole (no scroll bar).
LAYOUT_PROBE = """<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    var problems = [], checked = 0, titled = 0;
    function box(el) { return el.getBoundingClientRect(); }
    function overlap(a, b) {
      return a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 &&
             b.top < a.bottom - 1;
    }
    document.querySelectorAll(".js-plotly-plot").forEach(function (gd) {
      var svg = gd.querySelector(".main-svg"), s = box(svg), name = gd.id;
      checked++;
      gd.querySelectorAll(".xtick text, .ytick text").forEach(function (t) {
        var b = box(t);
        if (b.width && (b.left < s.left - 1 || b.right > s.right + 1 || b.bottom > s.bottom + 1))
          problems.push(name + ": tick label '" + t.textContent + "' cut");
      });
      gd.querySelectorAll(".g-xtitle text, .g-x2title text").forEach(function (title) {
        var tb = box(title);
        gd.querySelectorAll(".xtick text, .x2tick text").forEach(function (t) {
          if (box(t).width && overlap(tb, box(t)))
            problems.push(name + ": axis title '" + title.textContent + "' over tick labels");
        });
      });
      gd.querySelectorAll(".g-ytitle text").forEach(function (title) {
        var tb = box(title);
        gd.querySelectorAll(".ytick text").forEach(function (t) {
          if (box(t).width && overlap(tb, box(t)))
            problems.push(name + ": axis title '" + title.textContent + "' over tick labels");
        });
      });
      var bar = gd.querySelector(".modebar"), title = gd.querySelector(".g-gtitle text");
      if (bar && title && box(bar).width && box(title).width) titled++;
      if (bar && title && overlap(box(bar), box(title)))
        problems.push(name + ": title under the mode bar");
      gd.querySelectorAll(".legend .scrollbar").forEach(function (sb) {
        if (box(sb).height > 0) problems.push(name + ": legend scrolls (clipped)");
      });
    });
    var out = document.createElement("pre");
    out.id = "layout";
    out.textContent = JSON.stringify({checked: checked, titled: titled, problems: problems});
    document.body.appendChild(out);
  }, 800);
});
</script></body></html>"""


class _Tables(HTMLParser):
    """Each table's rows as lists of (tag, text) cells."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables, self.cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables:
            self.cell = [tag, ""]

    def handle_data(self, data):
        if self.cell is not None:
            self.cell[1] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append((self.cell[0], self.cell[1].strip()))
            self.cell = None


def test_page_layout_keeps_labels_whole(report, tmp_path):
    """Tables: one header cell per column, none blank. In the browser: the geometry probe
    finds no cut label, no axis title over tick labels, no title under the mode bar and no
    scrolling legend; a screenshot of the page is kept for a person to look at."""
    test_report_browser = pytest.importorskip("test_report_browser")
    path, _ = report
    source = path.read_text(encoding="utf-8")
    tables = _Tables()
    tables.feed(source)
    assert tables.tables
    for rows in tables.tables:
        header, *body = rows
        assert all(text for _, text in header), header  # no blank header cell
        assert all(len(row) == len(header) for row in body), (header, body[:1])
    if test_report_browser.CHROMIUM is None:
        pytest.skip("chromium not installed; .ci/run installs it")
    probed = tmp_path / "layout.html"
    probed.write_text(source.replace("</body></html>", LAYOUT_PROBE), encoding="utf-8")
    dom, console = test_report_browser._render(probed, tmp_path / "profile")
    assert console == []
    found = json.loads(html.unescape(re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)[1]))
    assert found["checked"] >= 6 and found["problems"] == [], found
    shot = test_report_browser.screenshot(path, tmp_path / "page.png", tmp_path / "profile3")
    assert shot.stat().st_size > 10_000


# SCAN's longest output tokens (the explorer labels them "<position>:<token>")
SCAN_LABELS = ["I_TURN_RIGHT", "I_TURN_LEFT", "I_WALK", "I_LOOK", "I_JUMP", "I_RUN", "[SEP]"]


def _layout_page(path: Path) -> Path:
    """A page with what cut labels on the old layout: an explorer over SCAN-length token
    labels, the similarity figure with six references (twelve legend entries and two bars),
    and a pivot whose column axis has a name."""
    import pandas as pd

    from nopeinterp.results import _encode
    from nopeinterp.viz.page import Page
    from nopeinterp.viz.similarity import comparison_figure

    rng = np.random.default_rng(0)
    tokens = ["<bos>"] + [SCAN_LABELS[i % 7] for i in range(1, 24)]
    T = len(tokens)

    def pattern():
        p = np.tril(rng.random((T, T)))
        return _encode(p / p.sum(1, keepdims=True))

    models = ["nope", "t5"]
    data = ExplorerData(
        models=models, layers=[0, 1], n_heads=2, tokens=[tokens], example_names=["scan OOD 0"],
        patterns={m: [[[pattern()] for _ in range(2)] for _ in range(2)] for m in models},
        left="nope", reference="t5",
    )  # fmt: skip
    rows = [
        {"ref": ref, "split": split, "layer": layer, "mean": m, "ci_low": m - 0.01,
         "ci_high": m + 0.01}
        for ref in ["t5", "alibi", "rotary", "abs_learned", "abs_sinusoidal", "nope_prime"]
        for split in ("ID", "OOD")
        for layer, m in [("0", 0.2), ("1", 0.3), ("2", 0.25), ("all", 0.25)]
    ]  # fmt: skip
    long = pd.DataFrame(
        [{"layer": layer, "split": s, "r2": 0.5} for layer in (0, 1) for s in ("ID", "OOD")]
    )
    pivot = long.pivot(index="layer", columns="split", values="r2").reset_index()
    page = Page("layout")
    page.section("Similarity").add(comparison_figure(pd.DataFrame(rows))).add(pivot)
    page.section("Explorer").add(data)
    return page.write(path)


def test_layout_probe_sees_long_labels_and_many_legend_entries(tmp_path):
    """The geometry probe on a page built to stress the layout (long SCAN labels, six
    references): no cut label, no title over ticks or under the mode bar, no scrolling
    legend, no blank header cell. On the layout before the fix this finds the problems."""
    test_report_browser = pytest.importorskip("test_report_browser")
    path = _layout_page(tmp_path / "page.html")
    source = path.read_text(encoding="utf-8")
    tables = _Tables()
    tables.feed(source)
    ((header, *body),) = tables.tables
    assert [text for _, text in header] == ["layer", "ID", "OOD"]
    assert all(len(row) == len(header) for row in body)
    if test_report_browser.CHROMIUM is None:
        pytest.skip("chromium not installed; .ci/run installs it")
    probed = tmp_path / "layout.html"
    probed.write_text(source.replace("</body></html>", LAYOUT_PROBE), encoding="utf-8")
    # as wide as a laptop's browser: the explorer's two panels side by side
    dom, console = test_report_browser._render(probed, tmp_path / "profile", width=1100)
    assert console == []
    found = json.loads(html.unescape(re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)[1]))
    # every figure checked, each title measured against its mode bar
    assert found["checked"] == found["titled"] == 3 and found["problems"] == [], found
