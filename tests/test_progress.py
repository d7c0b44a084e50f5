"""nopeinterp.progress: bars on a terminal, plain lines in logs, a global quiet switch."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from nopeinterp import progress as prog
from nopeinterp.progress import progress, quiet, set_quiet

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import sys
from nopeinterp.progress import progress
interval = float(sys.argv[1])
for _ in progress(range(5), desc="eval copy", unit="ex", interval=interval):
    pass
with progress(total=3, desc="train", interval=interval) as bar:
    for step in range(3):
        bar.set_postfix(loss=f"{1 / (step + 1):.2f}")
        bar.update(1)
"""


def _run(*args, env=None, stderr=subprocess.PIPE):
    base = {k: v for k, v in os.environ.items() if k != "NOPEINTERP_QUIET"}
    env = {**base, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], stdout=subprocess.PIPE,
                          stderr=stderr, env=env, timeout=120)  # fmt: skip


@pytest.fixture(autouse=True)
def _restore_quiet():
    before = prog._quiet
    yield
    prog._quiet = before


def test_in_a_pipe_each_item_is_a_plain_line_without_carriage_returns():
    err = _run("0").stderr.decode()
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    # interval=0: one line per item, then a final line for each loop
    assert len(lines) == 5 + 1 + 3 + 1, lines
    assert lines[0].startswith("eval copy: 1/5 ex (20%)")
    assert " eta " in lines[0] and " eta " not in lines[5]  # the time left, while running
    assert lines[5].startswith("eval copy: 5/5 ex (100%)") and " done " in lines[5]
    assert lines[-1].startswith("train: 3/3 it (100%)") and lines[-1].endswith("loss=0.33")


def test_in_a_pipe_lines_are_rate_limited():
    lines = _run("3600").stderr.decode().splitlines()
    assert [line.split(":")[0] for line in lines] == ["eval copy", "train"]  # final lines only


def test_on_a_terminal_it_draws_a_bar():
    main, secondary = pty.openpty()
    # a fresh pty is 0 columns wide and tqdm would draw nothing; real terminals have a size
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    chunks: list[bytes] = []

    def drain():  # read while the child runs: the pty buffer is small, and Linux drops
        while True:  # unread output once the child side closes
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child side is closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        proc = _run("0", stderr=secondary)
    finally:
        os.close(secondary)
        reader.join(timeout=30)
        os.close(main)
    out = b"".join(chunks)
    assert proc.returncode == 0
    text = out.decode(errors="replace")
    assert "\reval copy:   0%|" in text and "| 0/5 [" in text  # a tqdm frame
    assert "done" not in text  # no plain lines on a terminal


def test_quiet_by_environment_prints_nothing():
    proc = _run("0", env={"NOPEINTERP_QUIET": "1"})
    assert proc.returncode == 0 and proc.stderr == b""


def test_set_quiet_and_the_quiet_context_silence_everything():
    buf = io.StringIO()
    set_quiet(True)
    assert list(progress(range(3), file=buf, interval=0)) == [0, 1, 2]
    assert buf.getvalue() == ""
    set_quiet(False)
    with quiet():
        list(progress(range(3), file=buf, interval=0))
    assert buf.getvalue() == ""
    list(progress(range(3), file=buf, interval=0, desc="x"))
    assert len(buf.getvalue().splitlines()) == 4
    list(progress(range(3), file=buf, interval=0, disable=True))
    assert len(buf.getvalue().splitlines()) == 4


def test_breaking_out_of_a_loop_still_closes_with_the_count_reached():
    buf = io.StringIO()
    for i in progress(range(10), file=buf, interval=3600, desc="d"):
        if i == 3:
            break
    assert buf.getvalue().startswith("d: 3/10 it (30%)")
    with pytest.raises(TypeError, match="counter"):
        iter(progress(total=3)).__next__()
