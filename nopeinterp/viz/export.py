"""PNG export of plotly figures with kaleido (v1) and the system Chromium.

    save_png(fig, "figs/accuracy.png", width=900, height=500)
    save_pngs({"a.png": fig_a, "b.png": fig_b})     # one browser for all

Nothing is downloaded: kaleido's plotly.js comes from the installed plotly package, MathJax is
switched off, and the browser is `$BROWSER_PATH` or a Chromium/Chrome on the system (never a
copy kaleido would fetch). When kaleido or the browser is missing, or the browser fails,
`PngExportUnavailable` says so in one line; callers decide whether to skip with that reason.
Files are written atomically (temporary file + rename): never a half-written PNG.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from nopeinterp.errors import NopeinterpError


class PngExportUnavailable(NopeinterpError):
    """PNG export cannot run here (kaleido or Chromium missing, or the browser failed)."""


class PngBrowserFailed(PngExportUnavailable):
    """The browser started but failed (twice) to render: possibly transient, e.g. kaleido's page
    not ready on a loaded machine ("kaleido_scopes is not defined")."""


def find_chromium() -> str | None:
    """The browser kaleido would use: $BROWSER_PATH if set, else a system Chromium/Chrome
    (choreographer's own search, skipping any locally downloaded copy); None if none runs."""
    try:
        from choreographer.browsers.chromium import Chromium
    except ImportError:
        return None
    path = os.environ.get("BROWSER_PATH") or Chromium.find_browser(skip_local=True)
    return path if path and os.path.isfile(path) and os.access(path, os.X_OK) else None


def _atomic_write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _run(coro):
    """Run a coroutine to completion, also from inside a running loop (Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _render(figs: list, opts: dict) -> list[bytes]:
    try:
        import kaleido
    except ImportError:
        raise PngExportUnavailable(
            "PNG export needs kaleido>=1 (pip install 'kaleido>=1')"
        ) from None
    browser = find_chromium()
    if browser is None:
        raise PngExportUnavailable(
            "PNG export needs Chromium (apt-get install chromium, or set BROWSER_PATH)"
        )

    async def go():
        async with kaleido.Kaleido(n=1, mathjax=False, path=browser) as k:
            return [await k.calc_fig(fig, opts=opts) for fig in figs]

    for _attempt in range(2):  # one retry: kaleido's page can lose a race on a loaded machine
        try:
            return _run(go())
        except Exception as e:  # the browser failed to start or to render
            error = e
    first = (str(error).strip().splitlines() or [""])[0]
    raise PngBrowserFailed(
        f"PNG export failed in {browser}: {type(error).__name__}: {first}"
    ) from error


def save_pngs(
    figures: Mapping[str | os.PathLike, object],
    *,
    width: int = 900,
    height: int = 500,
    scale: float = 1.0,
) -> list[Path]:
    """Write each plotly figure of {path: figure} as a PNG of width*scale x height*scale
    pixels, with one browser for all of them. Every image is rendered before any is written."""
    for v, what in ((width, "width"), (height, "height"), (scale, "scale")):
        if not v > 0:
            raise NopeinterpError(f"PNG {what} must be positive, got {v}")
    paths = [Path(p) for p in figures]
    images = _render(list(figures.values()), {"format": "png", "width": width,
                                               "height": height, "scale": scale})  # fmt: skip
    return [_atomic_write_bytes(p, img) for p, img in zip(paths, images, strict=True)]


def save_png(
    fig, path: str | os.PathLike, *, width: int = 900, height: int = 500, scale: float = 1.0
) -> Path:
    """Write one plotly figure as a PNG (width*scale x height*scale pixels); atomic."""
    return save_pngs({path: fig}, width=width, height=height, scale=scale)[0]
