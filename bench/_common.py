"""Shared plumbing of the benchmarks: machine description, timing, summary rows.

Every benchmark module exposes ``run(quick: bool) -> list[dict]``; each dict is one summary
row with the keys of ``ROW_KEYS``:

  figure    what is measured (str)
  ours      our figure (float), in `unit`
  baseline  the baseline's figure, measured in the same run (float)
  ratio     the comparison the target is about (float; e.g. ours/baseline time)
  target    the target, as text (e.g. "<= 1.10")
  met       True / False, or None for informational rows with no target
  unit      unit of ours/baseline (str)
  note      anything the reader needs to interpret the row (str)

Timings are medians over repeats. Nothing here asserts on a time: benchmarks are scripts.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

ROW_KEYS = ("figure", "ours", "baseline", "ratio", "target", "met", "unit", "note")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def training_processes() -> int:
    """Number of running `nopeinterp.cli train` processes (other load on this machine)."""
    n = 0
    try:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ")
            except OSError:
                continue
            if b"nopeinterp.cli train" in cmd:
                n += 1
    except OSError:
        pass
    return n


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "training_processes": training_processes(),
    }


def machine_line() -> str:
    m = machine()
    busy = (
        f", {m['training_processes']} training process(es) running"
        if m["training_processes"]
        else ""
    )
    return (
        f"CPU: {m['cpu']} | cores: {m['cores']} | torch threads: {m['torch_threads']} | "
        f"torch {m['torch']} | python {m['python']} | load avg {m['load_avg_1m']}{busy}"
    )


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB: the kernel's high-water mark of its own memory (VmHWM).
    Not `ru_maxrss`: on Linux a child started by fork + exec inherits its parent's peak there,
    so a small command run from a large benchmark process would report the parent's size."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource  # not Linux: ru_maxrss (KiB on Linux, bytes on macOS)

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if platform.system() == "Darwin" else peak


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` over `repeats` calls, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1):
    """{name: median seconds}, timing the functions in turn (ABAB...) so that drifting
    machine load hits every one of them alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def row(figure, ours, baseline, ratio, target="", met=None, unit="", note="") -> dict:
    return {
        "figure": figure,
        "ours": ours,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "met": met,
        "unit": unit,
        "note": note,
    }


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if x != x:
            return "nan"
        a = abs(x)
        if a == 0:
            return "0"
        if a >= 1000:
            return f"{x:,.0f}"
        if a >= 10:
            return f"{x:.1f}"
        if a >= 0.01:
            return f"{x:.3f}"
        return f"{x:.2e}"
    return str(x)


def format_table(rows: list[dict], markdown: bool = False) -> str:
    """The summary table: figure, ours, baseline, ratio, target, met (plus unit)."""
    head = ["figure", "ours", "baseline", "unit", "ratio", "target", "met"]
    body = []
    for r in rows:
        met = r.get("met")
        body.append(
            [
                str(r["figure"]),
                _fmt(r["ours"]),
                _fmt(r["baseline"]),
                str(r.get("unit", "")),
                _fmt(r["ratio"]),
                str(r.get("target") or "-"),
                "-" if met is None else ("yes" if met else "NO"),
            ]
        )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines)
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)
    ]
    right = {1, 2, 4}

    def line(cells):
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [line(head), line(["-" * w for w in widths])]
    out += [line(b) for b in body]
    return "\n".join(out)


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n== {title} ==")
    print(format_table(rows))
    notes = [f"  {r['figure']}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        print("notes:")
        print("\n".join(notes))
