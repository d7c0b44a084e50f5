"""Progress reporting that suits where the output goes.

    for batch in progress(batches, desc="eval copy/nope"):
        ...
    with progress(total=steps, desc="train") as bar:
        bar.update(1); bar.set_postfix(loss="0.31")

On a terminal: a tqdm bar. Anywhere else (a log file, a pipe, CI): plain lines, no carriage
returns, at most one every `interval` seconds (interval=0: one per item) plus a final line.
`set_quiet(True)` (a `--quiet` flag) or the environment variable NOPEINTERP_QUIET=1 silences
every progress report in the process; `disable=True` silences one.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

_quiet: bool | None = None  # None: follow $NOPEINTERP_QUIET


def set_quiet(quiet: bool = True) -> None:
    """Silence (or restore) all progress output of this process."""
    global _quiet
    _quiet = bool(quiet)


def is_quiet() -> bool:
    if _quiet is not None:
        return _quiet
    return os.environ.get("NOPEINTERP_QUIET", "").strip().lower() not in ("", "0", "false", "no")


@contextmanager
def quiet(flag: bool = True):
    """Temporarily silence progress output (restores the previous setting)."""
    global _quiet
    before = _quiet
    set_quiet(flag)
    try:
        yield
    finally:
        _quiet = before


def _fmt_time(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Iterable wrapper and manual counter; see the module docstring. Use `progress(...)`."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        *,
        desc: str = "",
        total: int | None = None,
        unit: str = "it",
        initial: int = 0,
        disable: bool = False,
        interval: float = 5.0,
        leave: bool = False,
        file=None,
    ):
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.desc, self.total, self.unit, self.interval = desc, total, unit, interval
        self.n = self.start = initial
        self.postfix = ""
        self.file = sys.stderr if file is None else file
        self.disabled = disable or is_quiet()
        self._bar = None
        self._closed = False
        self._t0 = self._last = time.monotonic()
        if self.disabled:
            return
        isatty = getattr(self.file, "isatty", None)
        if isatty is not None and isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, initial=initial, file=self.file,
                             leave=leave)  # fmt: skip

    # -- counting -------------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        self.n += n
        if self.disabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._line()

    def set_postfix(self, **values) -> None:
        """Extra `key=value` fields shown after the count (e.g. loss)."""
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())
        if self._bar is not None:
            self._bar.set_postfix(values, refresh=False)

    def _line(self, final: bool = False) -> None:
        elapsed = time.monotonic() - self._t0
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = (self.n - self.start) / elapsed if elapsed > 0 else 0.0
        head = f"{self.desc}: " if self.desc else ""
        tail = f" {self.postfix}" if self.postfix else ""
        word = "done" if final else "elapsed"
        eta = ""
        if not final and self.total and rate > 0 and self.n < self.total:
            eta = f" eta {_fmt_time((self.total - self.n) / rate)}"
        self.file.write(
            f"{head}{count} {self.unit}{pct} {rate:.3g} {self.unit}/s {word} "
            f"{_fmt_time(elapsed)}{eta}{tail}\n"
        )
        self.file.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.disabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self._line(final=True)

    # -- protocols ------------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("progress() without an iterable is a counter: use update()")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(iterable: Iterable | None = None, **kwargs) -> Progress:
    """Wrap `iterable` (or count manually with `.update`) and report progress; see the module
    docstring for what is printed where. Keywords: desc, total, unit, initial, disable,
    interval (seconds between plain lines; 0 = every item), leave (keep the finished bar on a
    terminal), file (default sys.stderr). The tqdm calls' keywords carry over unchanged."""
    return Progress(iterable, **kwargs)
