"""Synthetic length-generalization tasks of Kazemnejad et al. (2023), plus tokenization.

``get_task("scan").generate(100, split="test")`` gives OOD-length examples;
``get_task("scan").eval_set("test")`` the test set (each item once);
``task_tokenizer(task)`` a word-level tokenizer for them; ``encode_examples`` the tensors.
The paper's ten splits: ``PAPER_SPLITS`` (e.g. ``get_task("copy", variant="rsc")``).
"""

from __future__ import annotations

from .arithmetic import AdditionTask, PolynomialTask, SummationTask
from .base import Example, Task, TaskError
from .copy import CopyTask, ReverseTask
from .encoding import Batch, decode_answer, encode_examples
from .lego import LegoTask
from .lists import ParityTask, SortingTask
from .lm import LMTask
from .scan import ScanTask
from .splits import PAPER_SPLITS, PaperSplit, paper_split
from .tokenizer import build_tokenizer, task_tokenizer, tokenizer_from_json, tokenizer_to_json

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

# What `train` takes: the synthetic tasks and language modelling on a corpus (`tasks.lm`).
LM_TASK = "lm"
TRAIN_TASKS = (*TASKS, LM_TASK)

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


def get_task(name: str, **overrides) -> Task:
    """Task instance by name; ``overrides`` go to its constructor: ``id_lengths=(2, 10)``,
    ``ood_lengths``, ``bos`` (False: no start token), and for copy/reverse/scan ``variant``
    (the paper's splits, ``PAPER_SPLITS``) and for copy/reverse ``alphabet``; "lm" takes
    ``corpus``, ``context`` and ``vocab_size`` (an `LMTask`, not a `Task`: see `tasks.lm`)."""
    if name not in _REGISTRY:
        raise TaskError(f"unknown task {name!r}; valid names: {', '.join(TRAIN_TASKS)}")
    try:
        return _REGISTRY[name](**overrides)
    except TypeError as err:  # an option the task does not take
        raise TaskError(f"task {name}: bad options {sorted(overrides)}: {err}") from None


__all__ = [
    "PAPER_SPLITS",
    "TASKS",
    "TRAIN_TASKS",
    "AdditionTask",
    "Batch",
    "CopyTask",
    "Example",
    "LM_TASK",
    "LMTask",
    "LegoTask",
    "PaperSplit",
    "ParityTask",
    "PolynomialTask",
    "ReverseTask",
    "ScanTask",
    "SortingTask",
    "SummationTask",
    "Task",
    "TaskError",
    "build_tokenizer",
    "decode_answer",
    "encode_examples",
    "get_task",
    "paper_split",
    "task_tokenizer",
    "tokenizer_from_json",
    "tokenizer_to_json",
]
