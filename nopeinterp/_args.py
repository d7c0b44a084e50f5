"""Command-line argument checks: argparse `type=` functions and a parser that errs in one line.

Every check here runs while the arguments are parsed, before any work starts. Values the API
also receives (n, batch_size, n_train, ...) are validated again by the API functions, so a
notebook gets the same errors; these only make the command line fail early and in one line.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from nopeinterp.options import MAX_TASK_LENGTH, ROPE_TYPES, TASKS, TRAIN_TASKS


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (no usage block) and exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def lengths(text: str) -> list[int]:
    """'2-40' -> [2..40]; '5,10,20' -> [5, 10, 20]; '8' -> [8]. Each task checks its own range."""
    out: list[int] = []
    limit = MAX_TASK_LENGTH  # each task checks its own, narrower range
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            lo, hi = int(lo), int(hi or lo)
            if lo > hi:
                raise ValueError
            if lo < 1 or hi > limit:
                raise argparse.ArgumentTypeError(
                    f"invalid lengths {text!r}: lengths are between 1 and {limit}"
                )
            out.extend(range(lo, hi + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid lengths {text!r} (use e.g. 2-40 or 5,10,20)"
        ) from None
    return out


def length_range(text: str) -> tuple[int, int]:
    """'2-40' (or '5,10,20') -> (lo, hi): the range an option's id_lengths / ood_lengths take."""
    found = lengths(text)
    return (min(found), max(found))


def integer(text: str) -> int:
    """Any integer."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


def number(text: str) -> float:
    """Any finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"invalid number {text!r}")
    return value


def numbers(text: str) -> tuple[float, ...]:
    """'0,0.5,1' -> (0.0, 0.5, 1.0); '' -> () (an empty list: e.g. no passkey depths)."""
    try:
        return tuple(number(x) for x in text.split(",") if x.strip())
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"invalid numbers {text!r} (use e.g. 0,0.5,1)") from None


def length_pair(text: str) -> list[int]:
    """'2-20' -> [2, 20]: a task's length range as a task option records it."""
    return list(length_range(text))


def names(text: str) -> tuple[str, ...]:
    """'nope,t5' -> ("nope", "t5")."""
    out = tuple(x.strip() for x in text.split(",") if x.strip())
    if not out:
        raise argparse.ArgumentTypeError(f"invalid list {text!r} (use e.g. nope,t5)")
    return out


def layers(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2] (0 = embeddings, l = after block l)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid layers {text!r} (use e.g. 0,1,2)") from None
    if min(out) < 0:
        raise argparse.ArgumentTypeError(f"invalid layers {text!r}: layers are >= 0")
    return out


def pe_name(text: str) -> str:
    """A positional encoding a model can be trained with (training.config.check_pe)."""
    from nopeinterp.errors import NopeinterpError
    from nopeinterp.training.config import check_pe

    try:
        check_pe(text)
    except NopeinterpError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def task_spec(text: str) -> str:
    """A task spec (`copy`, `copy:variant=rsc`) whose task name is known; its options are
    checked when the task is built (training.sweep.parse_task_spec)."""
    return _task(text.partition(":")[0], text)


def task_name(text: str) -> str:
    """One of the synthetic tasks (an analysis's `--task`)."""
    return _task(text, text, names=TASKS)


def _task(name: str, spec: str, names=TRAIN_TASKS) -> str:
    """`spec` if its task `name` is one of `names` (default: every task `train` takes)."""
    from nopeinterp.errors import NopeinterpError
    from nopeinterp.training.config import check_task_name

    try:
        check_task_name(name, spec, names=names)
    except NopeinterpError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return spec


def rope_scaling(text: str) -> dict:
    """'yarn:2' -> {"rope_type": "yarn", "factor": 2.0} (also linear, dynamic). The model
    checks the rest (a rotary layer, the other parameters) when it is loaded."""
    kinds = [k for k in ROPE_TYPES if k != "default"]
    kind, _, factor = text.partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = None
    if kind not in kinds or value is None or not value >= 1.0:
        raise argparse.ArgumentTypeError(
            f"invalid RoPE scaling {text!r} (use TYPE:FACTOR, TYPE one of {', '.join(kinds)}, "
            "FACTOR >= 1, e.g. yarn:2)"
        )
    return {"rope_type": kind, "factor": value}


def _check_length(path: Path) -> None:
    """Names and the path within the file system's limits (checked first: stat() fails else)."""
    try:
        name_max = os.pathconf(".", "PC_NAME_MAX")
        path_max = os.pathconf(".", "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    too_long = [p for p in path.parts if len(os.fsencode(p)) > name_max]
    if too_long or len(os.fsencode(str(path.absolute()))) >= path_max:
        raise argparse.ArgumentTypeError(
            f"{path}: path too long (names up to {name_max} bytes, paths up to {path_max})"
        )


def _check_writable(path: Path, what: str) -> None:
    """Raise ArgumentTypeError unless `path` (a `what`: folder or file) can be created/written."""
    ancestor = path if not path.is_file() else path.parent  # an existing file: its folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: cannot write here ({ancestor} is not a folder)")
    try:  # the real test (a read-only file system, permissions, even for root)
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(
            f"{path}: cannot write {what} in {ancestor} ({e.strerror or e})"
        ) from None


def in_path(text: str) -> str:
    """An input file or folder (checkpoint, texts, Hugging Face directory): it must exist.
    Checked while parsing, so a mistyped path fails at once, not after the model imports."""
    path = Path(text)
    _check_length(path)
    try:
        path.stat()
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"{text}: no such file or folder") from None
    except OSError as e:  # permission denied on a folder, a loop of links
        raise argparse.ArgumentTypeError(f"{text}: cannot open ({e.strerror or e})") from None
    return text


def out_dir(text: str) -> str:
    """An output folder: an existing writable folder, or one that can be created."""
    path = Path(text)
    _check_length(path)
    if path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: exists and is not a folder")
    _check_writable(path, "a folder")
    return text


def out_file(text: str) -> str:
    """An output file: not a folder, in a folder that exists or can be created, writable."""
    path = Path(text)
    _check_length(path)
    _check_writable(path, "a file")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder, give a file path")
    return text


# --- flags built from an options dataclass (nopeinterp.options) ------------------------------
PARSERS = {
    "positive_int": positive_int,
    "integer": integer,
    "number": number,
    "numbers": numbers,
    "length_pair": length_pair,
    "lengths": lengths,
    "length_range": length_range,
    "layers": layers,
    "names": names,
}


def flag_names(f) -> list[str]:
    """The command-line names of an options field: --field-name, then its aliases."""
    return ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ())]


def _shown(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def add_option_flags(parser, options_cls, *, skip=()) -> None:
    """One flag per command-line field of `options_cls`, with its default and help."""
    for f in options_cls.flags():
        if f.name in skip:
            continue
        default = options_cls.default(f.name)
        kw = {"dest": f.name, "default": default, "help": f.metadata.get("help") or None}
        if isinstance(default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        else:
            if f.metadata.get("parse"):
                kw["type"] = PARSERS[f.metadata["parse"]]
            if f.metadata.get("choices"):
                kw["choices"] = f.metadata["choices"]
            if default is not None and kw["help"] and "default" not in kw["help"]:
                kw["help"] += f" (default {_shown(default)})"
        parser.add_argument(*flag_names(f), **kw)


def option_values(args, options_cls, *, skip=()) -> dict:
    """{field: value} of the flags `add_option_flags` added, as parsed."""
    return {f.name: getattr(args, f.name) for f in options_cls.flags() if f.name not in skip}


# TrainConfig's field types -> argparse types; TrainConfig itself checks the values (nan, <= 0)
_TYPES = {"int": int, "float": float, "int | None": int, "float | None": float}


def add_config_flags(parser, fields) -> None:
    """Flags of a config dataclass's `fields` (`nopeinterp.training.config.flag` metadata). A
    flag not given is absent from the parsed arguments (the preset's value, else the field's
    default, stays); a dict field's keys get a flag each, their dest "field.key"."""
    S = argparse.SUPPRESS
    for f in fields:
        meta = f.metadata
        for key, (name, parse, help) in (meta["nested"] or {}).items():
            parser.add_argument(name, dest=f"{f.name}.{key}", type=PARSERS[parse], default=S,
                                help=help, metavar=key.upper())  # fmt: skip
        if meta["nested"]:
            continue
        default = f.default
        shown = "" if default is None else f"{default}, or "
        help = f"{meta['help']} (default {shown}the preset's)"
        name = "--" + f.name.replace("_", "-")
        if meta.get("store_true"):
            parser.add_argument(name, action="store_true", default=S, help=meta["help"])
        elif isinstance(default, bool) or meta.get("boolean"):
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=S, help=help)
        else:
            kind = meta.get("choices") and None or _TYPES.get(f.type)
            parser.add_argument(name, type=kind, choices=meta.get("choices"), default=S, help=help)


def config_values(args, fields) -> dict:
    """{field: value} of the config flags given (dict fields: {key: value} of theirs)."""
    given, out = vars(args), {}
    for f in fields:
        if f.metadata["nested"]:
            sub = {
                k: given[f"{f.name}.{k}"] for k in f.metadata["nested"] if f"{f.name}.{k}" in given
            }
            if sub:
                out[f.name] = sub
        elif f.name in given:
            out[f.name] = given[f.name]
    return out
