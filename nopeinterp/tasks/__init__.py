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
from .registry import LM_TASK, TASKS, TRAIN_TASKS, get_task, task_tokenizer
from .scan import ScanTask
from .splits import PAPER_SPLITS, PaperSplit, paper_split
from .tokenizer import build_tokenizer, tokenizer_from_json, tokenizer_to_json

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
