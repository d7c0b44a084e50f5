"""The paper's split family: one table from its split names to our task specs and its files.

``PAPER_SPLITS["rsc"].task()`` is ``get_task("copy", variant="rsc")``; ``paper_dataset`` and
``paper_split`` are the names in the paper's results (``s2s_copy`` / ``rsc_tr20_ts40``, as in
``official_ood_accuracy.csv``). Lengths are the task defaults: copy/reverse train 2-20 and
test 21-40, SCAN train <= 25 actions and test 26-48.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nopeinterp.errors import check_choice

from .base import Task, TaskError


@dataclass(frozen=True)
class PaperSplit:
    name: str  # the paper's split prefix, our key: "cmc", ..., "mdlen", "len"
    task_name: str  # our task: "copy", "reverse" or "scan"
    options: dict = field(default_factory=dict)  # get_task options
    paper_dataset: str = ""  # e.g. "s2s_copy"
    paper_split: str = ""  # e.g. "cmc_tr20_ts40"

    def task(self) -> Task:
        from .registry import get_task

        return get_task(self.task_name, **self.options)


def _split(name: str, task_name: str, dataset: str, suffix: str) -> PaperSplit:
    return PaperSplit(name, task_name, {"variant": name}, dataset, f"{name}_{suffix}")


PAPER_SPLITS: dict[str, PaperSplit] = {
    s.name: s
    for s in (
        *(
            _split(v, "copy", "s2s_copy", "tr20_ts40")
            for v in ("cmc", "cmc2x", "rsc", "rsc2x", "rdc")
        ),
        *(_split(v, "reverse", "s2s_reverse", "tr20_ts40") for v in ("mc", "mc2x", "mcrv")),
        *(_split(v, "scan", "scan", "tr25_ts48") for v in ("mdlen", "len")),
    )
}


def paper_split(name: str) -> PaperSplit:
    """The split called ``name`` ("rsc", "mdlen", ...), or a TaskError listing the valid ones."""
    return PAPER_SPLITS[check_choice(name, PAPER_SPLITS, "paper split", error=TaskError)]
