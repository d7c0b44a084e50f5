"""Synthetic length-generalization tasks of Kazemnejad et al. (2023), plus tokenization.

``get_task("scan").generate(100, split="test")`` gives OOD-length examples;
``task_tokenizer(task)`` a word-level tokenizer for them; ``encode_examples`` the tensors.
"""

from __future__ import annotations

from .arithmetic import AdditionTask, PolynomialTask, SummationTask
from .base import Example, Task
from .copy import CopyTask, ReverseTask
from .encoding import Batch, decode_answer, encode_examples
from .lego import LegoTask
from .lists import ParityTask, SortingTask
from .scan import ScanTask
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
    """Task instance by name; ``overrides`` go to its constructor (e.g. ``id_lengths=(2, 10)``,
    ``ood_lengths``, or ``alphabet`` for copy/reverse)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; valid names: {', '.join(TASKS)}")
    return _REGISTRY[name](**overrides)


__all__ = [
    "TASKS",
    "AdditionTask",
    "Batch",
    "CopyTask",
    "Example",
    "LegoTask",
    "ParityTask",
    "PolynomialTask",
    "ReverseTask",
    "ScanTask",
    "SortingTask",
    "SummationTask",
    "Task",
    "build_tokenizer",
    "decode_answer",
    "encode_examples",
    "get_task",
    "task_tokenizer",
    "tokenizer_from_json",
    "tokenizer_to_json",
]
