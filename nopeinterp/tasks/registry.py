"""Task name -> Task class: `TASKS` and `get_task` (re-exported by `nopeinterp.tasks`)."""

from __future__ import annotations

from .arithmetic import AdditionTask, PolynomialTask, SummationTask
from .base import Task, TaskError
from .copy import CopyTask, ReverseTask
from .lego import LegoTask
from .lists import ParityTask, SortingTask
from .scan import ScanTask

TASKS = (
    "copy",
    "reverse",
    "addition",
    "summation",
    "parity",
    "sorting",
    "polynomial",
    "lego",
    "scan",
)

_REGISTRY: dict[str, type[Task]] = {
    "copy": CopyTask,
    "reverse": ReverseTask,
    "addition": AdditionTask,
    "summation": SummationTask,
    "parity": ParityTask,
    "sorting": SortingTask,
    "polynomial": PolynomialTask,
    "lego": LegoTask,
    "scan": ScanTask,
}


def get_task(name: str, **overrides) -> Task:
    """Task instance by name; ``overrides`` go to its constructor: ``id_lengths=(2, 10)``,
    ``ood_lengths``, ``bos`` (False: no start token), and for copy/reverse/scan ``variant``
    (the paper's splits, ``PAPER_SPLITS``) and for copy/reverse ``alphabet``."""
    if name not in _REGISTRY:
        raise TaskError(f"unknown task {name!r}; valid names: {', '.join(TASKS)}")
    try:
        return _REGISTRY[name](**overrides)
    except TypeError as err:  # an option the task does not take
        raise TaskError(f"task {name}: bad options {sorted(overrides)}: {err}") from None
