"""Retrain every reference checkpoint in checkpoints/ (the exact commands, in one place).

    python analyses/train_reference.py            # all of them, 2 at a time, resuming
    python analyses/train_reference.py --dry-run  # print the commands only
    python analyses/train_reference.py --seeds 1 2 --tasks copy --out-dir runs/seeds
                                                  # more seeds of every PE (not shipped)

Each job is one `nopeinterp train` process with one torch thread: on this 2-core machine two
single-threaded runs finish sooner than one two-threaded run. Jobs whose checkpoint exists
and has no pending training state are skipped; interrupted ones resume (same final weights).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nopeinterp.zoo import PE_ORDER, checkpoint_name

ROOT = Path(__file__).resolve().parents[1]
# The architecture and optimizer (4 layers, 4 heads, d_model 128, lr 2e-3, batch 32, steps per
# task, float16 checkpoints) are the trainer's `reference` preset: nopeinterp/training/presets.py.
PRESET = ["--preset", "reference"]
PES = list(PE_ORDER)
TASKS = ["scan", "copy"]


def jobs(out_dir: Path, seeds=None, tasks=TASKS):
    """(checkpoint, args) in training order: the reference set (what the similarity analysis
    needs first), or with `seeds` every PE at each of those seeds (`<task>-<pe>-seed<k>.pt`)."""
    for task in tasks:
        # nope seed 1 is NoPE-prime: the noise floor of the similarity analysis
        runs = [("nope", 0), ("t5", 0), ("nope", 1), *[(pe, 0) for pe in PES[2:]]]
        if seeds:
            runs = [(pe, seed) for seed in seeds for pe in PES]
        for pe, seed in runs:
            yield (
                out_dir / f"{checkpoint_name(task, pe, seed)}.pt",
                ["--task", task, "--pe", pe, "--seed", str(seed)],
            )


def command(out: Path, args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nopeinterp.cli",
        "train",
        *args,
        "--out",
        str(out),
        *PRESET,
        "--resume",
    ]


def run(out: Path, args: list[str]) -> tuple[Path, int, float]:
    log = out.with_suffix(".log")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.time()
    with open(log, "w") as f:
        code = subprocess.call(
            command(out, args), stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
    return out, code, time.time() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(ROOT / "checkpoints"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default=None, help="substring filter on the checkpoint name")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="*", help="train every PE at these seeds")
    parser.add_argument("--tasks", nargs="*", default=TASKS, choices=TASKS)
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = []
    if args.seeds and 0 in args.seeds:
        parser.error("seed 0 is the reference set: leave out --seeds to (re)train it")
    for out, job_args in jobs(out_dir, args.seeds, args.tasks):
        if args.only and args.only not in out.name:
            continue
        finished = out.exists() and not out.with_name(out.name + ".state.pt").exists()
        if args.dry_run:
            print(("# done: " if finished else "") + " ".join(command(out, job_args)))
        elif not finished:
            todo.append((out, job_args))
    if args.dry_run:
        return
    with ThreadPoolExecutor(args.jobs) as pool:
        for out, code, seconds in pool.map(lambda j: run(*j), todo):
            print(
                f"{out.name}: exit {code} after {seconds / 60:.1f} min (log: {out.with_suffix('.log')})",
                flush=True,
            )


if __name__ == "__main__":
    from _common import run_script

    run_script(main)
