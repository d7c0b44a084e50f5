"""The HTML reports render in a real browser, offline: headless Chromium, networking blocked.

Each report is opened with `chromium --headless --dump-dom`; plotly draws its SVG into the
DOM, so the dumped DOM shows whether every figure rendered. Console messages (including
uncaught exceptions) go to stderr with `--enable-logging=stderr`; Chromium logs every page
console message there at INFO level whatever its level, so any console line fails the check
(the reports log nothing when they work). Network: every host resolves to NOTFOUND and every
request, loopback included, goes to a dead proxy, so a page that needs a CDN cannot render.
Negative controls: plotly.js from the CDN, and from a live server on loopback, must fail.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import subprocess
import threading
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from nopeinterp import build_model, load_checkpoint, save_checkpoint
from nopeinterp.evaluation import evaluate
from nopeinterp.probing.position import probe_position
from nopeinterp.similarity.compare import compare_attention
from nopeinterp.tasks import get_task, task_tokenizer

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed; .ci/run installs it"
)

TASK_OPTIONS = {"id_lengths": [2, 3], "ood_lengths": [4, 5]}
NO_NETWORK = [
    "--proxy-server=127.0.0.1:9",  # nothing listens on the discard port
    "--proxy-bypass-list=<-loopback>",  # ... and loopback goes through the proxy too
    "--host-resolver-rules=MAP * ~NOTFOUND",
]
CDN_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8">
<script src="{src}"></script></head><body>
<div id="g" class="plotly-graph-div"></div>
<script>Plotly.newPlot("g", [{{"y": [1, 3, 2]}}]);</script>
</body></html>"""
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
         "track", "wbr"}  # fmt: skip
_CONSOLE = re.compile(r"CONSOLE[:(]\d+|Uncaught")


class _Graphs(HTMLParser):
    """Every plotly graph div in a DOM: id -> whether an svg.main-svg is inside it."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str | None]] = []  # (tag, graph id if a graph div)
        self.graphs: dict[str, bool] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        graph = None
        if "plotly-graph-div" in classes:
            graph = attrs.get("id") or f"<no id #{len(self.graphs)}>"
            self.graphs[graph] = False
        if tag == "svg" and "main-svg" in classes:
            for _, g in self.stack:
                if g is not None:
                    self.graphs[g] = True
        if tag not in _VOID:
            self.stack.append((tag, graph))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a directory; records request paths in `seen` instead of logging them."""

    def __init__(self, *args, seen: list, **kwargs):
        self.seen = seen
        super().__init__(*args, **kwargs)

    def log_message(self, format, *args):
        self.seen.append(self.path)


def _figure_ids(source: str) -> list[str]:
    """Ids of the figures the page's source draws: a graph div plus its Plotly.newPlot call."""
    ids = re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', source)
    for gid in ids:
        assert re.search(r'Plotly\.newPlot\(\s*"' + re.escape(gid) + '"', source), gid
    return ids


def _render(
    path: Path, profile: Path, *, block_network: bool = True, width: int | None = None
) -> tuple[str, list[str]]:
    """(dumped DOM, console lines) of `path` in headless Chromium (`width`: of the window)."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *(NO_NETWORK if block_network else []),
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=10000",
        *([f"--window-size={width},2000"] if width else []),
        "--dump-dom",
        path.resolve().as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "</html>" in proc.stdout, f"no DOM dumped; stderr:\n{proc.stderr[-3000:]}"
    return proc.stdout, [line for line in proc.stderr.splitlines() if _CONSOLE.search(line)]


def screenshot(path: Path, png: Path, profile: Path, *, width=1300, height=6000) -> Path:
    """A PNG of `path` in headless Chromium (networking blocked), `width` x `height` pixels;
    for a person to look at (the layout checks are the DOM probes)."""
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--hide-scrollbars", f"--user-data-dir={profile}", *NO_NETWORK,
        "--virtual-time-budget=10000", f"--window-size={width},{height}",
        f"--screenshot={png}", path.resolve().as_uri(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace", timeout=180)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-3000:]
    return png


def _problems(path: Path, profile: Path, **kwargs) -> list[str]:
    """What is wrong with `path` in the browser; [] if every figure rendered cleanly."""
    expected = _figure_ids(path.read_text(encoding="utf-8"))
    dom, console = _render(path, profile, **kwargs)
    parser = _Graphs()
    parser.feed(dom)
    parser.close()
    problems = [f"console: {line}" for line in console]
    if not expected:
        problems.append("the page has no figure")
    rendered = [g for g, ok in parser.graphs.items() if ok]
    problems += [f"figure {g} has no svg.main-svg" for g in parser.graphs if not parser.graphs[g]]
    if sorted(rendered) != sorted(expected):
        problems.append(f"{len(rendered)} rendered graph divs, {len(expected)} figures in the page")
    return problems


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{name: (html path, number of figures it should have)} from tiny untrained models."""
    # conftest's one-thread fixture is function-scoped, so it has not run yet here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _make_reports(tmp_path_factory)
    finally:
        torch.set_num_threads(threads)


def _make_reports(tmp_path_factory):
    ckpts = tmp_path_factory.mktemp("ckpts")
    out = tmp_path_factory.mktemp("reports")
    tok = task_tokenizer(get_task("copy", **TASK_OPTIONS))
    paths = {}
    for name, pe, seed in [("nope", "nope", 0), ("nope1", "nope", 1), ("t5", "t5", 0),
                           ("alibi", "alibi", 0)]:  # fmt: skip
        model = build_model(pe, n_layers=2, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=32,
                            seed=seed, tokenizer=tok)  # fmt: skip
        paths[name] = save_checkpoint(model, ckpts / f"copy-{name}.pt", task="copy",
                                      task_options=TASK_OPTIONS, seed=seed)  # fmt: skip
    refs = {"t5": paths["t5"], "alibi": paths["alibi"]}
    result = compare_attention(paths["nope"], refs, nope_prime=paths["nope1"], n_per_length=2,
                               n_boot=50, progress=False)  # fmt: skip
    # per-layer + ID/OOD figures, one heatmap per ref (nope_prime too), the distance profile
    n_compare = 2 + len(result.example_patterns) - 1 + 1
    probe = probe_position(load_checkpoint(paths["t5"]), n_train=32, n_eval=16, progress=False)
    evaluation = evaluate(paths["alibi"], n=4, progress=False)
    return {
        "compare": (result.save(out / "compare")["html"], n_compare),
        "probe": (probe.save(out / "probe")["html"], 1),
        "evaluation": (evaluation.save(out / "evaluation")["html"], 1),
    }


@pytest.mark.parametrize("name", ["compare", "probe", "evaluation"])
def test_report_renders_offline(reports, name, tmp_path):
    path, n_figures = reports[name]
    assert len(_figure_ids(path.read_text(encoding="utf-8"))) == n_figures
    assert _problems(path, tmp_path / "profile") == []


def test_check_fails_when_plotly_comes_from_the_network(tmp_path):
    from plotly.offline import get_plotlyjs

    cdn = tmp_path / "cdn.html"
    cdn.write_text(CDN_PAGE.format(src="https://cdn.plot.ly/plotly-2.35.2.min.js"))
    problems = _problems(cdn, tmp_path / "p-cdn")
    assert any("has no svg.main-svg" in p for p in problems), problems
    assert any("Plotly is not defined" in p for p in problems), problems

    # Without internet the CDN control cannot tell the block from the lack of a network: a
    # live server on loopback, serving plotly.js, must get no request and the check must fail.
    site = tmp_path / "site"
    site.mkdir()
    (site / "plotly.min.js").write_text(get_plotlyjs(), encoding="utf-8")
    requests = []
    handler = functools.partial(_QuietHandler, directory=str(site), seen=requests)
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://localhost:{server.server_address[1]}/plotly.min.js"
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with direct.open(url, timeout=10) as response:  # the server is live
                assert response.status == 200
            assert len(requests) == 1
            page = tmp_path / "loopback.html"
            page.write_text(CDN_PAGE.format(src=url))
            problems = _problems(page, tmp_path / "p-loopback")
            assert any("has no svg.main-svg" in p for p in problems), problems
            assert len(requests) == 1, requests  # Chromium never reached it
        finally:
            server.shutdown()
