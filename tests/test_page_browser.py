"""The demo report page (nopeinterp.demo) in headless Chromium, networking blocked.

Reuses test_report_browser's runner (`--dump-dom`, console lines on stderr, every host
unresolvable, every request through a dead proxy). Interaction is checked without a driver:
a copy of the page gets a probe script appended that changes the explorer's selects exactly as
a user would (set the value, dispatch "change") and writes what the heatmap shows before and
after into the DOM, which the dump then carries back.
"""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from test_report_browser import CHROMIUM, _Graphs, _render

from nopeinterp.demo import demo_page
from nopeinterp.results import ExplorerData

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed; .ci/run installs it"
)

PROBE = """<script>
window.addEventListener("load", function () {
  var root = document.querySelector(".explorer"), log = [];
  function state(side) {
    var gd = document.getElementById(root.id + "-" + side), img = gd.querySelector("image");
    return {z: gd.data[0].z, x: gd.data[0].x, title: gd.layout.title.text,
            img: img ? img.getAttribute("href") : null};
  }
  function choose(key, value) {
    var s = root.querySelector("select[data-k=" + key + "]");
    s.value = value;
    s.dispatchEvent(new Event("change"));
  }
  var steps = [[null, null], ["head", "1"], ["example", "2"], ["ref", "alibi"]];
  (function next(i) {
    if (i === steps.length) {
      var out = document.createElement("pre");
      out.id = "probe";
      out.textContent = JSON.stringify(log);
      document.body.appendChild(out);
      return;
    }
    if (steps[i][0]) choose(steps[i][0], steps[i][1]);
    setTimeout(function () { log.push({a: state("a"), b: state("b")}); next(i + 1); }, 400);
  })(0);
});
</script></body></html>"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = demo_page(tmp_path_factory.mktemp("demo") / "index.html")
    finally:
        torch.set_num_threads(threads)
    source = path.read_text(encoding="utf-8")
    blob = re.search(r"<script type='application/json' id='explorer-1-data'>(.*?)</script>",
                     source, re.S).group(1)  # fmt: skip
    return path, source, ExplorerData.from_json(blob)


def test_demo_page_renders_every_figure_offline(demo, tmp_path):
    path, source, _ = demo
    assert path.stat().st_size < 8 * 2**20
    dom, console = _render(path, tmp_path / "profile")
    assert console == []
    graphs = _Graphs()
    graphs.feed(dom)
    graphs.close()
    # the line figure plus the explorer's two heatmaps, each with plotly's svg inside
    assert sorted(graphs.graphs) == ["explorer-1-a", "explorer-1-b", "fig-1"]
    assert all(graphs.graphs.values()), graphs.graphs
    assert "<details><summary>accuracy by model and length (18 rows)" in source


def _same(z, expected: np.ndarray) -> bool:
    got = np.array([[np.nan if v is None else v for v in row] for row in z], dtype=float)
    return got.shape == expected.shape and np.allclose(got, expected, equal_nan=True, atol=1e-9)


def test_explorer_controls_redraw_the_heatmaps(demo, tmp_path):
    path, source, data = demo
    probed = tmp_path / "probed.html"
    probed.write_text(source.replace("</body></html>", PROBE), encoding="utf-8")
    dom, console = _render(probed, tmp_path / "profile")
    assert console == []
    log = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    start, head1, ex2, alibi = log
    layer = data.layers[0]
    # start: NoPE on the left, T5 beside it, layer 0 head 0 example 0, drawn from the data
    assert start["a"]["title"] == f"nope: layer {layer}, head 0"
    assert start["b"]["title"] == f"t5: layer {layer}, head 0"
    assert _same(start["a"]["z"], data.pattern("nope", layer, 0, 0))
    assert _same(start["b"]["z"], data.pattern("t5", layer, 0, 0))
    assert start["b"]["x"] == [f"{i}:{t}" for i, t in enumerate(data.tokens[0])]
    # another head: both panels show head 1 and the drawn image changes
    assert _same(head1["b"]["z"], data.pattern("t5", layer, 1, 0))
    assert _same(head1["a"]["z"], data.pattern("nope", layer, 1, 0))
    assert head1["b"]["img"] and head1["b"]["img"] != start["b"]["img"]
    assert head1["a"]["img"] != start["a"]["img"]
    # another example: the tokens on the axes follow
    assert ex2["b"]["x"] == [f"{i}:{t}" for i, t in enumerate(data.tokens[2])]
    assert ex2["b"]["x"] != start["b"]["x"]
    assert _same(ex2["b"]["z"], data.pattern("t5", layer, 1, 2))
    # another reference model on the right; NoPE stays on the left
    assert alibi["b"]["title"].startswith("alibi:") and alibi["a"]["title"].startswith("nope:")
    assert _same(alibi["b"]["z"], data.pattern("alibi", layer, 1, 2))
