"""Is the position that probes find used? Erase it (LEACE) and see what breaks.

At one layer at a time, linearly decodable absolute position is removed from the residual
stream with least-squares concept erasure (LEACE, Belrose et al. 2023), using the
`concept-erasure` package (`LeaceFitter` / `LeaceEraser`, its default settings: covariance
shrinkage, trace constraint, svd_tol 0.01) as the implementation. The eraser is an affine map
``x -> x - (x - bias) @ proj_right.T @ proj_left.T`` applied to every token through a
forward hook on that layer's hook point, so everything downstream (later layers, the logits,
greedy decoding with its KV cache) sees the erased stream. The map is applied in float64 and
the result cast back to the model's dtype: applied in float32, its rounding error in the
directions the stream does not use is itself decodable (measured on the Theorem 1 model,
whose stream is exactly rank-deficient: in-sample probe R^2 after erasure 0.059 in float32,
0.006 in float64).

Concept. ``concept="index"`` (default) erases the token's absolute index t (0 = <bos>): a
rank-1 erasure after which no linear function of the activations correlates with t (on the
fitting distribution). ``concept="onehot"`` erases the one-hot position over the positions
seen when fitting: every linear function of any function of position, rank up to P - 1.

Sequence sets (all disjoint; `data` as for `probe_position`): the probe-training sequences
are split into "erase" (`erase_fraction`, fits the eraser on *unerased* activations) and
"fit" (the rest: a fresh probe is fitted on *erased* activations, "val" choosing its alpha);
the probe is scored on held-out "ID" and "OOD" sequences, erased too.

Conditions, per layer (0 = embeddings, l = after block l; `probe_layers` naming):
  - ``none``: no erasure (the probe and task metrics of the model as it is; the task metrics
    repeat at every layer so the table aligns);
  - ``leace``: the LEACE eraser of that layer;
  - ``random``: the control: orthogonal projection (about the fitted mean) out of a random
    subspace of the same rank as the LEACE eraser (Haar-random, seeded by `control_seed`).
Metrics per (condition, layer, split): the refitted position probe's ``r2``, ``mae`` and
``accuracy`` (`probe_position`, ridge regression and one-hot ridge classifier) and, when
`data` is a task, ``exact_match`` (greedy decoding, `evaluation.exact_match`) and
``target_loss`` (mean cross-entropy per target token, `training.target_loss`) on the ID and
OOD examples of the probe's ID/OOD sets. ``delta`` = value - the ``none`` value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd
import torch
from concept_erasure import LeaceEraser, LeaceFitter

from nopeinterp.data import Sequences, Splits, _random_split, as_splits, make_sequences
from nopeinterp.errors import check_choice
from nopeinterp.inputs import ModelInput, analysis_front, as_model, describe
from nopeinterp.options import CONCEPTS, ErasureOptions, ProbeOptions
from nopeinterp.probing._stream import stream
from nopeinterp.probing.position import _positions, probe_layers, run_probe_position
from nopeinterp.results import Result

CONDITIONS = ("none", "leace", "random")
PROBE_METRICS = ("r2", "mae", "accuracy")
TASK_METRICS = ("exact_match", "target_loss")
TABLE_COLUMNS = [
    "condition",
    "layer",
    "hook_name",
    "rank",
    "split",
    "metric",
    "value",
    "delta",
    "n",
]


def position_concept(positions: torch.Tensor, concept: str = "index", n_classes: int = 0):
    """The concept to erase for token positions [n]: [n, 1] index or [n, n_classes] one-hot."""
    if check_choice(concept, CONCEPTS, "concept", error=ValueError) == "index":
        return positions.double()[:, None]
    out = torch.zeros(positions.shape[0], n_classes, dtype=torch.float64)  # "onehot"
    ok = positions < n_classes
    out[ok.nonzero().flatten(), positions[ok]] = 1.0
    return out


def eraser_rank(eraser: LeaceEraser) -> int:
    """Number of directions the eraser moves: the rank of ``I - P = proj_left @ proj_right``.

    (The package zeroes the columns it truncates; with its trace constraint active, P is a
    mixture of two projections and is stored densely, so the rank is computed, not counted.)
    """
    return int(torch.linalg.matrix_rank(eraser.proj_left @ eraser.proj_right))


def random_subspace_eraser(d: int, rank: int, mean: torch.Tensor, seed: int = 0) -> LeaceEraser:
    """Orthogonal projection out of a Haar-random rank-`rank` subspace of R^d, about `mean`.

    Returned as a `LeaceEraser` (``proj_left = Q``, ``proj_right = Q^T``, ``bias = mean``), so
    the control is applied by exactly the same code as the LEACE eraser.
    """
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, max(rank, 0), generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))[None, :]  # Haar measure (sign convention)
    return LeaceEraser(q, q.T.clone(), mean.to(torch.float64).clone())


def fit_position_erasers(
    model,
    tokens,
    attention_mask=None,
    *,
    layers: Sequence[int] | None = None,
    hook: str = "resid_post",
    concept: str = "index",
    n_classes: int | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> dict[int, LeaceEraser]:
    """A LEACE position eraser per layer, fitted on the (unerased) activations of `tokens`.

    `tokens` [B, T] (right-padded, `attention_mask` [B, T]), a `Sequences` or a Batch. Every
    real token's concept is its index (see `position_concept`); `n_classes` for "onehot"
    defaults to the longest row. Statistics are streamed (float64), one batch at a time.
    """
    check_choice(concept, CONCEPTS, "concept", error=ValueError)
    s = _as_sequence_set(tokens, attention_mask)
    layer_hooks = probe_layers(model.cfg.n_layers, hook, layers)
    if n_classes is None:
        n_classes = int(s.attention_mask.sum(1).max())
    k = 1 if concept == "index" else n_classes
    d = model.cfg.d_model
    fitters = {layer: LeaceFitter(d, k, dtype=torch.float64, device="cpu") for layer in layer_hooks}
    for _, mask, acts in stream(
        model,
        s,
        layer_hooks,
        batch_size=batch_size,
        progress=progress,
        desc="erasure: fit",
    ):
        real = mask.bool()
        z = position_concept(_positions(real)[real], concept, n_classes)
        for layer, act in acts.items():
            fitters[layer].update(act[real].detach().to("cpu", torch.float64), z)
        del acts, act  # before the pass computes the next layer
    return {layer: f.eraser for layer, f in fitters.items()}


def _as_sequence_set(tokens, attention_mask=None) -> Sequences:
    if isinstance(tokens, Sequences):
        return tokens
    return next(iter(make_sequences(tokens, attention_mask=attention_mask).values()))


@contextlib.contextmanager
def erasing(model, hook_name: str, eraser: LeaceEraser | None):
    """Context in which `model` applies `eraser` to the output of hook point `hook_name`."""
    if eraser is None:
        yield model
        return
    cast = {}

    def apply(act, hook):  # computed in float64 whatever the model's dtype, then cast back
        if act.device not in cast:
            cast[act.device] = LeaceEraser(
                *(
                    None if t is None else t.to(device=act.device, dtype=torch.float64)
                    for t in (eraser.proj_left, eraser.proj_right, eraser.bias)
                )
            )
        return cast[act.device](act.to(torch.float64)).to(act.dtype)

    with model.hooks(fwd_hooks=[(hook_name, apply)]):
        yield model


@dataclass(repr=False)
class ErasureResult(Result):
    """Tidy table: one row per (condition, layer, split, metric); see the module docstring."""

    name = "erase_position"
    title = "Position erasure (LEACE) and a random-subspace control"

    def pivot(self, metrics: str | Sequence[str] = ("r2", "exact_match")) -> pd.DataFrame:
        """Layers as rows, "<metric> <condition> <split>" columns (the metrics present)."""
        metrics = [metrics] if isinstance(metrics, str) else list(metrics)
        t = self.table[self.table.metric.isin(metrics)]
        t = t.assign(column=t.metric + " " + t.condition + " " + t.split)
        p = t.pivot_table(index="layer", columns="column", values="value", aggfunc="first")
        order = [f"{m} {c} {s}" for m in metrics for c in CONDITIONS for s in ("ID", "OOD")]
        return p[[c for c in order if c in p.columns]]


def _task_metrics(model, task, tokenizer, sets: dict[str, Sequences], batch_size) -> list[dict]:
    """Exact match and target loss on the task examples behind each held-out split."""
    from nopeinterp.evaluation import exact_match
    from nopeinterp.tasks import encode_examples
    from nopeinterp.training.trainer import target_loss

    rows = []
    for split in ("ID", "OOD"):
        exs = sets[split].examples if split in sets else None
        if not exs:
            continue
        correct = exact_match(model, tokenizer, task, exs, batch_size=batch_size)
        total, count = 0.0, 0
        with torch.inference_mode():
            for i in range(0, len(exs), batch_size):
                batch = encode_examples(tokenizer, exs[i : i + batch_size])
                n = int(batch.target_mask[:, :-1].sum())
                total += float(target_loss(model, batch)) * n
                count += n
        rows.append(
            {"split": split, "metric": "exact_match", "value": sum(correct) / len(correct)}
            | {"n": len(correct)}
        )
        rows.append({"split": split, "metric": "target_loss", "value": total / count, "n": count})
    return rows


def run_erase_position(mi: ModelInput, sets: Splits, opts: ErasureOptions) -> ErasureResult:
    """Erasure and its control on resolved inputs ("fit", "val", "ID", "OOD" `sets` of `mi`)."""
    model = mi.model
    if isinstance(model, torch.nn.Module):
        model.eval()
    hook, seed, batch_size = opts.hook, opts.seed, opts.batch_size
    layer_hooks = probe_layers(model.cfg.n_layers, hook, opts.layers)
    if "ID" not in sets:
        raise ValueError("no held-out ID sequences to evaluate the probe on")
    if "fit" not in sets or len(sets["fit"]) < 2:
        raise ValueError("too few training sequences to split into eraser and probe sets")
    fraction = opts.erase_fraction
    parts = _random_split(sets["fit"], {"erase": fraction, "fit": 1 - fraction}, seed)
    if min(len(parts["erase"]), len(parts["fit"])) < 1:
        raise ValueError("too few training sequences to split into eraser and probe sets")
    probe_sets = {**dict(sets), "fit": parts["fit"]}
    n_classes = int(parts["erase"].attention_mask.sum(1).max())
    task, tok = (sets.task, sets.tokenizer) if opts.task_metrics else (None, None)

    erasers = fit_position_erasers(
        model,
        parts["erase"],
        layers=list(layer_hooks),
        hook=hook,
        concept=opts.concept,
        n_classes=n_classes,
        batch_size=batch_size,
        progress=opts.progress,
    )
    probe_opts = ProbeOptions(
        hook=hook,
        random_baseline=False,
        shuffle_control=False,
        batch_size=batch_size,
        seed=seed,
        progress=opts.progress,
        alphas=opts.alphas,
    )
    probe_mi = as_model(model)
    probe_splits = as_splits(probe_sets, model)

    def probe_rows(layers):
        opts_l = replace(probe_opts, layers=layers)
        t = run_probe_position(probe_mi, probe_splits, opts_l).table
        t = t[(t.model == "trained") & t.metric.isin(PROBE_METRICS)]
        return t[["layer", "split", "metric", "value", "n"]].to_dict("records")

    def task_rows():
        return _task_metrics(model, task, tok, sets, batch_size) if task is not None else []

    rows = []
    base_task = task_rows()
    for r in probe_rows(list(layer_hooks)):
        rows.append({"condition": "none", "rank": 0, **r})
    for layer in layer_hooks:
        rows += [{"condition": "none", "rank": 0, "layer": layer, **r} for r in base_task]
    for layer, hook_name in layer_hooks.items():
        leace = erasers[layer]
        rank = eraser_rank(leace)
        control = random_subspace_eraser(
            model.cfg.d_model, rank, leace.bias, seed=opts.control_seed + 1000 * layer
        )
        for cond, eraser in (("leace", leace), ("random", control)):
            with erasing(model, hook_name, eraser):
                found = [{"layer": layer, **r} for r in probe_rows([layer])]
                found += [{"layer": layer, **r} for r in task_rows()]
            rows += [{"condition": cond, "rank": rank, **r} for r in found]

    table = pd.DataFrame(rows)
    table["hook_name"] = table.layer.map(layer_hooks)
    base = table[table.condition == "none"].set_index(["layer", "split", "metric"]).value
    key = pd.MultiIndex.from_frame(table[["layer", "split", "metric"]])
    table["delta"] = table.value.to_numpy() - base.reindex(key).to_numpy()
    table = table[TABLE_COLUMNS].sort_values(["layer", "condition", "split", "metric"])
    meta = {
        "title": opts.title or describe(mi, "Position erasure"),
        "hook": hook,
        "concept": opts.concept,
        "erase_fraction": fraction,
        "control_seed": opts.control_seed,
        "n_classes": n_classes,
        "leace": "concept_erasure.LeaceFitter defaults (shrinkage, trace constraint, svd_tol)",
        "seed": seed,
        "task": getattr(task, "name", None),
        **sets.meta(),
        "n_seq_erase": len(parts["erase"]),
        "n_seq_fit": len(parts["fit"]),
    }
    return ErasureResult(table.reset_index(drop=True), meta)


erase_position = analysis_front(
    run_erase_position,
    ErasureOptions,
    name="erase_position",
    purpose="probe",
    doc="""Erase position at each layer (LEACE, and a same-rank random control); see the module
docstring for the sets, conditions and metrics.

`model`: a hooked model (ours, `from_hf`, a TL model), a Checkpoint or a checkpoint path. `data`: anything
`nopeinterp.data.make_sequences` takes, as for `probe_position`; None = the checkpoint's
own task (`n_train` train-pool sequences, `n_eval` held-out ID and OOD ones). Task metrics
(exact match, target loss) need task data and `task_metrics=True`. Options
(`nopeinterp.options.ErasureOptions`): `options=` or any of its fields.
""",
)


__all__ = [
    "CONCEPTS",
    "CONDITIONS",
    "ErasureResult",
    "erase_position",
    "eraser_rank",
    "erasing",
    "fit_position_erasers",
    "position_concept",
    "random_subspace_eraser",
    "run_erase_position",
]
