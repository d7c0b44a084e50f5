"""Run every benchmark and print one summary table.

    python -m bench [--quick] [--threads N] [--only train_step decode ...] [--results PATH]

--quick runs each at a tiny size (what tests/test_bench_smoke.py does). --results writes the
table as Markdown with the date and the machine (bench/RESULTS.md is made this way).
Figures are ratios against baselines measured in the same run, medians over repeats.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import time
import traceback
from pathlib import Path

import torch

from bench import MODULES
from bench._common import format_table, machine, machine_line, row


def run_all(quick: bool, only=None) -> tuple[list[dict], dict[str, float]]:
    rows, seconds = [], {}
    for name in only or MODULES:
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(f"bench.{name}")
            got = mod.run(quick=quick)
        except Exception as err:  # one broken benchmark must not hide the others
            traceback.print_exc()
            got = [row(f"{name}: FAILED", None, None, None, met=False, note=repr(err))]
        seconds[name] = time.perf_counter() - t0
        for r in got:
            r["bench"] = name
        rows += got
        print(f"[bench] {name}: {len(got)} rows in {seconds[name]:.0f} s", flush=True)
    return rows, seconds


def markdown(rows, seconds, quick, started) -> str:
    m = machine()
    missed = [r["figure"] for r in rows if r.get("met") is False]
    lines = [
        "# Benchmark results",
        "",
        f"Run: {started:%Y-%m-%d %H:%M} UTC, `python -m bench{' --quick' if quick else ''}`, "
        f"total {sum(seconds.values()):.0f} s "
        f"({', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())}).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m['torch_threads']}, "
        f"torch {m['torch']}, python {m['python']}; load average at the end "
        f"{m['load_avg_1m']}, training processes running at the end: {m['training_processes']}.",
        "",
        format_table(rows, markdown=True),
        "",
        "Targets missed: " + ("; ".join(missed) if missed else "none") + ".",
        "",
        "## Notes per row",
        "",
    ]
    lines += [f"- **{r['figure']}**: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--only", nargs="*", choices=MODULES, default=None)
    parser.add_argument("--results", type=Path, default=None, help="write a Markdown report")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = datetime.datetime.now(datetime.UTC)
    print(machine_line(), flush=True)
    rows, seconds = run_all(args.quick, args.only)
    print()
    print(machine_line())
    print(f"total {sum(seconds.values()):.0f} s")
    print(format_table(rows))
    notes = [f"  {r['figure']}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        print("notes:")
        print("\n".join(notes))
    if args.results:
        args.results.write_text(markdown(rows, seconds, args.quick, started))
        print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
