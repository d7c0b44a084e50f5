"""Reproduction v3: converged models at the paper's head width, as analyses/PROTOCOL.md
("Protocol of the reproduction grid, version 3") fixes it.

    python analyses/reproduction_v3.py grid [--commit] [--workers 1]   # on CPU, resumable
        [--splits rsc mc] [--seeds 0]                                  # a part (same runs)
    python analyses/reproduction_v3.py gpu [--workers 8] [--commit]    # on a GPU node, bf16
    python analyses/reproduction_v3.py table                           # tables, comparison

Every run: `--preset repro-t5` (the paper's T5 decoder, 4 layers, 2 heads of 64, d_model 128),
learning rate V3_LR, trained until ID validation exact match >= 0.95 on two evaluations in a
row or V3_STEPS (best-by-validation checkpoint tested, as the paper). Checkpoints go under
runs/reproduction/v3/ (git-ignored); each finished run's record is copied to
analyses/results/reproduction/v3/lr=<lr>/<run>.json and, with `--commit`, committed at once,
so any machine resumes the grid where the last one stopped (a run whose record is committed
is not run again). The order: seed 0 of every (split, PE), then seed 1, then seed 2.

`gpu` first trains one short run (V3_CHECK) on the CPU in fp32 and on the GPU in bf16 and
stops (exit 2) unless their training losses agree (GPU_CHECK_RTOL); then it runs the grid with
`--workers` runs at once on the one GPU, in bf16 autocast, writing records in the same place
and format (each record's config says its precision, its throughput its device).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from nopeinterp.errors import NopeinterpError
from nopeinterp.paper import FIVE_PES
from nopeinterp.training.sweep import RECORD, run_name, run_sweep

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reproduction as repro  # noqa: E402

PRESET = "repro-t5"
V3_SPLITS = ("rsc", "rdc", "mc", "mdlen")
V3_SEEDS = (0, 1, 2)
V3_LR = 1e-3
V3_STEPS = 8000
V3_STOP = repro.PILOT_STOP  # ID validation exact match >= 0.95 on two evaluations in a row
V3_TARGET = V3_STOP["stop_at_val"]
V3 = Path("v3")  # the grid's folder under runs/reproduction/ and results/reproduction/
# the GPU's short agreement run: (split, PE, seed, steps)
V3_CHECK = ("rsc", "nope", 0, 600)
GPU_CHECK_RTOL = 0.15  # mean training loss over the check's last half, GPU vs CPU


def overrides(**extra) -> dict:
    return {"lr": V3_LR, "steps": V3_STEPS, **V3_STOP, **extra}


def v3_runs(splits=V3_SPLITS, seeds=V3_SEEDS) -> list[str]:
    """The run names of the grid (or a part), in the protocol's order (seed-major)."""
    return [
        run_name(spec)
        for seed in seeds
        for split in splits
        for spec in repro.split_runs(split, [seed])
    ]


def _check_part(splits, seeds) -> tuple[list[str], list[int]]:
    splits = list(V3_SPLITS if splits is None else splits)
    seeds = list(V3_SEEDS if seeds is None else seeds)
    bad = [s for s in splits if s not in V3_SPLITS] + [str(s) for s in seeds if s not in V3_SEEDS]
    if bad:
        raise NopeinterpError(
            f"not in the protocol: {', '.join(bad)} (splits {', '.join(V3_SPLITS)}; "
            f"seeds {', '.join(map(str, V3_SEEDS))})"
        )
    return [s for s in V3_SPLITS if s in splits], [s for s in V3_SEEDS if s in seeds]


def run_grid(splits=None, seeds=None, workers=1, commit=False, extra=None) -> None:
    """The grid (or a part) in the protocol's order; resumable; `extra`: run-only settings
    (device, precision) that change no setting of the protocol."""
    splits, seeds = _check_part(splits, seeds)
    folder = V3 / repro.lr_folder(V3_LR)
    wanted = set(v3_runs(splits, seeds))
    for run in repro.restore_records(V3_LR, wanted, tested_only=True, folder=folder):
        print(f"{run}: committed record restored", flush=True)

    def log(line: str) -> None:
        print(line, flush=True)
        run, _, status = line.partition(": ")
        if status in ("finished", "tested") and (repro.RUNS / folder / run / RECORD).exists():
            dest = repro.RECORDS / folder / f"{run}.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repro.RUNS / folder / run / RECORD, dest)
            if commit:
                repro.commit_records([dest], f"reproduction v3: record of {run}")

    for seed in seeds:
        run_sweep(
            [repro.task_spec(s) for s in splits], FIVE_PES, [seed], repro.RUNS / folder,
            preset=PRESET, overrides=overrides(**(extra or {})), workers=workers,
            test="eval_set", log=log,
        )  # fmt: skip


GPU_CHECK_DEVICES = (("cpu", "fp32"), ("cuda", "bf16"))  # (device, precision): reference, GPU


def gpu_check(out: Path | None = None, devices=GPU_CHECK_DEVICES) -> dict:
    """One short run on the CPU (fp32) and on the GPU (bf16): their training-loss curves, and
    whether the mean over the last half agrees within GPU_CHECK_RTOL. Dropout draws differ
    between the devices' generators, so the curves are close, not equal."""
    split, pe, seed, steps = V3_CHECK
    out = Path(out) if out is not None else repro.RUNS / V3 / "gpu-check"
    curves = {}
    for device, precision in devices:
        folder = out / f"{device}-{precision}"
        run_sweep(
            [repro.task_spec(split)], [pe], [seed], folder, preset=PRESET,
            overrides={"lr": V3_LR, "steps": steps, "device": device, "precision": precision},
            test="none", log=lambda line, d=device: print(f"[gpu check, {d}] {line}", flush=True),
        )  # fmt: skip
        (record,) = folder.glob(f"*/{RECORD}")
        curves[f"{device}-{precision}"] = json.loads(record.read_text())["val_curve"]
    late = {d: [h["loss"] for h in c if h["step"] > steps // 2] for d, c in curves.items()}
    mean = {d: sum(v) / len(v) for d, v in late.items()}
    ref, other = mean.values()
    rel = abs(other - ref) / ref
    return {
        "run": f"{split} {pe} seed {seed}, {steps} steps",
        "mean_late_loss": mean,
        "relative_difference": rel,
        "rtol": GPU_CHECK_RTOL,
        "agree": rel <= GPU_CHECK_RTOL,
        "curves": curves,
    }


def run_gpu(workers: int, commit: bool) -> None:
    if not torch.cuda.is_available():
        raise NopeinterpError("gpu: no CUDA device here; run `grid` on a CPU machine")
    check = gpu_check()
    path = repro.RECORDS / V3 / "gpu_check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(check, indent=1) + "\n")
    losses = ", ".join(f"{k} {v:.4f}" for k, v in check["mean_late_loss"].items())
    print(
        f"gpu check: mean training loss over the last half: {losses}; relative difference "
        f"{check['relative_difference']:.3f} (rtol {GPU_CHECK_RTOL})",
        flush=True,
    )
    if not check["agree"]:
        raise NopeinterpError(
            f"gpu: the GPU's short run disagrees with the CPU's (see {path}); no grid run started"
        )
    if commit:
        repro.commit_records([path], "reproduction v3: the GPU's agreement check")
    run_grid(workers=workers, commit=commit, extra={"device": "cuda", "precision": "bf16"})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grid", help="the grid on this machine's CPU (resumable)")
    g.add_argument("--splits", nargs="+", choices=list(V3_SPLITS), default=None)
    g.add_argument("--seeds", nargs="+", type=int, choices=list(V3_SEEDS), default=None)
    g.add_argument("--workers", type=int, default=1)
    g.add_argument("--commit", action="store_true", help="git-commit each finished record")
    u = sub.add_parser("gpu", help="check a short run against the CPU, then the grid on a GPU")
    u.add_argument("--workers", type=int, default=8, help="runs at once on the GPU")
    u.add_argument("--commit", action="store_true", help="git-commit each finished record")
    args = p.parse_args(argv)
    try:
        if args.command == "grid":
            run_grid(args.splits, args.seeds, args.workers, args.commit)
        elif args.command == "gpu":
            run_gpu(args.workers, args.commit)
    except NopeinterpError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
