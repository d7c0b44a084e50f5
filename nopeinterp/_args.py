"""Command-line argument checks: argparse `type=` functions and a parser that errs in one line.

Every check here runs while the arguments are parsed, before any work starts. Values the API
also receives (n, batch_size, n_train, ...) are validated again by the API functions, so a
notebook gets the same errors; these only make the command line fail early and in one line.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (no usage block) and exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _max_task_length() -> int:
    from nopeinterp.tasks.base import Task

    return Task.max_length  # the longest length any task allows (each may narrow it)


def lengths(text: str) -> list[int]:
    """'2-40' -> [2..40]; '5,10,20' -> [5, 10, 20]; '8' -> [8]. Each task checks its own range."""
    out: list[int] = []
    limit = _max_task_length()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            lo, hi = int(lo), int(hi or lo)
            if lo > hi:
                raise ValueError
            if lo < 1 or hi > limit:
                raise argparse.ArgumentTypeError(
                    f"invalid lengths {text!r}: lengths are between 1 and {limit}"
                )
            out.extend(range(lo, hi + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid lengths {text!r} (use e.g. 2-40 or 5,10,20)"
        ) from None
    return out


def layers(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2] (0 = embeddings, l = after block l)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid layers {text!r} (use e.g. 0,1,2)") from None
    if min(out) < 0:
        raise argparse.ArgumentTypeError(f"invalid layers {text!r}: layers are >= 0")
    return out


def rope_scaling(text: str) -> dict:
    """'yarn:2' -> {"rope_type": "yarn", "factor": 2.0} (also linear, dynamic). The model
    checks the rest (a rotary layer, the other parameters) when it is loaded."""
    from nopeinterp.models.rotary import ROPE_TYPES

    kinds = [k for k in ROPE_TYPES if k != "default"]
    kind, _, factor = text.partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = None
    if kind not in kinds or value is None or not value >= 1.0:
        raise argparse.ArgumentTypeError(
            f"invalid RoPE scaling {text!r} (use TYPE:FACTOR, TYPE one of {', '.join(kinds)}, "
            "FACTOR >= 1, e.g. yarn:2)"
        )
    return {"rope_type": kind, "factor": value}


def _check_length(path: Path) -> None:
    """Names and the path within the file system's limits (checked first: stat() fails else)."""
    try:
        name_max = os.pathconf(".", "PC_NAME_MAX")
        path_max = os.pathconf(".", "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    too_long = [p for p in path.parts if len(os.fsencode(p)) > name_max]
    if too_long or len(os.fsencode(str(path.absolute()))) >= path_max:
        raise argparse.ArgumentTypeError(
            f"{path}: path too long (names up to {name_max} bytes, paths up to {path_max})"
        )


def _check_writable(path: Path, what: str) -> None:
    """Raise ArgumentTypeError unless `path` (a `what`: folder or file) can be created/written."""
    ancestor = path if not path.is_file() else path.parent  # an existing file: its folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: cannot write here ({ancestor} is not a folder)")
    try:  # the real test (a read-only file system, permissions, even for root)
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(
            f"{path}: cannot write {what} in {ancestor} ({e.strerror or e})"
        ) from None


def out_dir(text: str) -> str:
    """An output folder: an existing writable folder, or one that can be created."""
    path = Path(text)
    _check_length(path)
    if path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: exists and is not a folder")
    _check_writable(path, "a folder")
    return text


def out_file(text: str) -> str:
    """An output file: not a folder, in a folder that exists or can be created, writable."""
    path = Path(text)
    _check_length(path)
    _check_writable(path, "a file")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder, give a file path")
    return text
