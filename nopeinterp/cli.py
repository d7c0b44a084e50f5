"""`nopeinterp` command line: a thin shell over the package API.

Every subcommand parses its arguments, calls the same function a notebook would, prints the
resulting table and, with --out, saves it. User errors (NopeinterpError, ValueError, missing
files) print one line on stderr and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nopeinterp
from nopeinterp.errors import NopeinterpError


def parse_lengths(text: str) -> list[int]:
    """'2-40' -> [2..40]; '5,10,20' -> [5, 10, 20]; '8' -> [8]."""
    lengths: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                lengths.extend(range(lo, hi + 1))
            else:
                lengths.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid lengths {text!r} (use e.g. 2-40 or 5,10,20)"
        ) from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"invalid lengths {text!r}: lengths must be >= 1")
    return lengths


def parse_layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid layers {text!r} (use e.g. 0,1,2)") from None


# --- subcommands ------------------------------------------------------------------------------
def cmd_info(args) -> int:
    ckpt = nopeinterp.load_checkpoint(args.checkpoint)
    model = ckpt.model
    n_params = sum(p.numel() for p in model.parameters())
    print(f"checkpoint: {args.checkpoint}")
    print(f"pe:         {ckpt.pe}")
    print(f"parameters: {n_params:,}")
    print("config:     " + ", ".join(f"{k}={v}" for k, v in ckpt.meta["config"].items()))
    for key, value in ckpt.meta.items():
        if key not in ("pe", "config"):
            print(f"{key + ':':<12}{value}")
    return 0


def _train_overrides(args) -> dict:
    """The TrainConfig values given on the command line (absent flags stay absent)."""
    given = dict(vars(args))
    pe_options = {
        key: given.pop(flag)
        for flag, key in (("num_buckets", "num_buckets"), ("rotary_fraction", "fraction"))
        if flag in given
    }
    task_options = {
        key: [min(given[flag]), max(given.pop(flag))]
        for flag, key in (("train_lengths", "id_lengths"), ("ood_lengths", "ood_lengths"))
        if flag in given
    }
    from nopeinterp.training import TrainConfig

    fields = set(TrainConfig.__dataclass_fields__) - {"task", "pe", "out", "preset"}
    values = {k: v for k, v in given.items() if k in fields}
    return {
        **values,
        **({"pe_options": pe_options} if pe_options else {}),
        **({"task_options": task_options} if task_options else {}),
    }


def cmd_train(args) -> int:
    from nopeinterp.training import make_config, train
    from nopeinterp.training.sweep import parse_task_spec

    task, options = parse_task_spec(args.task)
    overrides = _train_overrides(args)
    overrides["task_options"] = {**options, **overrides.get("task_options", {})}
    path = train(make_config(task, args.pe, args.out, preset=args.preset, **overrides))
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one line
        print(f"best checkpoint: {path}")
    return 0


def cmd_sweep(args) -> int:
    from nopeinterp.training.sweep import parse_shard, run_sweep

    statuses = run_sweep(
        args.tasks,
        args.pes,
        args.seeds,
        args.out,
        preset=args.preset,
        overrides=_train_overrides(args),
        workers=args.workers,
        shard=parse_shard(args.shard),
        eval_n=args.eval_n_record,
    )
    counts = {s: list(statuses.values()).count(s) for s in dict.fromkeys(statuses.values())}
    print(", ".join(f"{n} {s}" for s, n in counts.items()) or "no runs in this shard")
    return 0


def cmd_collect(args) -> int:
    from nopeinterp.training.sweep import collect, summarize_runs

    table = collect(args.directory)
    print(summarize_runs(table).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    out = Path(args.out) if args.out else Path(args.directory) / "records.csv"
    from nopeinterp.viz.html import atomic_write_text

    atomic_write_text(out, table.to_csv(index=False))
    print(f"wrote {out}")
    return 0


def _add_train_flags(p) -> None:
    """TrainConfig flags of train and sweep; a flag not given leaves the preset's value."""
    from nopeinterp.training.presets import PRESETS
    from nopeinterp.training.runtime import DEVICES, PRECISIONS

    S = argparse.SUPPRESS
    p.add_argument("--preset", choices=PRESETS, default=None, help="paper, reference or tiny")
    for flag, kind in (
        ("--steps", int),
        ("--batch-size", int),
        ("--lr", float),
        ("--weight-decay", float),
        ("--warmup", float),
        ("--n-layers", int),
        ("--n-heads", int),
        ("--d-model", int),
        ("--d-mlp", int),
        ("--dropout", float),
        ("--eval-every", int),
        ("--eval-n", int),
        ("--checkpoint-every", int),
        ("--grad-accum", int),
    ):
        p.add_argument(flag, type=kind, default=S)
    p.add_argument("--attn-scale", action=argparse.BooleanOptionalAction, default=S)
    p.add_argument("--num-buckets", type=int, default=S, help="t5 only")
    p.add_argument("--rotary-fraction", type=float, default=S, help="rotary only")
    p.add_argument("--train-lengths", type=parse_lengths, default=S, help="e.g. 2-20")
    p.add_argument("--ood-lengths", type=parse_lengths, default=S, help="e.g. 21-40")
    p.add_argument("--dtype", choices=("float32", "float16"), default=S, help="of the checkpoint")
    p.add_argument("--device", choices=DEVICES, default=S)
    p.add_argument("--precision", choices=PRECISIONS, default=S, help="autocast precision")


def cmd_eval(args) -> int:
    from nopeinterp.evaluation import evaluate, save_evaluation, summarize

    table = evaluate(args.checkpoint, lengths=args.lengths, n=args.n, batch_size=args.batch_size)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print()
    print(summarize(table).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        for path in save_evaluation(table, args.out):
            print(f"wrote {path}")
    return 0


def checkpoint_paths(path) -> list[Path]:
    """A checkpoint file, or every checkpoint (*.pt, *.safetensors) in a directory."""
    path = Path(path)
    if path.is_dir():
        found = sorted(
            p
            for p in path.iterdir()
            if p.suffix in (".pt", ".safetensors") and not p.name.endswith(".state.pt")
        )
        if not found:
            raise NopeinterpError(f"{path}: no checkpoints (*.pt, *.safetensors) in this directory")
        return found
    return [path]


def _length_range(lengths):
    return (min(lengths), max(lengths)) if lengths else None


def _fmt(df) -> str:
    return df.to_string(float_format=lambda v: f"{v:.3f}")


def cmd_probe_position(args) -> int:
    import pandas as pd

    from nopeinterp.probing import probe_position_checkpoint

    tables, pivots = [], []
    for path in checkpoint_paths(args.checkpoint):
        ckpt = nopeinterp.load_checkpoint(path)
        result = probe_position_checkpoint(
            ckpt,
            layers=args.layers,
            id_lengths=_length_range(args.train_lengths),
            ood_lengths=_length_range(args.lengths),
            n_train=args.n_train,
            n_eval=args.n_eval,
        )
        tables.append(result.table.assign(checkpoint=path.stem))
        pivots.append(
            result.pivot()
            .assign(checkpoint=path.stem)
            .reset_index()
            .set_index(["checkpoint", "layer"])
        )
        if args.out:
            result.save(
                Path(args.out) / path.stem
                if len(tables) > 1 or Path(args.checkpoint).is_dir()
                else args.out
            )
    print(_fmt(pd.concat(pivots)))
    if args.out:
        from nopeinterp.viz.html import atomic_write_text

        atomic_write_text(
            Path(args.out) / "probe_position_all.csv", pd.concat(tables).to_csv(index=False)
        )
        print(f"wrote {args.out}")
    return 0


def cmd_probe_distance(args) -> int:
    import pandas as pd

    from nopeinterp.probing import distance_dependence_checkpoint

    tables = []
    for path in checkpoint_paths(args.checkpoint):
        ckpt = nopeinterp.load_checkpoint(path)
        result = distance_dependence_checkpoint(ckpt, layers=args.layers)
        tables.append(result.table.assign(checkpoint=path.stem))
        if args.out:
            result.save(Path(args.out) / path.stem if Path(args.checkpoint).is_dir() else args.out)
    table = pd.concat(tables)
    wide = table.pivot_table(index=["checkpoint", "split", "layer"], columns="head", values="score")
    wide.columns = [f"head {h}" for h in wide.columns]
    print(_fmt(wide))
    if args.out:
        from nopeinterp.viz.html import atomic_write_text

        atomic_write_text(Path(args.out) / "distance_all.csv", table.to_csv(index=False))
        print(f"wrote {args.out}")
    return 0


def resolve_refs(refs: list[str], directory: Path, task: str | None) -> dict[str, Path]:
    """--ref values -> {name: path}. A PE name is looked up as <task>-<pe>.pt in `directory`."""
    from nopeinterp.models import PE_TYPES

    available = {}
    if directory.is_dir():
        for p in sorted(directory.glob(f"{task}-*.pt" if task else "*.pt")):
            if p.name.endswith(".state.pt"):
                continue
            pe = p.stem.split("-", 1)[1] if "-" in p.stem else p.stem
            available.setdefault(pe, p)
    out: dict[str, Path] = {}
    for ref in refs:
        if ref == "all":
            out.update({pe: p for pe, p in available.items() if pe in PE_TYPES and pe != "nope"})
        elif Path(ref).suffix in (".pt", ".safetensors") or Path(ref).exists():
            out[Path(ref).stem] = Path(ref)
        elif ref in available:
            out[ref] = available[ref]
        else:
            names = ", ".join(sorted(available)) or "none"
            raise NopeinterpError(
                f"unknown ref {ref!r}: no {task or '*'}-{ref}.pt in {directory} (available: {names})"
            )
    if not out:
        raise NopeinterpError(f"no reference checkpoints found in {directory}")
    return out


def default_nope(directory: Path, task: str | None) -> Path:
    """<task>-nope.pt; without a task, scan's (the paper's analysis) or the only one there."""
    if task:
        return directory / f"{task}-nope.pt"
    found = sorted(directory.glob("*-nope.pt")) if directory.is_dir() else []
    if not found:
        raise NopeinterpError(f"no NoPE checkpoint (*-nope.pt) in {directory}; give --nope PATH")
    by_task = {p.name.removesuffix("-nope.pt"): p for p in found}
    return by_task.get("scan", found[0]) if len(found) > 1 and "scan" in by_task else found[0]


def cmd_compare_attention(args) -> int:
    from nopeinterp.similarity import attention_data, compare_attention

    directory = Path(args.checkpoints)
    task = args.task
    nope_path = Path(args.nope) if args.nope else default_nope(directory, task)
    nope = nopeinterp.load_checkpoint(nope_path)
    task = task or nope.task
    refs = resolve_refs(args.ref, directory, task)
    refs.pop("nope", None)
    prime = args.nope_prime
    if prime is None and (directory / f"{task}-nope-seed1.pt").exists():
        prime = directory / f"{task}-nope-seed1.pt"
    refs.pop("nope-seed1", None)
    from nopeinterp.tasks import get_task

    data = list(
        attention_data(
            get_task(task, **nope.meta.get("task_options", {})),
            nope.tokenizer,
            n_per_length=args.n_per_length,
            seed=args.seed,
        )
    )
    if not data:
        raise NopeinterpError(f"empty data set for task {task!r}")
    result = compare_attention(
        nope,
        {name: str(p) for name, p in refs.items()},
        data,
        nope_prime=str(prime) if prime else None,
        heads=args.heads,
        paper_compat=args.paper_compat,
        seed=args.seed,
    )
    print(f"attention divergence from NoPE ({result.metric}, heads={result.reducer}), {task}:")
    print(result.ranking.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        report = result.save(args.out, title=f"NoPE attention similarity: {task}")
        print(f"wrote {report}")
    return 0


def cmd_report(args) -> int:
    from nopeinterp.main_job import run_main_job

    run_main_job(args.checkpoints, args.out, n_eval=args.n_eval, n_per_length=args.n_per_length)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nopeinterp",
        description="Train, probe and compare Transformers that differ only in positional encoding.",
    )
    parser.add_argument(
        "--version", action="version", version=f"nopeinterp {nopeinterp.__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("info", help="print a checkpoint's PE, config, parameter count and meta")
    p.add_argument("checkpoint")
    p.set_defaults(func=cmd_info)

    from nopeinterp.models import PE_TYPES
    from nopeinterp.tasks import TASKS

    p = sub.add_parser("train", help="train one model on one task (torchrun: data parallel)")
    p.add_argument("--task", required=True, help=f"{', '.join(TASKS)}[:option=value,...]")
    p.add_argument("--pe", required=True, choices=PE_TYPES)
    p.add_argument("--out", required=True, help="path of the best checkpoint (.pt)")
    p.add_argument("--seed", type=int, default=argparse.SUPPRESS)
    _add_train_flags(p)
    p.add_argument("--resume", action="store_true", help="continue from <out>.state.pt")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sweep", help="train a grid of tasks x PEs x seeds, resumably")
    p.add_argument("--tasks", nargs="+", required=True, help="task specs, e.g. copy:variant=rsc")
    p.add_argument("--pes", nargs="+", required=True, choices=PE_TYPES)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--out", required=True, help="directory: one folder per run")
    p.add_argument("--workers", type=int, default=1, help="local worker processes")
    p.add_argument("--shard", default="0/1", help="i/n: this process's share of the grid")
    p.add_argument("--eval-n-record", type=int, default=100, help="examples per length")
    _add_train_flags(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("collect", help="gather a sweep's records into one table (CSV)")
    p.add_argument("directory")
    p.add_argument("--out", default=None, help="CSV path (default: DIRECTORY/records.csv)")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("eval", help="exact-match accuracy per length (greedy decoding)")
    p.add_argument("checkpoint")
    p.add_argument("--lengths", type=parse_lengths, default=None, help="default: ID and OOD ranges")
    p.add_argument("--n", type=int, default=200, help="examples per length")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", default=None, help="directory for CSV + HTML")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "probe-position", help="linear probes for absolute position, per layer (Theorem 1)"
    )
    p.add_argument("checkpoint", help="a checkpoint, or a directory: every checkpoint in it")
    p.add_argument(
        "--layers", type=parse_layers, default=None, help="0 = embeddings, l = after block l"
    )
    p.add_argument(
        "--train-lengths",
        type=parse_lengths,
        default=None,
        help="probe fit lengths (default: task ID)",
    )
    p.add_argument(
        "--lengths", type=parse_lengths, default=None, help="OOD lengths (default: task OOD)"
    )
    p.add_argument("--n-train", type=int, default=512, help="sequences to fit on")
    p.add_argument("--n-eval", type=int, default=256, help="sequences per evaluation split")
    p.add_argument("--out", default=None, help="directory for CSV + HTML")
    p.set_defaults(func=cmd_probe_position)

    p = sub.add_parser(
        "probe-distance", help="how much attention logits depend on n-m only (Theorem 2)"
    )
    p.add_argument("checkpoint", help="a checkpoint, or a directory: every checkpoint in it")
    p.add_argument("--layers", type=parse_layers, default=None)
    p.add_argument("--out", default=None, help="directory for CSV + HTML")
    p.set_defaults(func=cmd_probe_distance)

    p = sub.add_parser(
        "compare-attention", help="JSD between NoPE's attention and each reference PE"
    )
    p.add_argument(
        "--ref",
        action="append",
        required=True,
        help="PE name, checkpoint path, or 'all' (repeatable)",
    )
    p.add_argument("--checkpoints", default="checkpoints", help="where PE names are looked up")
    p.add_argument("--nope", default=None, help="NoPE checkpoint (default: <dir>/<task>-nope.pt)")
    p.add_argument(
        "--nope-prime",
        default=None,
        help="second NoPE seed (default: <dir>/<task>-nope-seed1.pt if present)",
    )
    p.add_argument("--task", default=None, help="default: the NoPE checkpoint's task")
    p.add_argument("--n-per-length", type=int, default=10)
    p.add_argument("--heads", choices=("min", "hungarian", "same"), default="min")
    p.add_argument(
        "--paper-compat", action="store_true", help="the official code's formula and head pairing"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for CSV + HTML report")
    p.set_defaults(func=cmd_compare_attention)

    p = sub.add_parser("report", help="the main job: every analysis on a checkpoint directory")
    p.add_argument("--checkpoints", default="checkpoints")
    p.add_argument("--out", default="reports/main")
    p.add_argument("--n-eval", type=int, default=20, help="examples per length for exact match")
    p.add_argument("--n-per-length", type=int, default=10, help="examples per length for JSD")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except (NopeinterpError, ValueError, FileNotFoundError, NotADirectoryError) as e:
        print(f"nopeinterp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nopeinterp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
