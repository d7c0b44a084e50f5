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
        }
    )
    assert length_verdict(summary) == (
        "copy: NoPE OOD exact match 0.40, rank 2 of 2 PEs (best t5 0.60)"
    )
    summary.loc[0, "accuracy"] = 0.9
    assert "rank 1 of 2 PEs (best nope 0.90)" in length_verdict(summary)
    ranking = pd.DataFrame(
        {
            "split": ["OOD", "OOD", "ID"],
            "rank": [2, 1, 1],
            "ref": ["t5", "alibi", "t5"],
            "mean": [0.3, 0.1, 0.2],
        }  # fmt: skip
    )
    assert similarity_verdict("scan", ranking).startswith(
        "scan, OOD, divergence from NoPE: alibi 0.100 < t5 0.300"
    )


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
