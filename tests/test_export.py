"""nopeinterp.viz.export: PNGs from plotly figures via kaleido and the system Chromium."""

from __future__ import annotations

import struct
import sys
import zlib

import plotly.graph_objects as go
import pytest

from nopeinterp.errors import NopeinterpError
from nopeinterp.viz.export import PngExportUnavailable, find_chromium, save_png, save_pngs

needs_chromium = pytest.mark.skipif(
    find_chromium() is None, reason="chromium not installed; .ci/run installs it"
)


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, checking the signature and the chunk CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16 : 16 + length]
    (crc,) = struct.unpack(">I", data[16 + length : 20 + length])
    assert crc == zlib.crc32(kind + body)
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"
    return struct.unpack(">II", body[:8])


def _fig():
    return go.Figure(go.Heatmap(z=[[0, 1, 2], [2, 1, 0]]), layout={"title": "t"})


@needs_chromium
def test_save_png_writes_a_valid_png_of_the_requested_size(tmp_path):
    out = save_png(_fig(), tmp_path / "figs" / "a.png", width=400, height=300)
    data = out.read_bytes()
    assert _png_size(data) == (400, 300)
    assert 2_000 < len(data) < 2_000_000  # a drawn figure, not an empty or raw image
    assert sorted(p.name for p in out.parent.iterdir()) == ["a.png"]  # no temporary left


@needs_chromium
def test_save_pngs_uses_scale_and_writes_every_file(tmp_path):
    figs = {tmp_path / "x.png": _fig(), tmp_path / "y.png": go.Figure(go.Bar(y=[1, 2]))}
    paths = save_pngs(figs, width=200, height=150, scale=2)
    assert paths == list(figs)
    assert [_png_size(p.read_bytes()) for p in paths] == [(400, 300), (400, 300)]
    assert paths[0].read_bytes() != paths[1].read_bytes()


def test_a_missing_browser_is_one_clear_error_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium"))
    assert find_chromium() is None
    target = tmp_path / "a.png"
    target.write_bytes(b"old")
    with pytest.raises(PngExportUnavailable, match="needs Chromium") as err:
        save_png(_fig(), target)
    assert "\n" not in str(err.value) and isinstance(err.value, NopeinterpError)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]


def test_missing_kaleido_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kaleido", None)  # import kaleido -> ImportError
    with pytest.raises(PngExportUnavailable, match="needs kaleido"):
        save_png(_fig(), tmp_path / "a.png")
    assert not (tmp_path / "a.png").exists()


def test_bad_sizes_are_refused():
    with pytest.raises(NopeinterpError, match="width must be positive"):
        save_png(_fig(), "unused.png", width=0)


class _FlakyKaleido:
    """A stand-in for kaleido.Kaleido whose first `fail` renders raise, as kaleido's page race
    does on a loaded machine; later ones return `image`."""

    calls = 0
    fail = 1
    image = b"png"

    def __init__(self, **kwargs):
        pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def calc_fig(self, fig, opts):
        type(self).calls += 1
        if type(self).calls <= type(self).fail:
            raise RuntimeError("JavascriptError: kaleido_scopes is not defined")
        return type(self).image


def _flaky(monkeypatch, fail: int):
    import types

    from nopeinterp.viz import export

    kind = type("Flaky", (_FlakyKaleido,), {"calls": 0, "fail": fail})
    monkeypatch.setitem(sys.modules, "kaleido", types.SimpleNamespace(Kaleido=kind))
    monkeypatch.setattr(export, "find_chromium", lambda: "/usr/bin/chromium")
    return kind


def test_a_browser_failure_is_retried_once(tmp_path, monkeypatch):
    from nopeinterp.viz.export import PngBrowserFailed

    kind = _flaky(monkeypatch, fail=1)
    path = save_png(go.Figure(), tmp_path / "a.png")
    assert path.read_bytes() == b"png" and kind.calls == 2
    kind = _flaky(monkeypatch, fail=2)
    with pytest.raises(PngBrowserFailed, match="kaleido_scopes is not defined"):
        save_png(go.Figure(), tmp_path / "b.png")
    assert kind.calls == 2 and not (tmp_path / "b.png").exists()


def test_write_figure_tries_again_after_a_browser_failure(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "analyses"))
    import _common

    monkeypatch.setattr(_common, "_PNG_UNAVAILABLE", [])
    monkeypatch.setattr(_common, "_PNG_NOTES", set())
    _flaky(monkeypatch, fail=2)  # both attempts of the first figure fail
    first = _common.write_figure(go.Figure(), tmp_path, "a")
    second = _common.write_figure(go.Figure(), tmp_path, "b")
    assert [p.name for p in first] == ["a.html"]
    assert [p.name for p in second] == ["b.html", "b.png"]
    assert capsys.readouterr().out.count("note: no PNG figures") == 1
