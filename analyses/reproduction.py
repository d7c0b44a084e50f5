"""The reproduction grid of the paper's comparison, run exactly as analyses/PROTOCOL.md fixes it.

    python analyses/reproduction.py search          # the 30 LR-search runs (validation only)
    python analyses/reproduction.py grid --lr 1e-3  # seed 0 of all 50 (split, PE), then 1, 2
        [--splits mdlen len] [--seeds 2]            # a part of the grid (the same runs)
    python analyses/reproduction.py table [--lr X]  # search summary; run table + comparison
    python analyses/reproduction.py analyse --lr X  # probes, distance, attention on mdlen, len
    python analyses/reproduction.py errors --lr X   # how the wrong test answers fail (re-decodes)
    python analyses/reproduction.py rebuild --lr X  # train committed runs again for checkpoints
    python analyses/reproduction.py pilot [--lrs 1e-3 3e-4] [--steps 6000] [--commit]
    python analyses/reproduction.py pilot-table     # the pilot's runs: steps to 0.95, s/step

`pilot` is not a result: one seed per PE on two splits (PILOT_SPLITS) with the paper's T5
decoder at its head width (`--preset repro-t5`), trained until ID validation exact match is
>= 0.95 on two evaluations in a row or the step cap, to size the next protocol (its step cap,
learning rate per PE, shape). Its checkpoints go under runs/reproduction/pilot/ and each
finished run's record to analyses/results/reproduction/pilot/steps=<cap>/lr=<lr>/<run>.json
(`--commit`: committed to git as it finishes); rerunning resumes it.

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
import subprocess
from pathlib import Path

import pandas as pd

from nopeinterp.errors import NopeinterpError
from nopeinterp.paper import FIVE_PES
from nopeinterp.tasks import PAPER_SPLITS
from nopeinterp.training.sweep import CHECKPOINT, RECORD, grid, run_name, run_sweep
from nopeinterp.zoo import checkpoint_name

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "reproduction"
RECORDS = ROOT / "analyses" / "results" / "reproduction"
REBUILT = "record.rebuilt.json"  # a rebuilt run's own record, beside the committed one
PRESET = "repro"
SEARCH_LRS = (3e-4, 1e-3, 3e-3)
SEARCH_SPLITS = ("cmc", "mdlen")
SEEDS = (0, 1, 2)
ANALYSED_SPLITS = ("mdlen", "len")  # the protocol's mechanistic analyses run on these
DID_NOT_TRAIN = 0.90  # best validation accuracy below this: "did not train"
TIE = 0.01  # LR criterion: within this of the best mean, the smallest rate wins
# The pilot (not results): what the next protocol is sized from
PILOT_PRESET = "repro-t5"
PILOT_SPLITS = ("rsc", "mc")
PILOT_SEED = 0
PILOT_LRS = (1e-3, 3e-4)  # in this order: every run at the first rate, then the next
PILOT_STEPS = 6000  # the pilot's step cap
PILOT_STOP = {"stop_at_val": 0.95, "stop_evals": 2}  # ID validation >= 0.95 twice in a row


def is_recorded_run(folder: Path, record: Path) -> bool:
    """Whether the checkpoint in `folder` is the one its committed `record` was tested on. A
    rebuilt run is not: marked (REBUILT), or still being rebuilt (its own record differs)."""
    return (
        not (folder / REBUILT).exists()
        and (folder / CHECKPOINT).exists()
        and (folder / RECORD).exists()
        and (folder / RECORD).read_bytes() == record.read_bytes()
    )


def task_spec(split: str) -> str:
    """The sweep's task spec of a paper split, e.g. 'copy:variant=rsc'."""
    s = PAPER_SPLITS[split]
    opts = ",".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in s.options.items()
    )
    return f"{s.task_name}:{opts}" if opts else s.task_name


def in_paper_order(df: pd.DataFrame, then: str) -> pd.DataFrame:
    """Rows sorted by split (PAPER_SPLITS order), PE (FIVE_PES order), then column `then`."""
    rank = {**{s: i for i, s in enumerate(PAPER_SPLITS)}, **{p: i for i, p in enumerate(FIVE_PES)}}
    key = lambda c: c.map(rank) if c.name in ("split", "pe") else c  # noqa: E731
    return df.sort_values(["split", "pe", then], key=key).reset_index(drop=True)


def lr_folder(lr: float) -> str:
    return f"lr={lr:g}"


def grid_folder(lr: float, folder: Path | None = None) -> Path:
    """A grid's folder under RUNS and RECORDS: `folder`, or the first grid's `lr=<lr>`."""
    return Path(lr_folder(lr)) if folder is None else Path(folder)


def committed_record(lr: float, run: str) -> Path:
    """Where the grid commits run `run`'s record (a copy of its run folder's record.json)."""
    return RECORDS / lr_folder(lr) / f"{run}.json"


def _sweep(splits, seeds, lr: float, test: str, workers: int) -> dict:
    out = RUNS / lr_folder(lr)

    def log(line: str) -> None:
        print(line, flush=True)
        run, _, status = line.partition(": ")
        if status in ("finished", "tested", "skipped") and (out / run / RECORD).exists():
            dest = committed_record(lr, run)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / run / RECORD, dest)

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


def split_runs(split: str, seeds=None) -> list:
    """The grid's RunSpecs of one paper split (every PE; `seeds`, default all), in sweep order."""
    return grid([task_spec(split)], FIVE_PES, SEEDS if seeds is None else seeds)


def zoo_folder(lr: float, split: str, folder: Path | None = None) -> tuple[Path, list[str]]:
    """A folder of the finished runs of one split at `lr` (under runs/reproduction/`folder`,
    default `lr=<lr>`), linked under the zoo's names (`scan-nope.pt`, `scan-t5-seed1.pt`, ...),
    so the analysis scripts read them as they read checkpoints/. Returns the folder and the runs
    not finished yet (not linked)."""
    folder = grid_folder(lr, folder)
    dest = RUNS / "zoo" / folder / split
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.pt"):
        old.unlink()
    missing = []
    for spec in split_runs(split):
        run = RUNS / folder / run_name(spec)
        if not (run / RECORD).exists() or not (run / CHECKPOINT).exists():
            missing.append(run_name(spec))
            continue
        link = dest / f"{checkpoint_name(spec.task, spec.pe, spec.seed)}.pt"
        link.symlink_to(run / CHECKPOINT)
    return dest, missing


def analyse(
    lr: float, splits=ANALYSED_SPLITS, quick: bool = False, folder: Path | None = None
) -> None:
    """Position probes, distance dependence and attention similarity (the scripts of
    analyses/, unchanged) on the finished grid runs of each split (under runs/reproduction/
    `folder`, default `lr=<lr>`), into analyses/results/reproduction/analyses/lr=<lr>/<split>/
    (or <folder>/analyses/<split>/)."""
    import attention_similarity
    import distance_dependence
    import position_probes

    for split in splits:
        if split not in PAPER_SPLITS:
            raise NopeinterpError(f"unknown split {split!r}; choose from {', '.join(PAPER_SPLITS)}")
    for split in splits:
        zoo, missing = zoo_folder(lr, split, folder)
        if not any(zoo.glob("*.pt")):
            print(
                f"{split}: no finished run's checkpoint here at lr={lr:g}, nothing to analyse "
                "(runs trained on another machine: `rebuild` trains them again)",
                flush=True,
            )
            continue
        if missing:
            print(
                f"{split}: {len(missing)} runs have no finished checkpoint here (not finished, "
                "or trained on another machine: `rebuild` trains them again); analysed without "
                "them",
                flush=True,
            )
        here = RUNS / grid_folder(lr, folder)
        rebuilt = [
            run_name(s) for s in split_runs(split) if (here / run_name(s) / REBUILT).exists()
        ]
        if rebuilt:
            print(f"{split}: {len(rebuilt)} analysed checkpoints were trained again here "
                  "(`rebuild`; see rebuilt_runs)", flush=True)  # fmt: skip
        out = (
            RECORDS / "analyses" / lr_folder(lr) / split
            if folder is None
            else RECORDS / folder / "analyses" / split
        )
        args = ["--checkpoints", str(zoo), "--out", str(out), *(["--quick"] if quick else [])]
        task = PAPER_SPLITS[split].task_name
        position_probes.main(args)
        distance_dependence.main(args)
        attention_similarity.main([*args, "--task", task])


def error_kinds(lr: float, splits=None) -> list[Path]:
    """Decode again the test set of every tested run of `splits` (default all ten) at `lr`,
    sorting each wrong answer by kind (too short, too long, wrong words: `error_kind`), into
    analyses/results/reproduction/analyses/lr=<lr>/error_kinds*. Each run's correct count per
    length is checked against its record (`matches_record`). Incremental: runs already in
    error_kinds_runs.csv are kept, not decoded again (delete the file to redo them all); rebuilt
    runs (`rebuild`) are left out, their checkpoint is not the one their record was tested on."""
    from _common import print_written, write_figure, write_table

    from nopeinterp.evaluation import ERROR_KINDS, evaluate
    from nopeinterp.progress import progress
    from nopeinterp.viz.evaluation import error_kinds_figure

    splits = list(PAPER_SPLITS) if splits is None else splits
    for split in splits:
        if split not in PAPER_SPLITS:
            raise NopeinterpError(f"unknown split {split!r}; choose from {', '.join(PAPER_SPLITS)}")
    out = RECORDS / "analyses" / lr_folder(lr)
    kept = (
        pd.read_csv(out / "error_kinds_runs.csv")
        if (out / "error_kinds_runs.csv").exists()
        else None
    )
    done = set() if kept is None else set(kept[["split", "pe", "seed"]].itertuples(index=False))
    todo, rebuilt = [], 0
    for split in splits:
        for spec in split_runs(split):
            run = RUNS / lr_folder(lr) / run_name(spec)
            record = committed_record(lr, run_name(spec))
            if not (run / CHECKPOINT).exists() or not record.exists():
                continue
            if not is_recorded_run(run, record):  # not the checkpoint its record was tested on
                rebuilt += 1
                continue
            rec = json.loads(record.read_text())
            if rec.get("ood_accuracy") is not None and (split, spec.pe, spec.seed) not in done:
                todo.append((split, spec, run, rec))
    if rebuilt:
        print(f"error kinds: {rebuilt} rebuilt runs left out (`rebuild`: not the recorded runs)")
    if not todo and kept is None:
        raise NopeinterpError(f"no tested run with its checkpoint under {RUNS / lr_folder(lr)}")
    rows = []
    for split, spec, run, rec in progress(todo, desc="error kinds"):
        lengths = [a["length"] for a in rec["accuracy"]]
        res = evaluate(run / CHECKPOINT, lengths=lengths, n=None, progress=False, error_kinds=True)
        recorded = {a["length"]: a["correct"] for a in rec["accuracy"]}
        matches = all(recorded[r.length] == r.correct for r in res.table.itertuples())
        ood = res.summary[res.summary["split"] == "OOD"].iloc[0]
        rows.append(
            {"split": split, "pe": spec.pe, "seed": spec.seed, "n": int(ood["n"]),
             "correct": ood["accuracy"], **{k: ood[k] for k in ERROR_KINDS[1:]},
             "matches_record": matches}
        )  # fmt: skip
    print(f"error kinds: {len(todo)} runs decoded, {len(done)} kept from {out}", flush=True)
    per_run = pd.concat([kept, pd.DataFrame(rows)]) if kept is not None else pd.DataFrame(rows)
    per_run = in_paper_order(per_run, "seed")
    kinds = list(ERROR_KINDS)
    mean = per_run.groupby(["split", "pe"], sort=False)[kinds].mean()
    mean["n_seeds"] = per_run.groupby(["split", "pe"], sort=False)["seed"].nunique()
    mean = mean.reset_index()
    bad = int((~per_run["matches_record"]).sum())
    note = (
        "Share of each run's test items (every item once) by kind: correct, too short (stopped "
        "early), too long (did not stop in time), wrong words (the right length). "
        f"{len(per_run) - bad} of {len(per_run)} runs decode exactly their recorded correct "
        "counts."
    )
    paths = write_table(per_run, out, "error_kinds_runs", title="Error kinds per run", notes=note)
    paths += write_table(
        mean, out, "error_kinds", title="Error kinds, mean over seeds",
        notes=note + " Mean over the seeds tested so far (n_seeds).",
    )  # fmt: skip
    fig = error_kinds_figure(
        mean, panel="split", x="pe", title=f"How the OOD answers fail (mean over seeds), lr={lr:g}"
    )
    paths += write_figure(fig, out, "error_kinds")
    print(mean.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if bad:
        print(f"warning: {bad} runs decode other correct counts than their records")
    print_written(paths)
    return paths


def restore_records(
    lr: float, runs: set[str], *, tested_only: bool, folder: Path | None = None
) -> list[str]:
    """Put each committed record of `runs` at `lr` back in its run folder where that folder has
    none (`tested_only`: only records with a test result). On a new machine runs/ is empty:
    the sweep then skips those runs instead of training them again. `folder`: the records'
    folder under RECORDS and the runs' under RUNS (default `lr=<lr>`)."""
    folder = grid_folder(lr, folder)
    restored = []
    for path in sorted((RECORDS / folder).glob("*.json")):
        run = path.stem
        if run not in runs or (tested_only and json.loads(path.read_text())["test"] == "none"):
            continue
        dest = RUNS / folder / run / RECORD
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            restored.append(run)
    return restored


def restore_search_records(lr: float) -> list[str]:
    """The search decodes no test set, so a committed search record is its run's whole result."""
    runs = {run_name(spec) for split in SEARCH_SPLITS for spec in split_runs(split, [0])}
    return restore_records(lr, runs, tested_only=False)


def prepare_grid_folder(lr: float) -> tuple[list[str], list[str]]:
    """Before the grid runs on this machine: restore every committed grid record that has its
    test result, and drop the untested records (search runs reused by the grid) whose checkpoint
    is not here, so those runs are trained again instead of failing for want of a checkpoint.
    Returns (restored, to retrain)."""
    runs = {run_name(spec) for split in PAPER_SPLITS for spec in split_runs(split)}
    restored = restore_records(lr, runs, tested_only=True)
    retrain = []
    for run in sorted(runs):
        folder = RUNS / lr_folder(lr) / run
        record = folder / RECORD
        if record.exists() and not (folder / CHECKPOINT).exists():
            if json.loads(record.read_text())["test"] == "none":
                record.unlink()
                retrain.append(run)
    return restored, retrain


def rebuild(
    lr: float, splits, seeds, workers: int = 1, folder: Path | None = None,
    preset: str = PRESET, overrides: dict | None = None, pes=None,
) -> list[Path]:  # fmt: skip
    """Train again on this machine the committed grid runs of `splits` x `seeds` whose
    checkpoint is not here (runs/ is not committed; `analyse` and `errors` need checkpoints).
    `folder` (default `lr=<lr>`, the first grid), `preset` and `overrides` (default
    {"lr": lr}): the grid's folder under runs/reproduction/ and results/reproduction/ and its
    settings; `pes`: only these PEs (default all five). The committed record stays the run's record; the rebuilt run's own record is kept
    beside it (record.rebuilt.json) and compared with it, into rebuilt_runs.* under
    analyses/results/reproduction/analyses/lr=<lr>/ (or <folder>/analyses/), which lists every
    run rebuilt on this machine (earlier calls' too). On one machine a rebuild is the same run;
    on another machine it may not be (float rounding differs between CPU models): a rebuilt run
    is then a new sample of the same protocol, not the recorded run."""
    from _common import print_written, write_table

    here, committed = RUNS / grid_folder(lr, folder), RECORDS / grid_folder(lr, folder)
    # (split, spec, its run folder here, its committed record)
    pes = list(FIVE_PES if pes is None else pes)
    runs = [
        (split, spec, here / run_name(spec), committed / f"{run_name(spec)}.json")
        for split in splits for spec in split_runs(split, seeds) if spec.pe in pes
    ]  # fmt: skip
    unrun = [record.stem for *_, record in runs if not record.exists()]
    if unrun:
        raise NopeinterpError(f"not in the grid's records yet (run `grid` first): {unrun[0]}")
    for _, _, run_dir, _ in runs:
        if (run_dir / RECORD).exists() and not (run_dir / CHECKPOINT).exists():
            (run_dir / RECORD).unlink()  # a restored committed record would make the sweep skip it
    # a run the grid trained on this machine still has its own checkpoint: nothing to rebuild
    own = {run_dir for _, _, run_dir, record in runs if is_recorded_run(run_dir, record)}
    todo = [f for _, _, f, _ in runs if not (f / REBUILT).exists() and f not in own]
    print(
        f"rebuild: {len(todo)} of {len(runs)} runs to train again"
        + (f" ({len(own)} have their own checkpoint here)" if own else ""),
        flush=True,
    )
    if todo:  # rebuilt and own runs are skipped by the sweep, interrupted ones resume
        run_sweep(
            [task_spec(s) for s in splits], pes, seeds, here, preset=preset,
            overrides={"lr": lr} if overrides is None else overrides, workers=workers,
            test="eval_set",
        )  # fmt: skip
    unfinished = 0
    for _, _, run_dir, record in runs:
        if run_dir in own or (run_dir / REBUILT).exists():
            continue
        if not (run_dir / RECORD).exists():  # another process trains it, or it was interrupted
            unfinished += 1
            continue
        shutil.move(run_dir / RECORD, run_dir / REBUILT)
        shutil.copyfile(record, run_dir / RECORD)
    if unfinished:
        print(f"rebuild: {unfinished} runs not finished (training in another process, or "
              "interrupted); run `rebuild` again later to finish them and add them to the "
              "table", flush=True)  # fmt: skip
    rows = []  # every run rebuilt here so far, not only this call's: the table is the machine's
    for split in PAPER_SPLITS:
        for spec in split_runs(split):
            run = here / run_name(spec)
            if (run / REBUILT).exists():
                old, new = (json.loads((run / f).read_text()) for f in (RECORD, REBUILT))
                rows.append(
                    {"split": split, "pe": spec.pe, "seed": spec.seed, **compare_records(old, new)}
                )
    result = in_paper_order(pd.DataFrame(rows), "seed")
    out = RECORDS / "analyses" / lr_folder(lr) if folder is None else committed / "analyses"
    paths = write_table(
        result, out, "rebuilt_runs", title="Runs trained again here, against their records",
        notes="runs/ (checkpoints) is not committed: `reproduction.py rebuild` trains a run "
        "again with its spec, seed and settings where an analysis needs its checkpoint. "
        "max_loss_diff: the largest |difference| of the training loss at the validation checks "
        "both runs made up to their best step (NaN: the committed record has no history); "
        "same_val: the same validation accuracy at every check and the same best step; "
        "same_test: the same correct count at every test length.",
    )  # fmt: skip
    print(result.to_string(index=False))
    print_written(paths)
    return paths


def compare_records(old: dict, new: dict) -> dict:
    """How far a rebuilt run's record is from the committed record of the same run. Validation
    histories end at each run's best step: the losses compare where both have a check. Records
    written before histories were kept compare on the best checkpoint only."""
    counts = lambda r: {(a["split"], a["length"]): a["correct"] for a in r["accuracy"]}  # noqa: E731
    if "val_history" in old:
        pairs = list(zip(old["val_history"], new["val_history"], strict=False))  # to the shorter
        loss_diff = max(abs(a["loss"] - b["loss"]) for a, b in pairs)
        same_val = len(old["val_history"]) == len(new["val_history"]) and all(
            a["val_accuracy"] == b["val_accuracy"] for a, b in pairs
        )
    else:
        loss_diff = float("nan")
        same_val = (old["best_step"], old["val_accuracy"]) == (
            new["best_step"],
            new["val_accuracy"],
        )
    return {
        "max_loss_diff": loss_diff,
        "same_val": same_val,
        "same_test": counts(old) == counts(new),
        "best_step": old["best_step"],
        "best_step_rebuilt": new["best_step"],
        "val_accuracy": old["val_accuracy"],
        "val_accuracy_rebuilt": new["val_accuracy"],
        "ood_accuracy": old["ood_accuracy"],
        "ood_accuracy_rebuilt": new["ood_accuracy"],
    }


def search(workers: int = 1) -> None:
    """The pre-registered search: 3 rates x (cmc, mdlen) x 5 PEs, seed 0; no test decoded."""
    for lr in SEARCH_LRS:
        for run in restore_search_records(lr):
            print(f"{run}: committed record restored", flush=True)
        _sweep(SEARCH_SPLITS, [0], lr, "none", workers)


def pilot_folder(steps: int, lr: float) -> Path:
    """The pilot's folder of one (step cap, rate), under RUNS and under RECORDS."""
    return Path("pilot") / f"steps={steps}" / lr_folder(lr)


def commit_records(paths: list[Path], message: str) -> None:
    """`git add` and commit `paths` (only those) in this checkout; a failure (a git command
    of another process holding the index, say) is one line, and the next commit takes them."""
    paths = [str(p) for p in paths]
    try:
        for cmd in (["add", "--", *paths], ["commit", "-q", "-m", message, "--", *paths]):
            subprocess.run(["git", "-C", str(ROOT), *cmd], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or b""
        print(f"warning: not committed ({err.decode().strip() or e}): {message}", flush=True)


def pilot(
    lrs=PILOT_LRS, steps: int = PILOT_STEPS, splits=PILOT_SPLITS, commit=False, pes=None
) -> None:
    """The pilot: every (split, PE) of `splits` and `pes` at seed 0 with `--preset repro-t5`, one rate
    after the other, each run until PILOT_STOP or `steps`; its test set decoded at the end.
    Each finished run's record is copied under RECORDS/pilot/ (`commit`: and committed)."""
    if steps < 1 or any(lr <= 0 for lr in lrs):
        raise NopeinterpError(f"steps={steps}, lrs={list(lrs)}: need steps >= 1 and rates > 0")
    for split in splits:
        if split not in PAPER_SPLITS:
            raise NopeinterpError(f"unknown split {split!r}; choose from {', '.join(PAPER_SPLITS)}")
    pes = FIVE_PES if pes is None else pes
    for lr in lrs:
        folder = pilot_folder(steps, lr)
        runs = {
            run_name(spec)
            for split in splits
            for spec in split_runs(split, [PILOT_SEED])
            if spec.pe in pes
        }
        for run in restore_records(lr, runs, tested_only=True, folder=folder):
            print(f"{run}: committed record restored", flush=True)

        def log(line: str, folder=folder) -> None:
            print(line, flush=True)
            run, _, status = line.partition(": ")
            if status in ("finished", "tested") and (RUNS / folder / run / RECORD).exists():
                dest = RECORDS / folder / f"{run}.json"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(RUNS / folder / run / RECORD, dest)
                if commit:
                    commit_records(
                        [RECORDS / "pilot"], f"pilot (not results): record of {folder}/{run}"
                    )

        run_sweep(
            [task_spec(s) for s in splits], list(pes), [PILOT_SEED], RUNS / folder,
            preset=PILOT_PRESET, overrides={"lr": lr, "steps": steps, **PILOT_STOP},
            test="eval_set", log=log,
        )  # fmt: skip


def steps_to(curve: list[dict] | None, target: float) -> int | None:
    """The first validation step at which exact match reached `target` (None: never)."""
    return next((h["step"] for h in curve or [] if h["val_accuracy"] >= target), None)


def pilot_runs(root: Path | None = None) -> pd.DataFrame:
    """One row per committed pilot record (default: under RECORDS/pilot): its shape, rate, step
    cap, the steps it ran, seconds per training step, steps to first reach 0.95 ID validation,
    best validation and OOD exact match."""
    root = RECORDS / "pilot" if root is None else root
    rows = []
    for path in sorted(root.glob("steps=*/lr=*/*.json")):
        r = json.loads(path.read_text())
        c, speed = r["config"], r.get("throughput") or {}
        rows.append(
            {
                "split": r["split"], "pe": r["pe"], "seed": r["seed"], "arch": c["arch"],
                "n_layers": c["n_layers"], "n_heads": c["n_heads"], "d_head": c["d_head"],
                "d_model": c["d_model"], "lr": r["lr"], "steps": r["steps"],
                "steps_run": r.get("steps_run"), "stopped_early": r.get("stopped_early"),
                # training steps only (no validation), over the run's last training call
                "s_per_step": 1 / speed["steps_per_s"] if speed.get("steps_per_s") else None,
                "steps_to_target": steps_to(r.get("val_curve"), PILOT_STOP["stop_at_val"]),
                "best_val": r["val_accuracy"], "best_step": r["best_step"],
                "ood_accuracy": r.get("ood_accuracy"), "train_wall_s": r.get("run_wall_s"),
            }
        )  # fmt: skip
    cols = ["split", "pe", "seed", "arch", "n_layers", "n_heads", "d_head", "d_model", "lr",
            "steps", "steps_run", "stopped_early", "s_per_step", "steps_to_target", "best_val",
            "best_step", "ood_accuracy", "train_wall_s"]  # fmt: skip
    df = pd.DataFrame(rows, columns=cols)
    return in_paper_order(df, "lr") if len(df) else df


def pilot_curves(root: Path | None = None) -> pd.DataFrame:
    """The pilot's validation curves: one row per (run, evaluation step)."""
    root = RECORDS / "pilot" if root is None else root
    rows = [
        {"split": r["split"], "pe": r["pe"], "lr": r["lr"], "steps": r["steps"], **h}
        for path in sorted(root.glob("steps=*/lr=*/*.json"))
        for r in [json.loads(path.read_text())]
        for h in r.get("val_curve") or []
    ]  # fmt: skip
    return pd.DataFrame(
        rows, columns=["split", "pe", "lr", "steps", "step", "loss", "val_accuracy"]
    )


def pilot_table(out: Path | None = None) -> list[Path]:
    """Print and write the pilot's run table and validation curves (default into
    analyses/results/reproduction/pilot/)."""
    from _common import print_written, write_table

    runs = pilot_runs()
    if runs.empty:
        raise NopeinterpError(f"{RECORDS / 'pilot'}: no pilot records yet")
    out = RECORDS / "pilot" if out is None else Path(out)
    print(runs.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    target = PILOT_STOP["stop_at_val"]
    paths = write_table(
        runs, out, "pilot_runs", title="Pilot runs (not results: they size the next protocol)",
        notes=f"One seed per PE. steps_to_target: the first validation step with ID exact match "
        f">= {target} (empty: never). Training stops once validation is >= {target} on "
        f"{PILOT_STOP['stop_evals']} evaluations in a row, or at `steps`. s_per_step: training "
        "steps only, over the run's last training call, on a machine shared with other work "
        "(an upper bound of the step's cost on an idle core).",
    )  # fmt: skip
    paths += write_table(
        pilot_curves(), out, "pilot_curves", title="Pilot validation curves",
        notes="ID validation exact match at every evaluation of each pilot run.",
    )  # fmt: skip
    print_written(paths)
    return paths


def grid_order() -> list[str]:
    """The splits in the order each seed's round runs them: the two the mechanistic analyses
    need (mdlen, len) first, so they can start before a round ends; then PAPER_SPLITS order."""
    return [*ANALYSED_SPLITS, *(s for s in PAPER_SPLITS if s not in ANALYSED_SPLITS)]


def run_grid(lr: float, workers: int = 1, splits=None, seeds=None) -> None:
    """The grid in the protocol's order: seed 0 of every (split, PE), then seed 1, then 2.
    `splits` / `seeds` run a part of it first (same runs, same settings; default: all)."""
    splits = grid_order() if splits is None else [s for s in grid_order() if s in splits]
    seeds = SEEDS if seeds is None else [s for s in SEEDS if s in seeds]
    restored, retrain = prepare_grid_folder(lr)
    for run in restored:
        print(f"{run}: committed record restored", flush=True)
    for run in retrain:
        print(f"{run}: search record without its checkpoint here: trained again", flush=True)
    for seed in seeds:
        _sweep(splits, [seed], lr, "eval_set", workers)


def _read_records(root: Path | None = None) -> list[dict]:
    """The committed records (default: under RECORDS), as written by the sweep."""
    paths = sorted((RECORDS if root is None else root).glob("lr=*/*.json"))
    return [json.loads(path.read_text()) for path in paths]


def records(root: Path | None = None) -> pd.DataFrame:
    """One row per committed record (default: under RECORDS): the protocol's per-run fields."""
    rows = []
    for r in _read_records(root):
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
                "train_wall_s": r.get("run_wall_s"),  # the whole training, resumes included
                "test_wall_s": r.get("test_wall_s"),
                "did_not_train": r["val_accuracy"] < DID_NOT_TRAIN,
                # the best checkpoint is the last one: still improving when the budget ran out
                "best_at_last_step": r["best_step"] == r["steps"],
            }
        )
    cols = ["lr", "split", "pe", "seed", "ood_accuracy", "val_accuracy", "best_step", "steps"]
    extra = ["test_items", "val_items", "train_wall_s", "test_wall_s", "did_not_train",
             "best_at_last_step"]  # fmt: skip
    return pd.DataFrame(rows, columns=[*cols, *extra])


def accuracy_by_length(lr: float, root: Path | None = None) -> pd.DataFrame:
    """Test exact match per (split, PE, test length) of the tested runs at `lr`: mean, min and
    max over the seeds run so far (the per-length view behind each run's OOD accuracy)."""
    rows = [
        {
            "split": r["split"],
            "pe": r["pe"],
            "seed": r["seed"],
            "length": a["length"],
            "test_split": a["split"],  # ID / OOD
            "accuracy": a["accuracy"],
            "evaluable": a["evaluable"],
        }
        for r in _read_records(root)
        if r["lr"] == lr and r.get("ood_accuracy") is not None
        for a in r.get("accuracy", [])
    ]
    cols = ["split", "pe", "length", "test_split", "mean", "min", "max", "n_seeds", "evaluable"]
    if not rows:
        return pd.DataFrame(columns=cols)
    per = pd.DataFrame(rows).groupby(["split", "pe", "length", "test_split"])
    out = per["accuracy"].agg(["mean", "min", "max"])
    out["n_seeds"] = per["seed"].nunique()
    out["evaluable"] = per["evaluable"].all()
    out = out.reset_index()
    return in_paper_order(out, "length")[cols]


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


def search_runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The search's runs: best validation exact match per (split, PE), one column per rate."""
    s = runs[runs["split"].isin(SEARCH_SPLITS) & (runs["seed"] == 0) & runs["lr"].isin(SEARCH_LRS)]
    wide = s.pivot_table(index=["split", "pe"], columns="lr", values="val_accuracy")
    wide.columns = [f"lr={lr:g}" for lr in wide.columns]
    return wide.reset_index()


def run_grid_table(runs: pd.DataFrame, lr: float) -> pd.DataFrame:
    """Every run of the grid at `lr` (150 rows), with its status: done, no test, missing."""
    full = pd.MultiIndex.from_product([list(PAPER_SPLITS), FIVE_PES, SEEDS]).to_frame(
        index=False, name=["split", "pe", "seed"]
    )
    grid_runs = full.merge(runs[runs["lr"] == lr], on=["split", "pe", "seed"], how="left")
    grid_runs["status"] = "missing"
    grid_runs.loc[grid_runs["val_accuracy"].notna(), "status"] = "no test"
    grid_runs.loc[grid_runs["ood_accuracy"].notna(), "status"] = "done"
    return grid_runs


def complete_cells(grid_runs: pd.DataFrame) -> pd.DataFrame:
    """The done runs of the (split, seed) cells that have all five PEs: what the comparison
    with the paper uses (an MRR cell needs every PE)."""
    done = grid_runs[grid_runs["status"] == "done"]
    complete = done.groupby(["split", "seed"])["pe"].transform("nunique") == len(FIVE_PES)
    return done[complete]


def length_frame(by_length: pd.DataFrame) -> pd.DataFrame:
    """`accuracy_by_length`'s table in the columns of nopeinterp.viz's accuracy_figure: a
    line per PE (`model`), a panel per split (`task`), the mean over seeds (`accuracy`)."""
    return by_length.rename(
        columns={"pe": "model", "split": "task", "test_split": "split", "mean": "accuracy"}
    )


def length_tables(lr: float, out: Path) -> list[Path]:
    """The per-length test exact match (mean over seeds so far) as a table, and one figure per
    task (copy, reverse, SCAN) with a panel per split and a line per PE."""
    from _common import write_figure, write_table

    from nopeinterp.viz.evaluation import accuracy_figure

    by_length = accuracy_by_length(lr)
    if by_length.empty:
        return []
    paths = write_table(
        by_length, out, "accuracy_by_length", title=f"Test exact match per length at lr={lr:g}",
        notes="Mean, min and max over the seeds tested so far (n_seeds) of each run's exact match "
        "at that length; every test item scored once.",
    )  # fmt: skip
    frame = length_frame(by_length)
    for task in dict.fromkeys(PAPER_SPLITS[s].task_name for s in PAPER_SPLITS):
        splits = [s for s in PAPER_SPLITS if PAPER_SPLITS[s].task_name == task]
        rows = frame[frame["task"].isin(splits)]
        if rows.empty:
            continue
        title = f"{task}: OOD exact match vs length (mean over seeds so far), lr={lr:g}"
        paths += write_figure(accuracy_figure(rows, title=title), out, f"accuracy_by_length_{task}")
    return paths


def table(lr: float | None = None, out: Path | None = None) -> list[Path]:
    """Print and write the search summary, the grid's run table and the comparison with the
    paper (on complete cells) into `out` (default analyses/results/reproduction/tables/)."""
    from _common import print_written, write_figure, write_table

    from nopeinterp.paper import compare_with_paper, mrr_by_side, paper_runs

    runs = records()
    if runs.empty:
        raise NopeinterpError(f"{RECORDS}: no records yet")
    out = Path(out) if out is not None else RECORDS / "tables"
    summary, chosen = search_summary(runs)
    print("LR search (mean best validation exact match over its 10 runs):")
    print(summary.to_string(index=False))
    print(f"chosen rate: {chosen if chosen is not None else 'not yet (search incomplete)'}")
    note = f"Chosen rate: {chosen:g}." if chosen is not None else "Search incomplete."
    paths = write_table(summary, out, "lr_search", title="LR search", notes=note)
    per_run = search_runs_table(runs)
    paths += write_table(
        per_run, out, "lr_search_runs", title="LR search: best validation exact match per run",
        notes="Seed 0; one column per learning rate.",
    )  # fmt: skip
    if lr is None:
        lr = chosen
    if lr is None:
        print_written(paths)
        return paths
    grid_runs = run_grid_table(runs, lr)
    status = {k: int(v) for k, v in grid_runs["status"].value_counts().items()}
    print(f"\nruns at lr={lr:g}: {status}")
    print(grid_runs.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    out = out / lr_folder(lr)
    hours = (grid_runs["train_wall_s"].sum() + grid_runs["test_wall_s"].sum()) / 3600
    done = grid_runs[grid_runs["status"] != "missing"]
    trained = (
        f"{int(done['did_not_train'].sum())} of {len(done)} trained runs below {DID_NOT_TRAIN}"
    )
    at_end = f"{int(done['best_at_last_step'].sum())} with their best checkpoint at the last step"
    n_untimed = int(done["train_wall_s"].isna().sum())
    untimed = (
        f" ({n_untimed} runs without a training time: left out of the sum)" if n_untimed else ""
    )
    paths += write_table(
        grid_runs, out, "runs", title=f"Grid runs at lr={lr:g}",
        notes=f"Status {status}; {hours:.1f} h of run wall time in all{untimed} (training and "
        f"test decoding; test time recorded from 2026-12-03 on). {trained} ('did not train'), "
        f"{at_end}.",
    )  # fmt: skip
    paths += length_tables(lr, out)
    ours = complete_cells(grid_runs)
    if ours.empty:
        print("\nno complete (split, seed) cell yet: no comparison with the paper")
        print_written(paths)
        return paths
    ours_runs = ours[["split", "pe", "seed", "ood_accuracy"]].copy()
    paper = paper_runs()  # read once: the comparison and its sensitivity view
    comparison = compare_with_paper(ours_runs, paper)
    runs_below = ours["did_not_train"].astype(int)  # a count, also where a cell has one seed
    not_trained = runs_below.groupby([ours["split"], ours["pe"]]).sum().rename("did_not_train_ours")
    comparison.table = comparison.table.merge(not_trained.reset_index(), on=["split", "pe"])
    cells = ours.groupby("split")["seed"].nunique().to_dict()
    print(f"\ncompared on complete (split, seed) cells only ({len(ours)} runs; seeds {cells}):")
    for name, df in comparison.tables().items():
        print(f"\n{name}:\n" + df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        paths += write_table(
            df, out, name, title=name.replace("_", " "),
            notes=f"Complete (split, seed) cells only; seeds per split: {cells}.",
        )  # fmt: skip
    paths += write_figure(comparison.figure(), out, "paper_comparison_mrr")
    # A sensitivity view added after the runs started (PROTOCOL.md): tied PEs share their
    # average rank, so a cell where every PE is at 0 gives each 1/3 instead of ranking them by
    # the paper's tie order. The protocol's MRR above stays the primary one.
    averaged = mrr_by_side(
        {"ours": ours_runs, "paper": paper},
        splits=comparison.meta["mrr_splits"], tie_order=None,
        seed=comparison.meta["bootstrap_seed"],
    )  # fmt: skip
    print("\nMRR with tied PEs sharing their average rank (sensitivity view):")
    print(averaged.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    paths += write_table(
        averaged, out, "paper_comparison_mrr_ties_averaged",
        title="MRR with tied PEs sharing their average rank (sensitivity view)",
        notes="Not the protocol's MRR (which breaks ties in the paper's order); added after the "
        f"runs started, because whole cells tie at 0. Seeds per split: {cells}.",
    )  # fmt: skip
    print_written(paths)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search")
    s.add_argument("--workers", type=int, default=1)
    g = sub.add_parser("grid")
    g.add_argument("--lr", type=float, required=True)
    g.add_argument("--workers", type=int, default=1)
    g.add_argument("--splits", nargs="+", choices=list(PAPER_SPLITS), help="default: all ten")
    g.add_argument("--seeds", nargs="+", type=int, choices=list(SEEDS), help="default: 0 1 2")
    t = sub.add_parser("table")
    t.add_argument("--lr", type=float, default=None)
    t.add_argument(
        "--out", type=Path, default=None, help="default analyses/results/reproduction/tables"
    )
    e = sub.add_parser("errors", help="sort the wrong test answers by kind (re-decodes)")
    e.add_argument("--lr", type=float, required=True)
    e.add_argument("--splits", nargs="+", choices=list(PAPER_SPLITS), default=None)
    r = sub.add_parser("rebuild", help="train committed runs again here, for their checkpoints")
    r.add_argument("--lr", type=float, required=True)
    r.add_argument("--splits", nargs="+", choices=list(PAPER_SPLITS), default=list(ANALYSED_SPLITS))
    r.add_argument("--seeds", nargs="+", type=int, choices=list(SEEDS), default=list(SEEDS))
    r.add_argument("--workers", type=int, default=1)
    pl = sub.add_parser("pilot", help="not results: the runs that size the next protocol")
    pl.add_argument("--lrs", nargs="+", type=float, default=list(PILOT_LRS))
    pl.add_argument("--steps", type=int, default=PILOT_STEPS, help="the step cap")
    pl.add_argument("--splits", nargs="+", choices=list(PAPER_SPLITS), default=list(PILOT_SPLITS))
    pl.add_argument("--pes", nargs="+", choices=list(FIVE_PES), default=list(FIVE_PES))
    pl.add_argument("--commit", action="store_true", help="git-commit each finished record")
    pt = sub.add_parser("pilot-table", help="the pilot's runs and validation curves")
    pt.add_argument("--out", type=Path, default=None, help="default results/reproduction/pilot")
    a = sub.add_parser("analyse")
    a.add_argument("--lr", type=float, required=True)
    a.add_argument("--splits", nargs="+", default=list(ANALYSED_SPLITS))
    a.add_argument("--quick", action="store_true", help="few examples: a smoke run")
    args = p.parse_args(argv)
    if args.command == "search":
        search(args.workers)
    elif args.command == "grid":
        run_grid(args.lr, args.workers, args.splits, args.seeds)
    elif args.command == "errors":
        error_kinds(args.lr, args.splits)
    elif args.command == "rebuild":
        rebuild(args.lr, args.splits, args.seeds, args.workers)
    elif args.command == "pilot":
        pilot(args.lrs, args.steps, args.splits, args.commit, args.pes)
    elif args.command == "pilot-table":
        pilot_table(args.out)
    elif args.command == "analyse":
        analyse(args.lr, args.splits, args.quick)
    else:
        table(args.lr, args.out)
    return 0


if __name__ == "__main__":
    from _common import run_script

    run_script(main)
