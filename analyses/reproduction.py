"""The reproduction grid of issue 16, run exactly as analyses/PROTOCOL.md fixes it.

    python analyses/reproduction.py search          # the 30 LR-search runs (validation only)
    python analyses/reproduction.py grid --lr 1e-3  # seed 0 of all 50 (split, PE), then 1, 2
    python analyses/reproduction.py table [--lr X]  # search summary; run table + comparison

Every run uses `--preset repro` (nopeinterp/training/presets.py) with the learning rate passed
explicitly. Checkpoints go under runs/reproduction/lr=<lr>/ (git-ignored); each finished run's
record is copied to analyses/results/reproduction/lr=<lr>/<run>.json (commit these). The grid
reuses the search's folder at the chosen rate, so its 10 search runs at that rate are the grid's
seed-0 runs of cmc and mdlen: `grid` decodes their test sets (they were trained without).
Resumable: rerunning a command skips finished runs and resumes interrupted ones.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pandas as pd

from nopeinterp.errors import NopeinterpError
from nopeinterp.paper import FIVE_PES
from nopeinterp.tasks import PAPER_SPLITS
from nopeinterp.training.sweep import RECORD, run_sweep

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "reproduction"
RECORDS = ROOT / "analyses" / "results" / "reproduction"
PRESET = "repro"
SEARCH_LRS = (3e-4, 1e-3, 3e-3)
SEARCH_SPLITS = ("cmc", "mdlen")
SEEDS = (0, 1, 2)
DID_NOT_TRAIN = 0.90  # best validation accuracy below this: "did not train"
TIE = 0.01  # LR criterion: within this of the best mean, the smallest rate wins


def task_spec(split: str) -> str:
    """The sweep's task spec of a paper split, e.g. 'copy:variant=rsc'."""
    s = PAPER_SPLITS[split]
    opts = ",".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in s.options.items()
    )
    return f"{s.task_name}:{opts}" if opts else s.task_name


def lr_folder(lr: float) -> str:
    return f"lr={lr:g}"


def _sweep(splits, seeds, lr: float, test: str, workers: int) -> dict:
    out = RUNS / lr_folder(lr)
    dest = RECORDS / lr_folder(lr)

    def log(line: str) -> None:
        print(line, flush=True)
        run, _, status = line.partition(": ")
        if status in ("finished", "tested", "skipped") and (out / run / RECORD).exists():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / run / RECORD, dest / f"{run}.json")

    return run_sweep(
        [task_spec(s) for s in splits],
        FIVE_PES,
        seeds,
        out,
        preset=PRESET,
        overrides={"lr": lr},
        workers=workers,
        test=test,
        log=log,
    )


def restore_search_records(lr: float) -> list[str]:
    """Put each committed search record back in its run folder where that folder has none.

    On a new machine runs/ is empty; the search decodes no test set, so a committed record is
    the whole result of its run and the sweep then skips it instead of training it again.
    (The grid still needs the checkpoint of a search run it reuses.)"""
    restored = []
    for path in sorted((RECORDS / lr_folder(lr)).glob("*.json")):
        run = path.stem
        if any(run.startswith(task_spec(s).replace(":", ".")) for s in SEARCH_SPLITS):
            dest = RUNS / lr_folder(lr) / run / RECORD
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
                restored.append(run)
    return restored


def search(workers: int = 1) -> None:
    """The pre-registered search: 3 rates x (cmc, mdlen) x 5 PEs, seed 0; no test decoded."""
    for lr in SEARCH_LRS:
        for run in restore_search_records(lr):
            print(f"{run}: committed record restored", flush=True)
        _sweep(SEARCH_SPLITS, [0], lr, "none", workers)


def run_grid(lr: float, workers: int = 1) -> None:
    """The grid in the protocol's order: seed 0 of every (split, PE), then seed 1, then 2."""
    for seed in SEEDS:
        _sweep(list(PAPER_SPLITS), [seed], lr, "eval_set", workers)


def records(root: Path = RECORDS) -> pd.DataFrame:
    """One row per committed record: the protocol's per-run fields."""
    rows = []
    for path in sorted(root.glob("lr=*/*.json")):
        r = json.loads(path.read_text())
        rows.append(
            {
                "lr": r["lr"],
                "split": r["split"],
                "pe": r["pe"],
                "seed": r["seed"],
                "ood_accuracy": r.get("ood_accuracy"),
                "val_accuracy": r["val_accuracy"],
                "best_step": r["best_step"],
                "steps": r["steps"],
                "test_items": r.get("test_items"),
                "val_items": r.get("val_items"),
                "wall_time_s": r.get("run_wall_s"),
                "did_not_train": r["val_accuracy"] < DID_NOT_TRAIN,
            }
        )
    cols = ["lr", "split", "pe", "seed", "ood_accuracy", "val_accuracy", "best_step", "steps"]
    return pd.DataFrame(rows, columns=[*cols, "test_items", "val_items", "wall_time_s"])


def search_summary(runs: pd.DataFrame) -> tuple[pd.DataFrame, float | None]:
    """Mean best validation accuracy per searched rate (seed 0, the search splits) and the
    chosen rate: None until all 30 runs are in."""
    s = runs[runs["split"].isin(SEARCH_SPLITS) & (runs["seed"] == 0)]
    s = s[s["lr"].isin(SEARCH_LRS)]
    table = (
        s.groupby("lr")["val_accuracy"]
        .agg(["mean", "count"])
        .reindex(SEARCH_LRS)
        .rename_axis("lr")
        .reset_index()
    )
    table["count"] = table["count"].fillna(0).astype(int)
    full = len(SEARCH_SPLITS) * len(FIVE_PES)
    if (table["count"] < full).any():
        return table, None
    best = table["mean"].max()
    return table, float(table.loc[table["mean"] >= best - TIE - 1e-12, "lr"].min())


def table(lr: float | None = None) -> None:
    runs = records()
    if runs.empty:
        raise NopeinterpError(f"{RECORDS}: no records yet")
    summary, chosen = search_summary(runs)
    print("LR search (mean best validation exact match over its 10 runs):")
    print(summary.to_string(index=False))
    print(f"chosen rate: {chosen if chosen is not None else 'not yet (search incomplete)'}")
    if lr is None:
        lr = chosen
    if lr is None:
        return
    grid = runs[runs["lr"] == lr]
    full = pd.MultiIndex.from_product([list(PAPER_SPLITS), FIVE_PES, SEEDS]).to_frame(
        index=False, name=["split", "pe", "seed"]
    )
    grid = full.merge(grid, on=["split", "pe", "seed"], how="left")
    grid["status"] = "missing"
    grid.loc[grid["val_accuracy"].notna(), "status"] = "no test"
    grid.loc[grid["ood_accuracy"].notna(), "status"] = "done"
    print(f"\nruns at lr={lr:g}: {dict(grid['status'].value_counts())}")
    print(grid.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    done = grid[grid["status"] == "done"]
    complete = done.groupby(["split", "seed"])["pe"].transform("nunique") == len(FIVE_PES)
    ours = done[complete]
    if ours.empty:
        print("\nno complete (split, seed) cell yet: no comparison with the paper")
        return
    from nopeinterp.paper import compare_with_paper

    comparison = compare_with_paper(ours[["split", "pe", "seed", "ood_accuracy"]].copy())
    print(f"\ncompared on complete cells only ({len(ours)} runs):")
    print(comparison.table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search")
    s.add_argument("--workers", type=int, default=1)
    g = sub.add_parser("grid")
    g.add_argument("--lr", type=float, required=True)
    g.add_argument("--workers", type=int, default=1)
    t = sub.add_parser("table")
    t.add_argument("--lr", type=float, default=None)
    args = p.parse_args(argv)
    try:
        if args.command == "search":
            search(args.workers)
        elif args.command == "grid":
            run_grid(args.lr, args.workers)
        else:
            table(args.lr)
    except NopeinterpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
