"""Shared helpers of the analysis scripts: their command line, and writing tables and figures.

Checkpoints are found and named by `nopeinterp.zoo` (as the CLI and the main job do).

Every script in analyses/ is `python analyses/<name>.py [--checkpoints DIR] [--quick] [--out DIR]`
and writes into analyses/results/ by default. Nothing here computes a result: the numbers come
from nopeinterp's own functions, these helpers only find inputs and write outputs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "analyses" / "results"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--checkpoints",
        nargs="+",
        default=[str(ROOT / "checkpoints")],
        help="checkpoint folder(s); a name in two folders is taken from the first",
    )
    p.add_argument("--quick", action="store_true", help="few examples: a smoke run, not results")
    p.add_argument("--out", default=str(RESULTS), help="results folder (analyses/results/)")
    p.add_argument("--tasks", default=None, help="comma-separated task filter, e.g. scan,copy")
    p.add_argument("--progress", action="store_true", help="show progress bars")
    return p


def run_script(main) -> None:
    """Run a script's `main()` and exit: with its status when it returns an int (0 otherwise);
    a bad input (a NopeinterpError) is one line on stderr and exit status 2, no traceback."""
    from nopeinterp.errors import NopeinterpError

    try:
        status = main()
    except NopeinterpError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status if isinstance(status, int) else 0)


def task_filter(args) -> list[str] | None:
    return [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None


def _cell(v) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    return str(v).replace("|", "\\|")


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub markdown table (pandas' to_markdown needs `tabulate`, which we do not need)."""
    cols = [str(c) for c in df.columns]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    lines = [
        "| " + " | ".join(cols) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def mean_span(values: pd.Series, digits: int = 3) -> str:
    """'mean [min, max]' of the values present ('' if none, the value alone if one): a cell
    that shows the spread over seeds beside the mean."""
    v = values.dropna()
    if v.empty:
        return ""
    if len(v) == 1:
        return f"{v.iloc[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} [{v.min():.{digits}f}, {v.max():.{digits}f}]"


def batches_sentence(length_groups, changes: str) -> str:
    """How many runs trained on the padded batch and how many in length groups (each run's
    `length_groups` setting); `changes`: where the protocol records the switch."""
    counts = pd.Series([int(v) for v in length_groups], dtype=int).value_counts().sort_index()
    parts = [
        f"{n} run{'s' if n != 1 else ''} "
        + ("on the padded batch" if k == 1 else f"in {k} length groups")
        for k, n in counts.items()
    ]
    why = (
        f" (length groups: the same examples and loss on less padding; {changes})"
        if (counts.index > 1).any()
        else ""
    )
    return f"Batches: {', '.join(parts)}{why}."


def write_section(
    path: Path, text: str, begin: str, end: str, *, before: str | None = None
) -> Path:
    """Write `text` (a section that starts with the marker `begin` and ends with `end`) into
    the Markdown file `path`, in place of the part between those markers. Where `path` has no
    such part yet, the section goes before the first occurrence of `before` (if given and
    found), else at the end. Written atomically: a failed write leaves the file as it was."""
    from nopeinterp._io import atomic_write_text

    if not (text.lstrip().startswith(begin) and text.rstrip().endswith(end)):
        raise ValueError(f"a section starts with {begin!r} and ends with {end!r}")
    section = text.strip("\n")
    body = path.read_text()
    if begin in body and end in body:
        head, rest = body.split(begin, 1)
        body = head + section + rest.split(end, 1)[1]
    elif before is not None and before in body:
        head, sep, tail = body.partition(before)
        body = head + section + "\n\n" + sep + tail
    else:
        body = body.rstrip("\n") + "\n\n" + section
    atomic_write_text(path, body if body.endswith("\n") else body + "\n")
    return path


def write_table(df: pd.DataFrame, out_dir, name: str, *, title=None, notes=None) -> list[Path]:
    """`<name>.csv` (the full frame) and `<name>.md` (title, notes, the markdown table)."""
    from nopeinterp.viz.html import atomic_write_text

    out_dir = Path(out_dir)
    text = (f"# {title}\n\n" if title else "") + (f"{notes.strip()}\n\n" if notes else "")
    return [
        atomic_write_text(out_dir / f"{name}.csv", df.to_csv(index=False)),
        atomic_write_text(out_dir / f"{name}.md", text + to_markdown(df)),
    ]


_PNG_UNAVAILABLE: list[str] = []  # why PNG export cannot run here (kaleido/Chromium missing)
_PNG_NOTES: set[str] = set()  # the notes printed so far: each reason is said once per run


def write_figure(fig, out_dir, name: str, *, scale: float = 2.0) -> list[Path]:
    """`<name>.html` (offline, plotly.js inlined) and `<name>.png` beside it
    (nopeinterp.viz.export.save_png: kaleido with the system Chromium). When PNG export
    cannot run here, one line says why (once per run and reason) and only the HTML is written;
    after a browser failure (not a missing browser) the next figure tries again. A PNG left by
    an earlier run is then removed: it would no longer show what the HTML shows."""
    from nopeinterp.viz.export import PngBrowserFailed, PngExportUnavailable, save_png
    from nopeinterp.viz.html import save_figure

    out_dir = Path(out_dir)
    paths = [save_figure(fig, out_dir / f"{name}.html")]
    png = out_dir / f"{name}.png"
    if _PNG_UNAVAILABLE:
        _drop_stale(png)
        return paths
    try:
        paths.append(
            save_png(
                fig,
                png,
                width=fig.layout.width or 900,
                height=fig.layout.height or 500,
                scale=scale,
            )
        )
    except PngExportUnavailable as err:
        if not isinstance(err, PngBrowserFailed):  # a browser failure may pass: try next time
            _PNG_UNAVAILABLE.append(str(err))
        if str(err) not in _PNG_NOTES:
            _PNG_NOTES.add(str(err))
            print(f"note: no PNG figures ({err}); the HTML figures work offline")
        _drop_stale(png)
    return paths


def _drop_stale(png: Path) -> None:
    if png.exists():
        png.unlink()
        print(f"note: removed {png} of an earlier run (it would not match the new HTML)")


def print_written(paths) -> None:
    print("\nwritten:")
    for p in paths:
        try:
            p = Path(p).resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            pass
        print(f"  {p}")
