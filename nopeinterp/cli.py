"""`nopeinterp` command line: a thin shell over the package API.

Every subcommand parses its arguments, calls the same function a notebook would, prints the
resulting table and, with --out, saves it. User errors (NopeinterpError, ValueError, missing
files) print one line on stderr and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nopeinterp
from nopeinterp import _args
from nopeinterp.errors import NopeinterpError

parse_lengths = _args.lengths  # argument checks live in nopeinterp._args
parse_layers = _args.layers


# --- subcommands ------------------------------------------------------------------------------
def cmd_info(args) -> int:
    print(nopeinterp.format_checkpoint_info(args.checkpoint))
    return 0


def cmd_train(args) -> int:
    from nopeinterp.training import TrainConfig, train

    pe_options = {}
    if args.num_buckets is not None:
        pe_options["num_buckets"] = args.num_buckets
    if args.rotary_fraction is not None:
        pe_options["fraction"] = args.rotary_fraction
    task_options = {}
    if args.train_lengths:
        task_options["id_lengths"] = [min(args.train_lengths), max(args.train_lengths)]
    if args.ood_lengths:
        task_options["ood_lengths"] = [min(args.ood_lengths), max(args.ood_lengths)]
    config = TrainConfig(
        task=args.task,
        pe=args.pe,
        out=args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        d_model=args.d_model,
        d_mlp=args.d_mlp,
        eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every,
        dtype=args.dtype,
        resume=args.resume,
        pe_options=pe_options,
        task_options=task_options,
    )
    path = train(config)
    print(f"best checkpoint: {path}")
    return 0


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
    parser = _args.OneLineParser(
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

    p = sub.add_parser("train", help="train one model on one task")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--pe", required=True, choices=PE_TYPES)
    p.add_argument(
        "--out", required=True, type=_args.out_file, help="path of the best checkpoint (.pt)"
    )
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--d-mlp", type=int, default=None)
    p.add_argument("--num-buckets", type=int, default=None, help="t5 only")
    p.add_argument("--rotary-fraction", type=float, default=None, help="rotary only")
    p.add_argument("--train-lengths", type=parse_lengths, default=None, help="e.g. 2-20")
    p.add_argument("--ood-lengths", type=parse_lengths, default=None, help="e.g. 21-40")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--checkpoint-every", type=int, default=250)
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--resume", action="store_true", help="continue from <out>.state.pt")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="exact-match accuracy per length (greedy decoding)")
    p.add_argument("checkpoint")
    p.add_argument("--lengths", type=parse_lengths, default=None, help="default: ID and OOD ranges")
    p.add_argument("--n", type=_args.positive_int, default=200, help="examples per length")
    p.add_argument("--batch-size", type=_args.positive_int, default=64)
    p.add_argument("--out", default=None, type=_args.out_dir, help="directory for CSV + HTML")
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
    p.add_argument("--n-train", type=_args.positive_int, default=512, help="sequences to fit on")
    p.add_argument(
        "--n-eval", type=_args.positive_int, default=256, help="sequences per evaluation split"
    )
    p.add_argument("--out", default=None, type=_args.out_dir, help="directory for CSV + HTML")
    p.set_defaults(func=cmd_probe_position)

    p = sub.add_parser(
        "probe-distance", help="how much attention logits depend on n-m only (Theorem 2)"
    )
    p.add_argument("checkpoint", help="a checkpoint, or a directory: every checkpoint in it")
    p.add_argument("--layers", type=parse_layers, default=None)
    p.add_argument("--out", default=None, type=_args.out_dir, help="directory for CSV + HTML")
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
    p.add_argument(
        "--task", default=None, choices=TASKS, help="default: the NoPE checkpoint's task"
    )
    p.add_argument("--n-per-length", type=_args.positive_int, default=10)
    p.add_argument("--heads", choices=("min", "hungarian", "same"), default="min")
    p.add_argument(
        "--paper-compat", action="store_true", help="the official code's formula and head pairing"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out", default=None, type=_args.out_dir, help="directory for CSV + HTML report"
    )
    p.set_defaults(func=cmd_compare_attention)

    p = sub.add_parser("report", help="the main job: every analysis on a checkpoint directory")
    p.add_argument("--checkpoints", default="checkpoints")
    p.add_argument("--out", default="reports/main", type=_args.out_dir)
    p.add_argument(
        "--n-eval", type=_args.positive_int, default=20, help="examples per length for exact match"
    )
    p.add_argument(
        "--n-per-length", type=_args.positive_int, default=10, help="examples per length for JSD"
    )
    p.set_defaults(func=cmd_report)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except (NopeinterpError, ValueError, OSError) as e:  # OSError: unreadable or unwritable files
        print(f"nopeinterp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nopeinterp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
