"""Grids of training runs: `run_sweep` trains (tasks x PEs x seeds) and `collect` reads them.

Layout: `<out>/<run>/model.pt` (the best checkpoint), `<out>/<run>/record.json` (one small
record per finished run: config, versions, wall time, ID/OOD exact match per length), where
`<run>` is `run_name(spec)`, e.g. `copy-nope-seed0` or `copy.variant=rsc-t5-seed1`.
A run with a record is finished and skipped; one with a training state resumes; the trainer's
lock on each checkpoint keeps two sweeps (shards, reruns) from training the same run at once.
`shard=(i, n)` takes every n-th run of the grid starting at i, so n machines or a SLURM array
(`--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`) split a grid with no scheduler here.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import pandas as pd

from nopeinterp.errors import NopeinterpError, check_choice

RECORD = "record.json"
CHECKPOINT = "model.pt"
# Record fields that differ between two runs of the same spec (timing, machine).
NONDETERMINISTIC = (
    "wall_time_s", "run_wall_s", "test_wall_s", "throughput", "versions", "finished_at"
)  # fmt: skip


@dataclass(frozen=True)
class RunSpec:
    task: str
    pe: str
    seed: int
    task_options: tuple = ()  # sorted (key, value) pairs, hashable

    @property
    def options(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.task_options}


def _value(text: str):
    """'3' -> 3, '0.5' -> 0.5, '2-20' -> (2, 20), 'true' -> True, else the string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    lo, sep, hi = text.partition("-")
    if sep and lo.isdigit() and hi.isdigit():
        return (int(lo), int(hi))
    return text


def parse_task_spec(text: str) -> tuple[str, dict]:
    """'copy' -> ('copy', {}); 'copy:variant=rsc,id_lengths=2-20' -> ('copy', {...}).

    Options go to the task's constructor (`get_task(name, **options)`); 'a-b' is a range.
    """
    from nopeinterp.training.config import check_task_name

    name, _, rest = text.partition(":")
    check_task_name(name, text)
    options = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier() or not value:
            raise NopeinterpError(
                f"bad task option {item!r} in {text!r} (use e.g. copy:variant=rsc,id_lengths=2-20)"
            )
        options[key] = _value(value)
    from nopeinterp.tasks import get_task

    get_task(name, **options)  # a bad option (e.g. an unknown scratchpad letter) stops here
    return name, options


def run_name(spec: RunSpec) -> str:
    """The run's folder name: <task>[.<k>=<v>...]-<pe>-seed<seed>."""
    opts = "".join(
        f".{k}={'-'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in spec.task_options
    )
    return f"{spec.task}{opts}-{spec.pe}-seed{spec.seed}"


def grid(tasks, pes, seeds) -> list[RunSpec]:
    """Every (task spec, PE, seed), in that nesting order; `tasks` are spec strings."""
    from nopeinterp.training.config import check_pe

    for pe in pes:
        check_pe(pe)
    runs = []
    for text in tasks:
        name, options = parse_task_spec(text)
        opts = tuple(sorted(options.items()))
        runs += [RunSpec(name, pe, int(seed), opts) for pe in pes for seed in seeds]
    if len(set(runs)) != len(runs):
        raise NopeinterpError("the grid names a run twice (repeated task, PE or seed)")
    return runs


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' with 0 <= i < n."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise NopeinterpError(f"bad shard {text!r}: use i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise NopeinterpError(f"bad shard {text!r}: need 0 <= i < n")
    return i, n


@dataclass
class SweepPlan:
    out: Path
    runs: list[RunSpec]
    preset: str | None = None
    overrides: dict = field(default_factory=dict)  # TrainConfig values for every run
    eval_n: int = 100  # examples per length in the record's exact match
    # the record's exact match: "sampled" (eval_n per ID and OOD length, `evaluate`),
    # "eval_set" (the task's test set, every item once: the reproduction protocol) or "none"
    # (no test decoded: a learning-rate search; a later sweep with "eval_set" adds it)
    test: str = "sampled"


TESTS = ("sampled", "eval_set", "none")
# what the log adds to a status
_EXPLAINED = {"busy": " (another process holds this run: left to it)"}


def _write_json(path: Path, data: dict) -> None:
    from nopeinterp._io import atomic_write

    atomic_write(path, lambda t: Path(t).write_text(json.dumps(data, indent=1, sort_keys=True)))


def run_one(plan: SweepPlan, spec: RunSpec, threads: int | None = None) -> str:
    """Train (or resume) one run, evaluate it and write its record. Returns its status:
    'skipped' (a record exists), 'finished', 'tested' (a test set added to its record),
    'interrupted' (stopped early: no record) or 'busy' (another process holds the run).

    The run is claimed (its checkpoint's lock) from the first look at its record to the
    record's write, so two sweeps over one folder never both finish, test or record it."""
    import torch

    from nopeinterp.training.trainer import RunLockedError, _lock

    if threads:
        torch.set_num_threads(threads)
    ckpt = plan.out / run_name(spec) / CHECKPOINT
    try:
        claim = _lock(ckpt)
    except RunLockedError:
        return "busy"
    try:
        return _run_claimed(plan, spec)
    finally:
        claim.release()


def _run_claimed(plan: SweepPlan, spec: RunSpec) -> str:
    from nopeinterp._io import versions
    from nopeinterp.training.trainer import RUN_ONLY, make_config, train, validation_curve_path

    folder = plan.out / run_name(spec)
    record_path, ckpt = folder / RECORD, folder / CHECKPOINT
    if record_path.exists():
        if plan.test != "eval_set":
            return "skipped"
        return "tested" if _add_test(record_path, ckpt) else "skipped"
    state = ckpt.with_name(ckpt.name + ".state.pt")
    options = {**plan.overrides.get("task_options", {}), **spec.options}
    overrides = {**plan.overrides, "task_options": options, "seed": spec.seed, "progress": False}
    cfg = make_config(spec.task, spec.pe, ckpt, preset=plan.preset, **overrides)
    t0 = time.time()
    resumed_wall = 0.0
    trains_here = state.exists() or not ckpt.exists()
    if trains_here:
        cfg.resume = True
        resumed_wall = _state_wall(state)
        train(cfg, lock=False)  # the run's lock is ours already
    if state.exists():
        return "interrupted"
    from nopeinterp.checkpoint import load_checkpoint

    meta = load_checkpoint(ckpt).meta
    curve_path = validation_curve_path(ckpt)
    curve = json.loads(curve_path.read_text()) if curve_path.exists() else None
    record = {
        "run": folder.name,
        "task": spec.task,
        "task_options": spec.options,
        "split": spec.options.get("variant", spec.task),
        "pe": spec.pe,
        "seed": spec.seed,
        "preset": plan.preset,
        "config": {k: v for k, v in cfg.to_dict().items() if k not in RUN_ONLY},
        "lr": cfg.lr,
        "steps": cfg.steps,
        "best_step": meta.get("step"),
        "val_accuracy": meta.get("val_accuracy"),
        "val_loss": meta.get("val_loss"),  # the lm task's selection score
        "val_items": meta.get("val_items"),
        "val_history": meta.get("history"),  # up to the best step: was it still rising?
        # every validation to the end (None: trained before the trainer kept them), and the
        # step training ended at (below `steps` when it stopped early on `stop_at_val`)
        "val_curve": curve["history"] if curve else None,
        "steps_run": curve["history"][-1]["step"] if curve and curve["history"] else None,
        "stopped_early": curve["stopped_early"] if curve else None,
        "test": plan.test,
        "eval_n": plan.eval_n if plan.test == "sampled" else None,
        "accuracy": [],
        "ood_accuracy": None,
        "test_items": None,
        "wall_time_s": meta.get("wall_time_s", round(time.time() - t0, 1)),
        # training to the end: this call, plus the saved training time of earlier calls it
        # resumed (the steps redone after an interruption count once); None: the training
        # ended in an earlier call stopped before its record was written, time not saved
        "run_wall_s": round(resumed_wall + time.time() - t0, 1) if trains_here else None,
        "throughput": meta.get("throughput"),
        "versions": versions(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if spec.task == "lm":  # no exact match to decode: lm-eval measures a language model
        record["test"] = "none"
    elif plan.test != "none":
        n = plan.eval_n if plan.test == "sampled" else None
        record.update(_test_fields(ckpt, n, spec.task, options))
    _write_json(record_path, record)
    return "finished"


def _test_fields(ckpt: Path, n: int | None, task: str, options: dict) -> dict:
    """The record's exact match of the checkpoint: per length (`accuracy`) and over all OOD
    items (`ood_accuracy`, correct / items, and `test_items`). `n=None`: the task's test set
    (`Task.eval_set("test")`) only; an int: `n` sampled examples per ID and OOD length."""
    from nopeinterp.checkpoint import load_checkpoint
    from nopeinterp.evaluation import DECODE_BOUND, evaluate

    t0 = time.time()
    checkpoint = load_checkpoint(ckpt)
    lengths = None
    if n is None:  # the test set only: OOD lengths
        from nopeinterp.data import task_lengths
        from nopeinterp.tasks import get_task

        t = get_task(task, **options)
        lengths = [x for x in task_lengths(t) if x >= t.ood_lengths[0]]
    table = evaluate(checkpoint, n=n, lengths=lengths, progress=False).table
    steps = ("steps_right", "all_steps_right", "first_wrong_step")  # with a scratchpad
    rows = [
        {k: _json_value(row[k]) for k in ("length", "split", "n", "correct", "accuracy")}
        | {"evaluable": bool(row["evaluable"])}
        | {k: _json_value(row[k]) for k in steps if k in row}
        for row in table.to_dict("records")
    ]
    ood = [r for r in rows if r["split"] == "OOD"]
    items = sum(r["n"] for r in ood)
    return {
        "accuracy": rows,
        "ood_accuracy": sum(r["correct"] for r in ood) / items if items else None,
        "test_items": items,
        "test_wall_s": round(time.time() - t0, 1),
        "decode_bound": DECODE_BOUND,
    }


def _state_wall(state: Path) -> float:
    """Training seconds saved in an interrupted run's state; 0 without a readable one (gone,
    because another process finished the run; or damaged, which the trainer then reports)."""
    from nopeinterp.checkpoint import load_training_state
    from nopeinterp.errors import CheckpointError

    if not state.exists():
        return 0.0
    try:
        return float(load_training_state(state, required=("wall",))["wall"])
    except CheckpointError:
        return 0.0


def _add_test(record_path: Path, ckpt: Path) -> bool:
    """Add the test set's exact match to a record written without it ("none"); False when it
    has one already."""
    record = json.loads(record_path.read_text())
    if record.get("test") != "none":
        return False
    if not ckpt.exists():
        raise NopeinterpError(f"{record_path}: no test set decoded and no checkpoint {ckpt}")
    fields = _test_fields(ckpt, None, record["task"], record["config"]["task_options"])
    record.update(fields, test="eval_set", eval_n=None)
    _write_json(record_path, record)
    return True


def retest(record_path: Path, ckpt: Path) -> bool:
    """Decode a record's test set again with today's decode bound (`evaluation.DECODE_BOUND`),
    when the record's test used another; the earlier test's fields stay in the record under
    `previous_test`. False when the record's bound is today's already."""
    from nopeinterp.evaluation import DECODE_BOUND

    record = json.loads(record_path.read_text())
    if record.get("decode_bound") == DECODE_BOUND:
        return False
    if record.get("test") != "eval_set" or record.get("eval_n") is not None:
        raise NopeinterpError(f"{record_path}: only a record of the task's test set is retested")
    if not ckpt.exists():
        raise NopeinterpError(f"{record_path}: no checkpoint {ckpt} to test again")
    fields = _test_fields(ckpt, None, record["task"], record["config"]["task_options"])
    previous = {k: record[k] for k in fields if k in record}  # what this test replaces
    record.update(fields, previous_test=previous)
    _write_json(record_path, record)
    return True


def _json_value(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v != v:
        return None  # NaN (not evaluable) -> null
    return v


def run_sweep(
    tasks,
    pes,
    seeds,
    out,
    *,
    preset: str | None = None,
    overrides: dict | None = None,
    workers: int = 1,
    shard: tuple[int, int] = (0, 1),
    eval_n: int = 100,
    test: str = "sampled",
    log=print,
) -> dict[str, str]:
    """Run this shard of the grid with `workers` processes; {run name: status}.

    Each worker gets cpu_count // workers torch threads. Safe to rerun: finished runs are
    skipped, interrupted ones resume.
    """
    from nopeinterp.training.trainer import make_config

    if workers < 1 or eval_n < 1:
        raise NopeinterpError(f"workers={workers}, eval_n={eval_n}: both must be >= 1")
    check_choice(test, TESTS, "test")
    runs = grid(tasks, pes, seeds)
    i, n = shard
    runs = runs[i::n]
    overrides = dict(overrides or {})
    # Every setting checked before any run starts (bad values fail here, once).
    for spec in runs:
        opts = {**overrides.get("task_options", {}), **spec.options}
        make_config(
            spec.task,
            spec.pe,
            Path(out) / run_name(spec) / CHECKPOINT,
            preset=preset,
            **{**overrides, "task_options": opts, "seed": spec.seed},
        )
    plan = SweepPlan(Path(out), runs, preset, overrides, eval_n, test)
    plan.out.mkdir(parents=True, exist_ok=True)
    statuses: dict[str, str] = {}
    if workers <= 1:
        for spec in runs:
            statuses[run_name(spec)] = status = run_one(plan, spec)
            log(f"{run_name(spec)}: {status}{_EXPLAINED.get(status, '')}")
        return statuses
    threads = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {run_name(s): pool.submit(run_one, plan, s, threads) for s in runs}
        for name, future in futures.items():
            statuses[name] = status = future.result()
            log(f"{name}: {status}{_EXPLAINED.get(status, '')}")
    return statuses


def collect(directory) -> pd.DataFrame:
    """Every record under `directory` as one tidy table: one row per (run, length)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NopeinterpError(f"{directory}: no such directory")
    rows = []
    for path in sorted(directory.rglob(RECORD)):
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict):
                raise ValueError("not an object")
            base = {
                "run": record["run"],
                "task": record["task"],
                "task_options": json.dumps(record["task_options"], sort_keys=True),
                "pe": record["pe"],
                "seed": record["seed"],
                "preset": record.get("preset"),
                "steps": record["config"]["steps"],
                "best_step": record.get("best_step"),
                "val_accuracy": record.get("val_accuracy"),
                "wall_time_s": record.get("wall_time_s"),
            }
            rows += [{**base, **acc} for acc in record["accuracy"]]
        except (ValueError, KeyError, TypeError) as e:
            raise NopeinterpError(f"{path}: not a sweep record ({type(e).__name__}: {e})") from None
    if not rows:
        raise NopeinterpError(f"{directory}: no sweep records ({RECORD}) found")
    return pd.DataFrame(rows)


def summarize_runs(table: pd.DataFrame) -> pd.DataFrame:
    """ID / OOD exact match per run: mean over evaluable lengths, weighted by examples."""
    ok = table[table["evaluable"]]
    g = ok.groupby(["run", "task", "task_options", "pe", "seed", "split"], sort=True)
    wide = (g["correct"].sum() / g["n"].sum()).unstack("split")
    return wide.reset_index()
