"""`nopeinterp` command line: a thin shell over the package API.

Every subcommand parses its arguments, calls the same function a notebook would, prints the
resulting table and, with --out, saves it. User errors (NopeinterpError, ValueError, missing
files) print one line on stderr and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys

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

    p = sub.add_parser("train", help="train one model on one task")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--pe", required=True, choices=PE_TYPES)
    p.add_argument("--out", required=True, help="path of the best checkpoint (.pt)")
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
    p.add_argument("--n", type=int, default=200, help="examples per length")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", default=None, help="directory for CSV + HTML")
    p.set_defaults(func=cmd_eval)
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
