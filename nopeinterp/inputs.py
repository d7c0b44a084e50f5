"""Resolving a model once, at the entry point (the CLI, the report, a notebook call).

`as_model(obj)` turns "a hooked model, a loaded `Checkpoint` or a checkpoint path" into one
`ModelInput` (loading a path safely, weights only); `nopeinterp.data.make_sequences` turns "any
data" into `Splits`. The analyses' cores take `(ModelInput, Splits, options)` and never
normalise their inputs again; the public functions (`probe_position("ckpt.pt")`, ...) are thin
fronts that resolve, then call their core.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from pathlib import Path

from nopeinterp.data import Splits, make_sequences, task_spec
from nopeinterp.errors import NopeinterpError

# What `make_sequences` takes from an options object, when the options have it.
_DATA_OPTIONS = ("id_lengths", "ood_lengths", "n_train", "n_eval", "n_per_length", "seed")


@dataclass
class ModelInput:
    """A model to analyse, with what its checkpoint says about it (empty for a bare model)."""

    model: object  # a hooked model: anything with cfg and run_with_cache (ours, TL, a bridge)
    tokenizer: object | None
    meta: dict
    name: str
    checkpoint: object | None = None  # the loaded Checkpoint, if it came from one

    @property
    def layer_pe(self) -> list[str]:
        """Each block's positional encoding (per-layer mixes, e.g. SmolLM3's NoPE layers, and
        stock TransformerLens models alike), for labelling per-layer results."""
        from nopeinterp.models import layer_pes

        return layer_pes(self.model)

    @property
    def task_spec(self):
        """The checkpoint's task: a name, or {"name": ..., **task_options}; None if unknown."""
        return task_spec(self.meta)


def as_model(obj, name: str | None = None, *, device=None) -> ModelInput:
    """A model, a `Checkpoint` or a checkpoint path -> ModelInput (loading a path safely, onto
    `device` when given; a model already in memory stays where it is)."""
    if isinstance(obj, ModelInput):
        return obj
    if isinstance(obj, str | os.PathLike):
        from nopeinterp.checkpoint import load_checkpoint

        obj = load_checkpoint(obj, device=device)
    if hasattr(obj, "model") and hasattr(obj, "meta"):
        path = getattr(obj, "path", None)
        label = name or (Path(path).stem if path else str(obj.meta.get("pe", "model")))
        _check_finite_weights(obj.model, label)
        return ModelInput(obj.model, obj.tokenizer, dict(obj.meta or {}), label, obj)
    if not hasattr(obj, "cfg") or not hasattr(obj, "run_with_cache"):
        raise TypeError(
            f"{name or 'model'}: expected a hooked model (cfg and run_with_cache), a Checkpoint or a checkpoint path, "
            f"got {type(obj).__name__}"
        )
    label = name or getattr(obj, "pe", None) or type(obj).__name__
    _check_finite_weights(obj, label)
    return ModelInput(obj, getattr(obj, "tokenizer", None), {}, label, None)


def _check_finite_weights(model, label: str) -> None:
    """NopeinterpError naming the first weight with a NaN or infinity: every number an
    analysis gave from it would be meaningless (a zero accuracy, an empty table)."""
    for key, value in model.named_parameters():  # buffers hold -inf masks on purpose
        if value.is_floating_point() and not bool(value.isfinite().all()):
            raise NopeinterpError(
                f"{label}: weight {key} holds non-finite values (NaN or infinity); "
                "no analysis of this model would mean anything"
            )


def resolve(
    model, data, options, *, purpose: str = "analysis", name: str | None = None, **data_args
) -> tuple[ModelInput, Splits]:
    """The entry's one step: (ModelInput, Splits) from "a model, a checkpoint or a path" and
    "any data" (`make_sequences`, with the lengths, counts and seed `options` carry)."""
    mi = as_model(model, name, device=getattr(options, "device", None))
    return mi, sequences(data, mi, options, purpose=purpose, **data_args)


def sequences(data, mi: ModelInput, options, *, purpose: str = "analysis", **data_args) -> Splits:
    """`make_sequences` of "any data" for `mi`, with the lengths, counts and seed `options`
    carry (those it has)."""
    given = {k: getattr(options, k) for k in _DATA_OPTIONS if hasattr(options, k)}
    return make_sequences(data, mi, purpose=purpose, **given, **data_args)


def analysis_front(core, options_cls, *, name: str, doc: str, purpose: str = "analysis"):
    """The notebook front of an analysis core `core(mi, sets, opts)`: it takes a model (or a
    checkpoint or a path), any data and the options as `options=` or as keywords, resolves
    them once (`resolve`), then calls the core. The front's signature lists every option, and
    `front.core` / `front.options` name the core and its options type."""

    def front(
        model,
        data=None,
        *,
        attention_mask=None,
        lengths=None,
        tokenizer=None,
        options=None,
        **changes,
    ):
        opts = options_cls.make(options, **changes)
        mi, sets = resolve(
            model,
            data,
            opts,
            purpose=purpose,
            attention_mask=attention_mask,
            lengths=lengths,
            tokenizer=tokenizer,
        )
        return core(mi, sets, opts)

    front.__name__ = front.__qualname__ = name
    front.__module__, front.__doc__ = core.__module__, doc
    front.core, front.options = core, options_cls
    given = list(inspect.signature(front).parameters.values())[:-1]  # all but **changes
    kw = inspect.Parameter.KEYWORD_ONLY
    each = [inspect.Parameter(f.name, kw, default=options_cls.default(f.name))
            for f in dataclasses.fields(options_cls)]  # fmt: skip
    front.__signature__ = inspect.Signature(
        [*given, *each], return_annotation=inspect.signature(core).return_annotation
    )
    return front


def describe(model_input: ModelInput, what: str) -> str:
    """A title like 'Position probe | nope | copy | copy-nope'."""
    parts = [what, str(model_input.meta.get("pe", getattr(model_input.model, "pe", "")))]
    task = model_input.meta.get("task")
    if task:
        parts.append(str(task))
    if model_input.checkpoint is not None and getattr(model_input.checkpoint, "path", None):
        parts.append(Path(model_input.checkpoint.path).name)
    return " | ".join(p for p in parts if p)


__all__ = ["ModelInput", "analysis_front", "as_model", "describe", "resolve", "sequences"]
