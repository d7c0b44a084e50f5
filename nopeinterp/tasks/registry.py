"""Task name -> Task class: `TASKS`, `TRAIN_TASKS`, `get_task` and `task_tokenizer`
(re-exported by `nopeinterp.tasks`)."""

from __future__ import annotations

from nopeinterp.errors import check_choice
from nopeinterp.options import LM_TASK, TASKS, TRAIN_TASKS

from .arithmetic import AdditionTask, PolynomialTask, SummationTask
from .base import Task, TaskError
from .copy import CopyTask, ReverseTask
from .lego import LegoTask
from .lists import ParityTask, SortingTask
from .lm import LMTask
from .scan import ScanTask
from .tokenizer import PreTrainedTokenizerFast, build_tokenizer

__all__ = ["LM_TASK", "TASKS", "TRAIN_TASKS", "get_task", "task_tokenizer"]

_REGISTRY: dict[str, type] = {
    "copy": CopyTask,
    "reverse": ReverseTask,
    "addition": AdditionTask,
    "summation": SummationTask,
    "parity": ParityTask,
    "sorting": SortingTask,
    "polynomial": PolynomialTask,
    "lego": LegoTask,
    "scan": ScanTask,
    LM_TASK: LMTask,
}
assert tuple(_REGISTRY) == TRAIN_TASKS  # the names live in nopeinterp.options


def get_task(name: str, **overrides) -> Task:
    """Task instance by name; ``overrides`` go to its constructor: ``id_lengths=(2, 10)``,
    ``ood_lengths``, ``bos`` (False: no start token), and for copy/reverse/scan ``variant``
    (the paper's splits, ``PAPER_SPLITS``) and for copy/reverse ``alphabet``; "lm" takes
    ``corpus``, ``context`` and ``vocab_size`` (an `LMTask`, not a `Task`: see `tasks.lm`)."""
    check_choice(name, TRAIN_TASKS, "task", error=TaskError)
    try:
        return _REGISTRY[name](**overrides)
    except TypeError as err:  # an option the task does not take
        raise TaskError(f"task {name}: bad options {sorted(overrides)}: {err}") from None


def task_tokenizer(task) -> PreTrainedTokenizerFast:
    """Tokenizer covering one task's vocabulary and its start-token choice (``task.bos``);
    ``task`` is a Task or a task name."""
    if isinstance(task, str):
        task = get_task(task)
    return build_tokenizer(task.vocab(), bos=task.bos)
