"""The options of every analysis: one frozen dataclass each, on a shared base, validated once.

    ProbeOptions(n_train=64, layers=(0, 1))      # checked here, before any model is loaded
    probe_position("ckpt.pt", n_train=64)        # the same, through the notebook front
    nopeinterp probe-position ckpt.pt --n-train 64   # the same: the CLI's flags are these fields

Names mean one thing everywhere:
  - `n_eval`: sequences per analysed split (ID, OOD) drawn from a task;
  - `n_train`: sequences a probe (or an eraser) is fitted on;
  - `n` / `n_per_length`: examples at every length (exact match, attention regions; the
    attention comparison);
  - `lengths`: the lengths analysed one by one (task lengths; lm-eval: window lengths in tokens);
  - `id_lengths` / `ood_lengths`: (lo, hi) ranges that override the task's;
  - `layers`: which layers to analyse (None = all), checked against the model by `layer_list`.

Each field's `metadata` says how the command line shows it: the help text, the name of the
`nopeinterp._args` parser of its text, and whether it is a flag at all (`progress` is `--quiet`,
a title is for notebooks). `nopeinterp.cli` builds every analysis flag from these fields, with
these defaults; nothing else writes them down. This module imports nothing from nopeinterp.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, replace

# The paper's five encodings (and learned APE), then the newer ones (nopeinterp.models builds
# each; MODEL_CLASSES is checked against this order there).
PAPER_PE_TYPES = ("nope", "t5", "alibi", "rotary", "ape", "sinusoidal")
PE_TYPES = (*PAPER_PE_TYPES, "fire", "kerple")
# The synthetic tasks, and what `train` takes: those and language modelling on a corpus
# (nopeinterp.tasks builds each; its registry is checked against these names there).
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
LM_TASK = "lm"
TRAIN_TASKS = (*TASKS, LM_TASK)
HEAD_CHOICES = ("min", "hungarian", "same")  # how compare_attention pairs heads
HOOKS = ("resid_post", "resid_mid", "attn_out", "mlp_out")  # what a position probe reads
CONCEPTS = ("index", "onehot")  # what position erasure erases
TOKEN_SOURCES = ("generated", "gold")  # what attention regions read: greedy output or targets
LM_MODES = ("nonoverlap", "sliding")  # how lm-eval cuts the token stream into windows
ROPE_TYPES = ("default", "linear", "dynamic", "yarn")  # RoPE scaling of a rotary model
MAX_TASK_LENGTH = 10_000  # the longest length any task samples (each task may narrow it)
# torch threads of an analysis command and of the main job: the shipped models are tiny, and on
# a 2-core machine a second thread only contends (the main job took 40 min at the default thread
# count beside other jobs, under 2 min with one thread beside the test suite; `probe-position`
# on copy-nope 53 s at the default, 11.4 s with one). More help large models.
THREADS = 1


def option(default, help: str = "", *, parse: str | None = None, flag: bool = True, **more):
    """A dataclass field with its command-line description (see the module docstring)."""
    return field(default=default, metadata={"help": help, "parse": parse, "flag": flag, **more})


def layer_list(layers, lo: int, hi: int, what: str = "") -> list[int]:
    """`layers` (None = lo..hi) sorted, each checked to lie in lo..hi: the one layer check."""
    if layers is None:
        return list(range(lo, hi + 1))
    out = sorted({int(x) for x in layers})
    for layer in out:
        if not lo <= layer <= hi:
            raise ValueError(f"layer {layer} out of range {lo}..{hi}{what}")
    return out


def _range(name, value):
    if value is None:
        return None
    lo, hi = (int(v) for v in value)
    if not 1 <= lo <= hi:
        raise ValueError(f"{name} must be a range (lo, hi) with 1 <= lo <= hi, got {value}")
    return (lo, hi)


class _Described:
    """Validation and construction shared by every options dataclass."""

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first bad value (runs on construction)."""
        for f in fields(self):
            value = getattr(self, f.name)
            low = f.metadata.get("at_least")
            if f.metadata.get("parse") == "positive_int":
                low = 1
            if low is not None and value is not None and value < low:
                raise ValueError(f"{f.name} must be >= {low}, got {value}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be finite, got {value}")
            choices = f.metadata.get("choices")
            if choices and value not in choices:
                raise ValueError(f"{f.name} must be one of {', '.join(choices)}, got {value!r}")

    @classmethod
    def make(cls, options=None, **changes):
        """`options` (an instance, or None for the defaults) with `changes` applied."""
        if options is not None and not isinstance(options, cls):
            raise TypeError(f"options must be a {cls.__name__}, got {type(options).__name__}")
        unknown = set(changes) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"{cls.__name__} has no option {', '.join(sorted(unknown))}")
        return replace(options, **changes) if options is not None else cls(**changes)

    @classmethod
    def flags(cls) -> list:
        """The fields shown on the command line, in declaration order."""
        return [f for f in fields(cls) if f.metadata.get("flag", True)]

    @classmethod
    def default(cls, name: str):
        f = next(f for f in fields(cls) if f.name == name)
        return f.default_factory() if f.default is MISSING else f.default


@dataclass(frozen=True)
class Options(_Described):
    """What every analysis takes: the sampling seed, the batch, the device and progress."""

    seed: int = option(0, "seed of the sampled examples", parse="integer")
    batch_size: int = option(64, "sequences per forward pass", parse="positive_int")
    device: str | None = option(None, "e.g. cuda (default: where the model is)")
    threads: int = option(THREADS, "torch threads (default 1: the models are small; more "
                          "help large models)", parse="positive_int")  # fmt: skip
    progress: bool = option(True, flag=False)  # the command line's --quiet
    title: str | None = option(None, flag=False)  # the result's title (default: described)


@dataclass(frozen=True)
class LayerOptions(Options):
    """... of an analysis that reads chosen layers."""

    layers: tuple[int, ...] | None = option(
        None, "comma-separated, e.g. 0,1 (default all)", parse="layers"
    )

    def __post_init__(self):
        if self.layers is not None:
            layers = tuple(int(x) for x in self.layers)
            if any(x < 0 for x in layers):
                raise ValueError(f"layers are >= 0, got {list(layers)}")
            object.__setattr__(self, "layers", layers)
        super().__post_init__()


@dataclass(frozen=True)
class RangeOptions(LayerOptions):
    """Options of an analysis of sequences: which layers, which lengths."""

    id_lengths: tuple[int, int] | None = option(
        None, "default: the task's ID range", parse="length_range"
    )
    ood_lengths: tuple[int, int] | None = option(
        None, "default: the task's OOD range", parse="length_range"
    )

    def __post_init__(self):
        object.__setattr__(self, "id_lengths", _range("id_lengths", self.id_lengths))
        object.__setattr__(self, "ood_lengths", _range("ood_lengths", self.ood_lengths))
        super().__post_init__()


@dataclass(frozen=True)
class SampleOptions(RangeOptions):
    """... that samples `n_eval` sequences per split from a task."""

    n_eval: int = option(256, "sequences per evaluated split", parse="positive_int")


@dataclass(frozen=True)
class FitOptions(SampleOptions):
    """... that also fits something (a probe, an eraser) on `n_train` sequences."""

    n_train: int = option(512, "sequences to fit on", parse="positive_int")
    hook: str = option("resid_post", flag=False, choices=HOOKS)  # the activations read
    alphas: tuple[float, ...] | None = option(None, flag=False)  # ridge penalties; None: defaults


# --- one per analysis --------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthOptions(Options):
    """... that draws `n` examples of a task at each length, as `evaluate` draws them."""

    lengths: tuple[int, ...] | None = option(
        None, "default: the task's ID and OOD ranges", parse="lengths"
    )
    n: int | None = option(200, "examples per length", parse="positive_int")

    def __post_init__(self):
        if self.lengths is not None:
            object.__setattr__(self, "lengths", tuple(int(x) for x in self.lengths))
        super().__post_init__()


@dataclass(frozen=True)
class EvalOptions(LengthOptions):
    """`nopeinterp.evaluation.evaluate`: greedy exact match per length."""

    use_cache: bool = option(True, flag=False)
    error_kinds: bool = option(
        False, "count the wrong answers by kind: too short, too long, wrong words"
    )
    name: str | None = option(None, flag=False)  # the model's name in the table


@dataclass(frozen=True)
class RegionOptions(LengthOptions, LayerOptions):
    """`nopeinterp.probing.attention_regions`: attention mass by region while generating
    (`layers` are blocks, 0 = the first)."""

    batch_size: int = option(8, "sequences per forward pass", parse="positive_int")
    n: int = option(8, "examples per length", parse="positive_int")
    tokens: str = option(
        "generated", "the model's greedy output, or the gold targets teacher-forced",
        choices=TOKEN_SOURCES,
    )  # fmt: skip
    name: str | None = option(None, flag=False)  # the model's name in the table


@dataclass(frozen=True)
class LMEvalOptions(Options):
    """`nopeinterp.lm_eval.lm_eval`: loss by position, perplexity and passkey of a language
    model (`seed`: of the passkeys)."""

    batch_size: int | None = option(
        None, "windows per forward pass (default: 8192 tokens' worth)", parse="positive_int"
    )
    lengths: tuple[int, ...] = option((256, 512, 1024, 2048), "window lengths", parse="lengths")
    mode: str = option("nonoverlap", "how windows cut the stream", choices=LM_MODES)
    stride: int | None = option(
        None, "sliding mode: tokens scored per window (default length/4)", parse="positive_int"
    )
    max_windows: int | None = option(
        64, "windows per length (the first)", parse="positive_int", aliases=("--windows",)
    )
    depths: tuple[float, ...] = option(
        (0.0, 0.25, 0.5, 0.75, 1.0),
        "passkey depths in [0, 1], comma-separated ('' skips passkey)", parse="numbers",
    )  # fmt: skip
    trials: int = option(20, "passkey prompts per length and depth", parse="positive_int")
    name: str | None = option(None, flag=False)  # the model's name in the tables

    def __post_init__(self):
        lengths = tuple(sorted({int(n) for n in self.lengths}))
        if not lengths or lengths[0] < 2:
            raise ValueError(f"lengths {list(lengths)}: each must be >= 2")
        depths = tuple(float(d) for d in self.depths)
        if any(not 0 <= d <= 1 for d in depths):
            raise ValueError(f"depths {list(depths)}: each must be in [0, 1]")
        if self.mode == "nonoverlap" and self.stride is not None:
            raise ValueError("stride is for --mode sliding")
        if self.stride is not None and not 1 <= self.stride <= lengths[0]:
            raise ValueError(f"stride {self.stride}: must be in 1..{lengths[0]} (the shortest "
                             "length)")  # fmt: skip
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "depths", depths)
        super().__post_init__()


@dataclass(frozen=True)
class ProbeOptions(FitOptions):
    """`nopeinterp.probing.probe_position`: linear position probes per layer."""

    random_baseline: bool = option(True, flag=False)
    shuffle_control: bool = option(True, flag=False)
    random_init_seed: int | None = option(None, flag=False)


@dataclass(frozen=True)
class AttentionOptions(SampleOptions):
    """... that reads whole attention patterns (rows of [T, T]): smaller batches and sets."""

    batch_size: int = option(16, "sequences per forward pass", parse="positive_int")
    n_eval: int = option(128, "sequences per evaluated split", parse="positive_int")


@dataclass(frozen=True)
class DistanceOptions(AttentionOptions):
    """`nopeinterp.probing.distance_dependence`: logits explained by relative distance."""


@dataclass(frozen=True)
class ErasureOptions(FitOptions):
    """`nopeinterp.probing.erase_position`: LEACE erasure of position vs a random control."""

    concept: str = option("index", flag=False, choices=CONCEPTS)
    erase_fraction: float = option(0.5, flag=False)
    control_seed: int = option(0, flag=False)
    task_metrics: bool = option(True, flag=False)

    def __post_init__(self):
        if not 0 < self.erase_fraction < 1:
            raise ValueError(f"erase_fraction must be in (0, 1), got {self.erase_fraction}")
        super().__post_init__()


@dataclass(frozen=True)
class HeadOptions(AttentionOptions):
    """`attention_sinks` and `classify_heads` (the CLI's `heads` runs both on one model)."""


@dataclass(frozen=True)
class CompareOptions(RangeOptions):
    """`nopeinterp.similarity.compare_attention`: NoPE's attention against references."""

    batch_size: int = option(32, "sequences per forward pass", parse="positive_int")
    n_per_length: int = option(10, "examples per length", parse="positive_int", aliases=("--n",))
    heads: str = option("min", "how heads are paired", choices=HEAD_CHOICES)
    paper_compat: bool = option(False, "the official code's formula and head pairing")
    include_first_row: bool | None = option(None, flag=False)
    n_boot: int = option(1000, flag=False, at_least=1)
    example_layer: int = option(0, flag=False)


@dataclass(frozen=True)
class ReportOptions(_Described):
    """`nopeinterp report` (the main job): how much of each analysis the page runs."""

    n: int = option(20, "examples per length for exact match", parse="positive_int")
    n_per_length: int = option(10, "examples per length for the attention comparison",
                               parse="positive_int", aliases=("--n-attention",))  # fmt: skip
    n_probe: int = option(256, "probe-training sequences (and half that per evaluated split)",
                          parse="positive_int")  # fmt: skip
    n_distance: int = option(64, "ID and OOD sequences per distance analysis",
                             parse="positive_int")  # fmt: skip
    n_heads: int = option(32, "sequences per split for the head taxonomy", parse="positive_int")
    distance_pes: tuple[str, ...] = option(
        ("all",), "PEs given the distance analysis, comma-separated (NoPE always; default all)",
        parse="names",
    )  # fmt: skip
    threads: int = option(THREADS, "torch threads (default 1: the models are small)",
                          parse="positive_int")  # fmt: skip
    explorer_per_split: int = option(3, flag=False, at_least=1)
    progress: bool = option(True, flag=False)

    def __post_init__(self):
        object.__setattr__(self, "distance_pes", tuple(self.distance_pes))
        super().__post_init__()


ANALYSIS_OPTIONS = {
    "eval": EvalOptions,
    "lm-eval": LMEvalOptions,
    "attention-regions": RegionOptions,
    "probe-position": ProbeOptions,
    "probe-distance": DistanceOptions,
    "erase-position": ErasureOptions,
    "heads": HeadOptions,
    "compare-attention": CompareOptions,
    "report": ReportOptions,
}


__all__ = [
    "ANALYSIS_OPTIONS",
    "AttentionOptions",
    "CompareOptions",
    "DistanceOptions",
    "ErasureOptions",
    "EvalOptions",
    "FitOptions",
    "HeadOptions",
    "LMEvalOptions",
    "LayerOptions",
    "LengthOptions",
    "Options",
    "ProbeOptions",
    "RangeOptions",
    "RegionOptions",
    "ReportOptions",
    "SampleOptions",
    "layer_list",
    "option",
]
