"""The checkpoint zoo: finding checkpoints in folders, naming them, choosing what to compare.

The naming rule, written once: `<task>-<pe>.pt` is seed 0 of that PE on that task, and
`<task>-<pe>-seed<k>.pt` seed k; NoPE-prime (the paper's noise floor for attention similarity)
is the next NoPE seed of the same task. The command line, the main job, the analysis scripts
and the reference training all find, name and pair checkpoints here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nopeinterp.errors import NopeinterpError

# The paper's five PEs in its order, then the learned APE; further PEs sort after these.
PE_ORDER = ("nope", "t5", "alibi", "rotary", "sinusoidal", "ape")
# Where a PE name is looked up when a checkpoint's file name is matched.
_NAME = re.compile(r"^(?P<task>[^-]+)-(?P<pe>[a-z0-9_]+?)(?:-seed(?P<seed>\d+))?$")
CHECKPOINT_SUFFIXES = (".pt", ".safetensors")


@dataclass(frozen=True)
class Entry:
    """One checkpoint file of the zoo, named by the rule above."""

    path: Path
    name: str  # file stem, e.g. "scan-nope-seed1"
    task: str
    pe: str
    seed: int
    in_progress: bool  # a <name>.pt.state.pt beside it: still training (best-so-far weights)

    def load(self, **kwargs):
        from nopeinterp.checkpoint import load_checkpoint

        return load_checkpoint(self.path, **kwargs)


def checkpoint_name(task: str, pe: str, seed: int = 0) -> str:
    """The file stem of a checkpoint: `<task>-<pe>` for seed 0, else `<task>-<pe>-seed<k>`."""
    return f"{task}-{pe}" if seed == 0 else f"{task}-{pe}-seed{seed}"


def parse_name(stem: str) -> tuple[str, str, int] | None:
    """(task, pe, seed) of a checkpoint stem that follows the naming rule, else None."""
    m = _NAME.match(stem)
    if not m:
        return None
    return m["task"], m["pe"], int(m["seed"] or 0)


def pe_rank(pe: str) -> tuple[int, str]:
    """Sort key: the PE_ORDER position, unknown PEs after, by name."""
    return (PE_ORDER.index(pe), "") if pe in PE_ORDER else (len(PE_ORDER), pe)


def checkpoint_files(path) -> list[Path]:
    """A checkpoint file, or every checkpoint (*.pt, *.safetensors) in a directory."""
    path = Path(path)
    if path.is_dir():
        found = sorted(
            p
            for p in path.iterdir()
            if p.suffix in CHECKPOINT_SUFFIXES and not p.name.endswith(".state.pt")
        )
        if not found:
            raise NopeinterpError(f"{path}: no checkpoints (*.pt, *.safetensors) in this directory")
        return found
    if not path.exists():
        raise NopeinterpError(f"{path}: no such file or folder")
    return [path]


def find_checkpoints(directories, tasks: Iterable[str] | None = None) -> list[Entry]:
    """Checkpoints named by the rule in one folder or several, sorted by task, PE, seed.

    Files that do not follow the rule (and training-state files) are ignored. A name found
    in two folders is taken from the first (e.g. `checkpoints/` before a folder of extra
    seeds that repeats NoPE-prime). Raises NopeinterpError if a folder is missing or nothing
    is found.
    """
    from nopeinterp.models import PE_TYPES

    if isinstance(directories, str | Path):
        directories = [directories]
    tasks = set(tasks) if tasks else None
    found, seen = [], set()
    for directory in map(Path, directories):
        if not directory.is_dir():
            raise NopeinterpError(f"no checkpoint directory {directory}: see checkpoints/README.md")
        for p in sorted(directory.glob("*.pt")):
            if p.name.endswith(".state.pt") or p.stem in seen:
                continue
            parsed = parse_name(p.stem)
            if parsed is None or parsed[1] not in PE_TYPES or (tasks and parsed[0] not in tasks):
                continue
            seen.add(p.stem)
            task, pe, seed = parsed
            state = p.with_name(p.name + ".state.pt").exists()
            found.append(Entry(p, p.stem, task, pe, seed, state))
    if not found:
        where = ", ".join(map(str, directories))
        raise NopeinterpError(f"no <task>-<pe>.pt checkpoints in {where}")
    found.sort(key=lambda c: (c.task, pe_rank(c.pe), c.seed))
    return found


def tasks_of(entries: Sequence[Entry]) -> list[str]:
    return sorted({e.task for e in entries})


def analysis_task(entries: Sequence[Entry], task: str | None = None) -> str:
    """The task to compare attention on: `task`, else SCAN (the paper's), else the first."""
    tasks = tasks_of(entries)
    if task is not None:
        if task not in tasks:
            raise NopeinterpError(
                f"no checkpoints for task {task!r} (tasks here: {', '.join(tasks) or 'none'})"
            )
        return task
    return "scan" if "scan" in tasks else tasks[0]


def get(entries: Sequence[Entry], task: str, pe: str, seed: int = 0) -> Entry | None:
    return next((e for e in entries if (e.task, e.pe, e.seed) == (task, pe, seed)), None)


def nope_pair(entries: Sequence[Entry], task: str, seed: int = 0) -> tuple[Entry, Entry | None]:
    """(NoPE seed `seed`, NoPE-prime = NoPE seed `seed` + 1 or None) of `task`."""
    nope = get(entries, task, "nope", seed)
    if nope is None:
        raise NopeinterpError(f"no NoPE checkpoint {checkpoint_name(task, 'nope', seed)}.pt")
    return nope, get(entries, task, "nope", seed + 1)


def references(
    entries: Sequence[Entry], task: str, refs: Sequence[str] = ("all",), seed: int = 0
) -> dict[str, Path]:
    """Reference checkpoints to compare NoPE with: {name: path}.

    Each of `refs` is "all" (every non-NoPE PE of `task` at `seed`), a PE name, or a path.
    """
    available = {e.pe: e.path for e in entries if e.task == task and e.seed == seed}
    out: dict[str, Path] = {}
    for ref in refs:
        if ref == "all":
            out.update({pe: p for pe, p in available.items() if pe != "nope"})
        elif Path(ref).suffix in CHECKPOINT_SUFFIXES or Path(ref).exists():
            out[Path(ref).stem] = Path(ref)
        elif ref in available and ref != "nope":
            out[ref] = available[ref]
        else:
            names = ", ".join(pe for pe in available if pe != "nope") or "none"
            raise NopeinterpError(
                f"unknown reference {ref!r}: no {checkpoint_name(task, ref, seed)}.pt "
                f"(references for {task}: {names}; or give a checkpoint path)"
            )
    if not out:
        raise NopeinterpError(f"no reference checkpoints for task {task!r}")
    return out


def over_seeds(df: pd.DataFrame, keys: list[str], values: list[str]) -> pd.DataFrame:
    """Mean, min and max over training seeds of each of `values` per `keys` (df: one row per
    checkpoint and `keys`), and n_seeds: the spread across training runs."""
    g = df.groupby(keys, sort=False)
    out = g[values].agg(["mean", "min", "max"])
    out.columns = [f"{value}_{stat}" for value, stat in out.columns]
    out["n_seeds"] = g.size()
    return out.reset_index()


__all__ = [
    "PE_ORDER",
    "Entry",
    "analysis_task",
    "checkpoint_files",
    "checkpoint_name",
    "find_checkpoints",
    "get",
    "nope_pair",
    "over_seeds",
    "parse_name",
    "pe_rank",
    "references",
    "tasks_of",
]
