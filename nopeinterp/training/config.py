"""`TrainConfig`: every setting of one training run, validated on construction.

Its fields carry their command-line description (`flag`): `nopeinterp train` and `nopeinterp
sweep` build their flags, help and the values they pass back from these fields alone
(`nopeinterp._args.add_config_flags`). A flag not given leaves the preset's value (or this
default). This module imports nothing heavy, so `nopeinterp --help` answers at once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from nopeinterp.errors import NopeinterpError, check_choice
from nopeinterp.options import PE_TYPES, TRAIN_TASKS

VAL_SETS = ("sampled", "eval_set")


def flag(default, help: str = "", *, nested=None, grid: bool = True, **more):
    """A TrainConfig field shown on the command line: `help`; `nested` for a dict field, each
    key's (flag, parser name, help); `grid=False`: a single run's flag (train, not sweep)."""
    meta = {"help": help, "nested": nested, "grid": grid, **more}
    if callable(default):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


def check_pe(pe: str) -> None:
    """Raise NopeinterpError unless `pe` is a positional encoding a model can be trained with."""
    check_choice(pe, PE_TYPES, "pe")


def check_task_name(name: str, spec: str | None = None, *, names=TRAIN_TASKS) -> str:
    """`name` if it is one of `names` (default: every task `train` takes), else NopeinterpError
    naming them (and the whole `spec` it came from). Imports no task, so a mistyped name is
    refused before torch loads; a task's options are checked when it is built."""
    where = f" in {spec!r}" if spec is not None and spec != name else ""
    return check_choice(name, names, "task", where=where)


@dataclass
class TrainConfig:
    task: str
    pe: str
    out: str
    steps: int = flag(2000, "optimizer steps")
    batch_size: int = flag(32, "the global batch: over all ranks and accumulation steps")
    lr: float = flag(1e-3, "peak learning rate (AdamW)")
    warmup: float = flag(0.06, "warm-up, a fraction of the steps (as the paper)")
    weight_decay: float = flag(0.01, "AdamW weight decay")
    grad_clip: float = 1.0
    seed: int = flag(0, "seed of the initial weights and the data", grid=False)
    n_layers: int = flag(2, "blocks")
    n_heads: int = flag(4, "attention heads per block")
    d_model: int = flag(64, "width of the residual stream")
    d_mlp: int | None = flag(None, "MLP width (default 4 x d_model)")
    d_head: int | None = flag(None, "width of a head (default d_model / n_heads)")
    arch: str = flag(
        "default", "default (pre-LayerNorm blocks with biases) or t5 (the paper's T5 decoder)"
    )
    attn_scale: bool | None = flag(
        None, "divide logits by sqrt(d_head) (default: the arch's; t5 does not)", boolean=True
    )
    dropout: float = flag(0.0, "dropout on embeddings, attention weights and outputs")
    pe_options: dict = flag(
        dict,
        nested={
            "num_buckets": ("--num-buckets", "integer", "t5 only"),
            "fraction": ("--rotary-fraction", "number", "rotary only"),
        },
    )
    task_options: dict = flag(  # e.g. {"id_lengths": [2, 10]}
        dict,
        nested={
            "id_lengths": ("--train-lengths", "length_pair", "e.g. 2-20"),
            "ood_lengths": ("--ood-lengths", "length_pair", "e.g. 21-40"),
        },
    )
    eval_every: int = flag(250, "steps between validations")
    eval_n: int = flag(100, "validation examples (per length with val_set=eval_set)")
    # validation items: "sampled" = `task.generate(eval_n, split="val")` (drawn with
    # replacement; what the shipped checkpoints used), "eval_set" = `task.eval_set("val",
    # n_per_length=eval_n)` (each held-out item at most once, eval_n per ID length: the reproduction protocol)
    val_set: str = flag(
        "sampled", "validation items: sampled or eval_set (each held-out item once)"
    )
    stop_at_val: float | None = flag(
        None, "finish early once the validation exact match reaches this"
    )
    stop_evals: int = flag(1, "... on this many evaluations in a row")
    checkpoint_every: int = flag(250, "steps between training-state saves")
    dtype: str = flag("float32", "of the saved checkpoint", choices=("float32", "float16"))
    precision: str = flag("fp32", "of the computation: fp32, bf16 or fp16 (autocast)")
    grad_accum: int = flag(1, "micro-batches per step (same weights as one batch)")
    length_groups: int = flag(
        1,
        "split each micro-batch into this many groups of rows of similar length, each cut to "
        "its longest row: the same loss on less padding (float rounding and dropout draws differ)",
    )
    preset: str | None = None  # recorded; make_config applies its values
    device: str = flag("auto", "auto, cpu, cuda or mps")
    resume: bool = flag(False, "continue from <out>.state.pt", grid=False, store_true=True)
    progress: bool = True
    stop_after: int | None = None  # stop (as if interrupted) after this step; for tests

    def __post_init__(self):
        if self.attn_scale is None:  # the arch's own: T5 does not scale its logits
            self.attn_scale = self.arch != "t5"
        self.validate()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Raise NopeinterpError naming the first bad value; nothing has run yet."""
        from nopeinterp.models import ARCH_TYPES
        from nopeinterp.options import LM_TASK
        from nopeinterp.training.runtime import DEVICES, PRECISIONS

        check_task_name(self.task)
        check_pe(self.pe)
        for name in ("steps", "batch_size", "n_layers", "n_heads", "d_model", "eval_every"):
            _at_least(self, name, 1)
        for name in ("eval_n", "checkpoint_every", "grad_accum", "length_groups", "stop_evals"):
            _at_least(self, name, 1)
        for name in ("d_mlp", "d_head"):
            if getattr(self, name) is not None:
                _at_least(self, name, 1)
        if self.stop_after is not None:
            _at_least(self, "stop_after", 1)
        check_choice(self.arch, ARCH_TYPES, "arch")
        if self.d_head is None and self.d_model % self.n_heads:
            raise NopeinterpError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        checks = [
            ("lr", self.lr > 0, "> 0"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("warmup", 0 <= self.warmup < 1, "a fraction of steps in [0, 1)"),
            ("grad_clip", self.grad_clip > 0, "> 0"),
            ("dropout", 0 <= self.dropout < 1, "in [0, 1)"),
            ("val_set", self.val_set in VAL_SETS, " or ".join(VAL_SETS)),
            ("dtype", self.dtype in ("float32", "float16"), "float32 or float16"),
            ("precision", self.precision in PRECISIONS, " or ".join(PRECISIONS)),
            ("device", self.device in DEVICES, " or ".join(DEVICES)),
            (
                "stop_at_val",
                self.stop_at_val is None or 0 < self.stop_at_val <= 1,
                "an exact match in (0, 1]",
            ),
        ]
        for name, ok, expected in checks:
            value = getattr(self, name)
            if not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise NopeinterpError(f"{name}={value!r}: must be {expected}")
        if self.stop_at_val is not None and self.task == LM_TASK:
            raise NopeinterpError(
                f"stop_at_val={self.stop_at_val}: the {LM_TASK} task has no exact match to stop on"
            )
        if self.batch_size % self.grad_accum:
            raise NopeinterpError(
                f"batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}"
            )
        if Path(self.out).is_dir():
            raise NopeinterpError(f"out={self.out}: is a directory; give a file path (.pt)")


def _at_least(cfg, name, low):
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise NopeinterpError(f"{name}={value!r}: must be an integer >= {low}")


def _at_least(cfg, name, low):
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise NopeinterpError(f"{name}={value!r}: must be an integer >= {low}")


def train_flags(*, grid: bool = False) -> list:
    """The TrainConfig fields the command line shows (`grid`: those of a sweep)."""
    return [
        f
        for f in dataclasses.fields(TrainConfig)
        if "help" in f.metadata and (f.metadata["grid"] or not grid)
    ]
