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
from nopeinterp import _args
from nopeinterp.errors import NopeinterpError


# --- subcommands ------------------------------------------------------------------------------
def cmd_info(args) -> int:
    print(nopeinterp.format_checkpoint_info(args.checkpoint))
    return 0


def _train_overrides(args, *, grid: bool = False) -> dict:
    """The TrainConfig values given on the command line (absent flags stay absent)."""
    from nopeinterp.training.config import train_flags

    return _args.config_values(args, train_flags(grid=grid))


def cmd_train(args) -> int:
    from nopeinterp.training.sweep import parse_task_spec

    task, options = parse_task_spec(args.task)  # checked before the trainer (the models) loads
    from nopeinterp.training import make_config, train

    out = Path(args.out)
    state = out.with_name(out.name + ".state.pt")
    resume = getattr(args, "resume", False)  # a TrainConfig flag: absent unless given
    if not (resume or args.overwrite) and (out.exists() or state.exists()):
        found = state if state.exists() else out
        raise NopeinterpError(
            f"{found} exists: add --resume to continue that run, or --overwrite to train "
            "from the start"
        )
    if resume and args.overwrite:
        raise NopeinterpError("give --resume or --overwrite, not both")
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
        overrides=_train_overrides(args, grid=True),
        workers=args.workers,
        shard=parse_shard(args.shard),
        eval_n=args.eval_n_record,
        test=args.test,
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


def _add_train_flags(p, *, grid: bool = False) -> None:
    """TrainConfig's flags (`nopeinterp.training.config`): a flag not given leaves the
    preset's value. `grid`: a sweep's (no single-run flags such as --seed)."""
    from nopeinterp.training.config import train_flags

    p.add_argument("--preset", default=None, help="paper, reference, repro, repro-t5, lm or tiny")
    _args.add_config_flags(p, train_flags(grid=grid))


def cmd_eval(args) -> int:
    from nopeinterp.evaluation import evaluate

    options = _options(args)
    model = _load(args.checkpoint, device=options.device, rope_scaling=args.rope_scaling)
    result = evaluate(model, options=options)
    print(_fmt(result.table, index=False))
    print()
    print(_fmt(result.summary, index=False))
    _save(result, args.out)
    return 0


def _fmt(df, index: bool = True) -> str:
    return df.to_string(index=index, float_format=lambda v: f"{v:.3f}")


def _save(result, out) -> None:
    if out:
        paths = result.save(out)
        print(f"wrote {len(paths)} files to {out}")


def _options(args):
    """The analysis options of this subcommand (`args.options`), from its flags."""
    return args.options(**_args.option_values(args, args.options))


def _load(path, hf: bool = False, device=None, rope_scaling=None):
    """A checkpoint path (loaded only when --device or --rope-scaling asks for it) or, with
    `hf`, a Hugging Face save_pretrained directory converted by `nopeinterp.from_hf`."""
    if hf:
        model = nopeinterp.from_hf(path, device=device)
        if rope_scaling is not None:
            from nopeinterp.models import set_rope_scaling

            set_rope_scaling(model, rope_scaling)
        return model
    if device or rope_scaling is not None:
        return nopeinterp.load_checkpoint(path, device=device, rope_scaling=rope_scaling)
    return path


def _text_data(args):
    """--text FILE -> its documents (one per line), else None (the model's default data)."""
    from nopeinterp.data import read_texts

    return read_texts(args.text) if getattr(args, "text", None) else None


def _each_checkpoint(args, analyse, what, **pivot) -> int:
    """`analyse(model, data, options)` on the checkpoint, on every checkpoint of a directory, or on the
    --hf model (data: the --text documents, else None): print each result's pivot table and
    save each under --out (a subfolder per checkpoint for a directory). `analyse` may return a
    tuple of results (then `what` is a tuple of headings), saved side by side. `pivot`: the
    keywords of each result's `pivot()`."""
    import pandas as pd

    from nopeinterp.zoo import checkpoint_files

    if (args.checkpoint is None) == (args.hf is None):
        raise NopeinterpError("give a checkpoint or --hf DIR (one of them)")
    paths = [Path(args.hf)] if args.hf else checkpoint_files(args.checkpoint)
    many = not args.hf and (len(paths) > 1 or Path(args.checkpoint).is_dir())
    data = _text_data(args)
    options = _options(args)
    whats = what if isinstance(what, tuple) else (what,)
    pivots = [[] for _ in whats]
    for path in paths:
        model = _load(path, bool(args.hf), options.device, args.rope_scaling)
        results = analyse(model, data, options)
        results = results if isinstance(results, tuple) else (results,)
        for found, result in zip(pivots, results, strict=True):
            _say_degenerate(path.stem, result)
            found.append(pd.concat({path.stem: result.pivot(**pivot)}, names=["checkpoint"]))
            if args.out:
                result.save(Path(args.out) / path.stem if many else args.out)
    for heading, found in zip(whats, pivots, strict=True):
        print(heading)
        print(_fmt(pd.concat(found)))
    if args.out:
        print(f"wrote {args.out}")
    return 0


def _say_degenerate(name: str, result) -> None:
    """One line on stderr per model whose fit was degenerate (a result's
    meta["degenerate_fits"]): its numbers are NaN, flagged in the table, the rest stand."""
    for fit in result.meta.get("degenerate_fits", ()):
        layers = ", ".join(str(layer) for layer in fit["layers"])
        print(
            f"nopeinterp: {name}: the {fit['model']} probe's fit is degenerate at layer "
            f"{layers} ({fit['reason']}); its values there are NaN (column 'degenerate')",
            file=sys.stderr,
        )


def cmd_lm_eval(args) -> int:
    """Loss by position, perplexity and passkey on a checkpoint, a folder of them or --hf."""
    from nopeinterp.inputs import as_model
    from nopeinterp.lm_eval import LMEvalResult, check_lengths, run_lm_eval
    from nopeinterp.zoo import checkpoint_files

    if (args.checkpoint is None) == (args.hf is None):
        raise NopeinterpError("give a checkpoint, a folder of checkpoints or --hf DIR (one)")
    options = _options(args)
    paths = [Path(args.hf)] if args.hf else checkpoint_files(args.checkpoint)
    models = {
        p.stem: as_model(_load(p, bool(args.hf), options.device), p.stem, device=options.device)
        for p in paths
    }
    for name, mi in models.items():  # every model can read every length, before any work
        check_lengths(mi.model, options.lengths, name)
    result = LMEvalResult.concat(run_lm_eval(mi, args.corpus, options) for mi in models.values())
    print("perplexity by length:")
    print(_fmt(result.perplexity, index=False))
    if len(result.passkey):
        print("\npasskey accuracy (length x depth):")
        print(_fmt(result.passkey.pivot_table("accuracy", ["model", "depth"], "length")))
    _save(result, args.out)
    return 0


def cmd_probe_position(args) -> int:
    from nopeinterp.probing import probe_position
    from nopeinterp.probing.position import MODELS

    return _each_checkpoint(
        args,
        lambda model, data, options: probe_position(model, data, options=options),
        "position probes per layer; baselines: [random_init] = same config, untrained; "
        "[shuffled] = probes fitted on permuted positions; [constant] = the mean position:",
        models=MODELS,
    )


def cmd_probe_distance(args) -> int:
    from nopeinterp.probing import distance_dependence

    return _each_checkpoint(
        args,
        lambda model, data, options: distance_dependence(model, data, options=options),
        "distance dependence (R2 of the logits on n - m) per layer and head:",
    )


def cmd_erase_position(args) -> int:
    from nopeinterp.probing import erase_position

    return _each_checkpoint(
        args,
        lambda model, data, options: erase_position(model, data, options=options),
        "position erasure per layer (LEACE vs a random subspace of the same rank):",
    )


def cmd_heads(args) -> int:
    def analyse(model, data, options):
        from nopeinterp.inputs import resolve
        from nopeinterp.probing.heads import run_attention_sinks, run_classify_heads

        mi, sets = resolve(model, data, options)  # loaded and sampled once for both
        return run_attention_sinks(mi, sets, options), run_classify_heads(mi, sets, options)

    return _each_checkpoint(
        args,
        analyse,
        (
            "attention sinks: mean first-token mass and entropy slope on log(n) per head:",
            "head taxonomy (labels per layer and head):",
        ),
    )


def cmd_attention_regions(args) -> int:
    import pandas as pd

    from nopeinterp.probing.regions import RegionResult, attention_regions
    from nopeinterp.zoo import checkpoint_files

    options = _options(args)
    results = [
        attention_regions(_load(path, device=options.device), options=options)
        for path in checkpoint_files(args.checkpoint)
    ]
    result = results[0] if len(results) == 1 else RegionResult.concat(results)
    print(
        "attention mass by attended region (columns), per generated token's region, mean over heads:"
    )
    with pd.option_context("display.width", 200):
        print(_fmt(result.pivot()))
    _save(result, args.out)
    return 0


def cmd_compare_attention(args) -> int:
    from nopeinterp import zoo
    from nopeinterp.similarity import compare_attention

    options = _options(args)
    directory = Path(args.checkpoints)
    entries = zoo.find_checkpoints(directory) if directory.is_dir() else []
    if args.nope_hf:
        if args.nope:
            raise NopeinterpError("give --nope or --nope-hf, not both")
        nope, task, prime = _load(args.nope_hf, True, options.device), args.task, args.nope_prime
    elif args.nope:
        nope = Path(args.nope)
        task = args.task or nopeinterp.load_checkpoint(nope).task
        prime = args.nope_prime
    else:
        if not entries:
            raise NopeinterpError(f"no checkpoint directory {directory}; give --nope PATH")
        task = zoo.analysis_task(entries, args.task)
        nope_entry, prime_entry = zoo.nope_pair(entries, task)
        nope = nope_entry.path
        prime = args.nope_prime or (prime_entry.path if prime_entry else None)
    refs = zoo.references(entries, task, args.ref) if args.ref else {}
    refs = {k: _load(v, False, options.device) for k, v in refs.items()}
    refs.update({Path(d).name: _load(d, True, options.device) for d in args.ref_hf or []})
    if not refs:
        raise NopeinterpError("give at least one --ref or --ref-hf")
    result = compare_attention(
        nope if args.nope_hf else _load(nope, False, options.device),
        refs,
        _text_data(args),
        nope_prime=None if prime is None else _load(prime, False, options.device),
        options=options,
    )
    print(f"attention divergence from NoPE ({result.metric}, heads={result.reducer}), "
          f"{task or ('texts' if args.text else 'random tokens')}:")  # fmt: skip
    print(_fmt(result.ranking, index=False))
    _save(result, args.out)
    return 0


def cmd_report(args) -> int:
    from nopeinterp.main_job import run_main_job

    run_main_job(args.checkpoints, args.out, options=_options(args))
    return 0


# Flags mean one thing everywhere (nopeinterp.options): --n / --n-per-length are examples per
# length, --n-train / --n-eval are sequences per probe split, --id-lengths / --ood-lengths
# override the task's ranges. Every analysis flag is a field of that analysis's options.
def _out(p, what="CSV + HTML") -> None:
    p.add_argument("--out", default=None, type=_args.out_dir, help=f"directory for {what}")


def _path_flag(p, name: str, help: str, **kw) -> None:
    """An input file or folder: a path that does not exist fails while the flags are parsed."""
    p.add_argument(name, type=_args.in_path, help=help, **kw)


def _text_flag(p) -> None:
    _path_flag(p, "--text", "analyse these texts: one document per line (default: the "
               "checkpoint's task; random tokens for a model without one)")  # fmt: skip


def _rope_flag(p) -> None:
    p.add_argument(
        "--rope-scaling", type=_args.rope_scaling, default=None, metavar="TYPE:FACTOR",
        help="RoPE scaling for the rotary layers, without retraining: linear, dynamic or yarn, "
        "e.g. yarn:2 (the original length is the model's n_ctx)",
    )  # fmt: skip


def _options_flags(p, options_cls, **kw) -> None:
    """The flags of an analysis: one per field of its options dataclass."""
    _args.add_option_flags(p, options_cls, **kw)
    p.set_defaults(options=options_cls)


def _model_flags(p, what: str = "a checkpoint") -> None:
    """The model to analyse: `what`, a directory of them, or --hf."""
    _path_flag(p, "checkpoint", f"{what}, or a directory: every checkpoint in it", nargs="?")
    _path_flag(p, "--hf", "a Hugging Face save_pretrained directory instead")


def _model_inputs(p) -> None:
    """What the model analyses take: a checkpoint, a directory or --hf; texts; RoPE scaling."""
    _model_flags(p)
    _text_flag(p)
    _rope_flag(p)


def _analysis(sub, name, help, func, options_cls, *inputs, out="CSV + HTML") -> None:
    """The subcommand of an analysis: what `inputs` add (what it analyses), then one flag per
    field of its options dataclass, then --out."""
    p = sub.add_parser(name, help=help)
    for add in inputs:
        add(p)
    _options_flags(p, options_cls)
    _out(p, out)
    p.set_defaults(func=func)


def _corpus_flag(p) -> None:
    p.add_argument(
        "--corpus", default=None,
        help="stdlib, a folder of text files or a .jsonl file; its test split is read "
        "(default: the checkpoint's corpus, else stdlib)",
    )  # fmt: skip


def _compare_inputs(p) -> None:
    """compare-attention's models: NoPE (and a second seed) against references."""
    p.add_argument("--ref", action="append", help="PE name, checkpoint path, or 'all' (repeatable)")
    _path_flag(p, "--ref-hf", "a Hugging Face save_pretrained directory (repeatable)",
               action="append")  # fmt: skip
    _path_flag(p, "--nope-hf", "a Hugging Face directory in NoPE's place")
    _text_flag(p)
    p.add_argument("--checkpoints", default="checkpoints", help="where PE names are looked up")
    _path_flag(p, "--nope", "NoPE checkpoint (default: <dir>/<task>-nope.pt)")
    _path_flag(
        p, "--nope-prime", "second NoPE seed (default: <dir>/<task>-nope-seed1.pt if present)"
    )
    p.add_argument(
        "--task", default=None, type=_args.task_name,
        help="default: the NoPE checkpoint's task, else scan",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    # No heavy import here: --help and --version answer at once (options imports nothing).
    from nopeinterp import options as O

    parser = _args.OneLineParser(
        prog="nopeinterp",
        description="Train, probe and compare Transformers that differ only in positional encoding.",
    )
    parser.add_argument(
        "--version", action="version", version=f"nopeinterp {nopeinterp.__version__}"
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress output (bars on a terminal, periodic lines in a log)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("info", help="print a checkpoint's PE, config, parameter count and meta")
    _path_flag(p, "checkpoint", "a checkpoint file")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("train", help="train one model on one task (torchrun: data parallel)")
    p.add_argument(
        "--task", required=True, type=_args.task_spec,
        help="copy, reverse, scan, ...[:option=value,...]",
    )  # fmt: skip
    p.add_argument(
        "--pe",
        required=True,
        type=_args.pe_name,
        help="nope, t5, alibi, rotary, ape, sinusoidal, ...",
    )
    p.add_argument(
        "--out", required=True, type=_args.out_file, help="path of the best checkpoint (.pt)"
    )
    _add_train_flags(p)
    p.add_argument(
        "--overwrite", action="store_true", help="train from the start over an existing --out"
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sweep", help="train a grid of tasks x PEs x seeds, resumably")
    p.add_argument(
        "--tasks", nargs="+", required=True, type=_args.task_spec,
        help="task specs, e.g. copy:variant=rsc",
    )  # fmt: skip
    p.add_argument(
        "--pes",
        nargs="+",
        required=True,
        type=_args.pe_name,
        help="nope t5 alibi rotary ape sinusoidal ...",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--out", required=True, help="directory: one folder per run")
    p.add_argument("--workers", type=int, default=1, help="local worker processes")
    p.add_argument("--shard", default="0/1", help="i/n: this process's share of the grid")
    p.add_argument("--eval-n-record", type=int, default=100, help="examples per length")
    p.add_argument(
        "--test",
        choices=("sampled", "eval_set", "none"),
        default="sampled",
        help="record's exact match: sampled (--eval-n-record per length), eval_set (the task's "
        "test set, each item once) or none (no test decoded: a learning-rate search)",
    )
    _add_train_flags(p, grid=True)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("collect", help="gather a sweep's records into one table (CSV)")
    _path_flag(p, "directory", "a sweep's output directory")
    p.add_argument("--out", default=None, help="CSV path (default: DIRECTORY/records.csv)")
    p.set_defaults(func=cmd_collect)

    _analysis(
        sub, "eval", "exact-match accuracy per length (greedy decoding)", cmd_eval,
        O.EvalOptions, lambda p: _path_flag(p, "checkpoint", "a checkpoint file"), _rope_flag,
    )  # fmt: skip
    _analysis(
        sub, "lm-eval", "language models: loss by position past the training context, "
        "perplexity by length, passkey retrieval", cmd_lm_eval, O.LMEvalOptions,
        lambda p: _model_flags(p, "an lm checkpoint"), _corpus_flag,
    )  # fmt: skip
    _analysis(sub, "probe-position", "linear probes for absolute position, per layer "
              "(Theorem 1)", cmd_probe_position, O.ProbeOptions, _model_inputs)  # fmt: skip
    _analysis(sub, "probe-distance", "how much attention logits depend on n-m only "
              "(Theorem 2)", cmd_probe_distance, O.DistanceOptions, _model_inputs)  # fmt: skip
    _analysis(sub, "erase-position", "erase position per layer (LEACE) vs a random control: "
              "probe R2, exact match, loss", cmd_erase_position, O.ErasureOptions,
              _model_inputs)  # fmt: skip
    _analysis(sub, "heads", "attention sinks, entropy vs log(n) and a positional head taxonomy",
              cmd_heads, O.HeadOptions, _model_inputs)  # fmt: skip
    _analysis(
        sub, "attention-regions", "attention mass on the prompt, each scratchpad component "
        "and the earlier answer, per generated token, layer and head", cmd_attention_regions,
        O.RegionOptions,
        lambda p: _path_flag(p, "checkpoint", "a checkpoint, or a directory: every checkpoint in it"),
    )  # fmt: skip
    _analysis(
        sub, "compare-attention", "JSD between NoPE's attention and each reference PE",
        cmd_compare_attention, O.CompareOptions, _compare_inputs, out="CSV + HTML report",
    )  # fmt: skip

    p = sub.add_parser("report", help="the main job: every analysis on a checkpoint directory")
    p.add_argument("--checkpoints", default="checkpoints")
    p.add_argument("--out", default="reports/main", type=_args.out_dir)
    _options_flags(p, O.ReportOptions)
    p.set_defaults(func=cmd_report)
    return parser


def main(argv=None) -> int:
    """The command line; returns the exit status (2: a bad argument, said in one line)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on --help, --version and a bad argument
        return e.code or 0
    from contextlib import nullcontext

    from nopeinterp.progress import quiet

    threads = None
    try:
        if hasattr(args, "threads") and args.command != "report":  # report sets its own
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(args.threads)
        with quiet() if args.quiet else nullcontext():
            return args.func(args) or 0
    except (NopeinterpError, ValueError, OSError) as e:  # OSError: unreadable or unwritable files
        print(f"nopeinterp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nopeinterp: interrupted", file=sys.stderr)
        return 130
    finally:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)


if __name__ == "__main__":
    sys.exit(main())
