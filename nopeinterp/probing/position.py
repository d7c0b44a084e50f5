"""Linear probes for absolute position in the residual stream (Theorem 1; Haviv et al. 2022).

For every layer, a ridge regression (target: the token's absolute index, 0 = <bos>) and a
one-hot ridge classifier (a linear least-squares classifier, see `ridge.py`) are fitted on
the real tokens of ID-length sequences and scored on held-out ID sequences and on OOD-length
sequences.

Layers: 0 = the embeddings (``blocks.0.hook_resid_pre``), l = after block l
(``blocks.{l-1}.hook_resid_post``). With ``hook="resid_mid"`` / ``"attn_out"`` /
``"mlp_out"``, layer l (1..n_layers) is that hook of block l-1.

Splits. "fit" sequences train the probe, "val" sequences (ID lengths too) choose alpha by
mean squared error; the final probe is refitted on fit+val with that alpha. "ID" are held-out
ID-length sequences, "OOD" longer ones. Classes are the positions 0..P-1 seen in fit+val:
a token at a position >= P (OOD) cannot be predicted and counts as wrong in "accuracy";
the regression extrapolates linearly.

Metrics (per model, layer, split): ``r2`` (1 - SSE/SST with SST about that split's own mean),
``mae`` (mean |prediction - position|, in positions), ``accuracy`` (classifier, exact
position). Baselines, as extra ``model`` values of the same table:
  - ``random_init``: a fresh model of the same config and PE (seed + 1 by default), same probe;
  - ``constant``: the train mean position (regression; r2 ~ 0 on ID, negative on OOD since
    the OOD mean differs) and the most frequent train position (classifier);
  - ``shuffled``: probes fitted on labels permuted across all fit/val tokens, evaluated on
    the true labels (a control for probe capacity).
Baselines are reported at every layer (the constant one repeats) so tables and plots align.

Degenerate fits. The trained model's activations must be finite (a NaN or infinity at a real
token is an error naming the hook). The random-init control is a model nobody trained: where
its activations overflow, its fit at that layer is degenerate: its values are NaN (never a
number such as the share of tokens at position 0), the row's ``degenerate`` column is True
and ``meta["degenerate_fits"]`` says which layers and why; the trained model's rows stand.

Streaming: activations are never kept. Pass 1 accumulates ridge sufficient statistics per
layer (fit and val); the probes are solved; pass 2 runs over ID/OOD and accumulates the
metrics from the predictions. Each batch goes through the model once, and each hook read is
handed over layer by layer as the pass reaches it (`_stream.stream`): one layer's
activations at a time, whatever the number of layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import pandas as pd
import torch

from nopeinterp._memory import release_free_memory
from nopeinterp.data import Sequences, Splits
from nopeinterp.errors import check_choice
from nopeinterp.hooks import act_name
from nopeinterp.inputs import ModelInput, analysis_front, describe
from nopeinterp.options import HOOKS, ProbeOptions, layer_list
from nopeinterp.probing._stream import stream
from nopeinterp.probing.ridge import DEFAULT_ALPHAS, RidgePath, RidgeProbe, RidgeStats, select_alpha
from nopeinterp.results import Result

METRICS = ("r2", "mae", "accuracy")
MODELS = ("trained", "random_init", "shuffled", "constant")
TABLE_COLUMNS = [
    "model", "layer", "layer_pe", "hook", "hook_name", "split", "metric", "value", "n", "degenerate"
]  # fmt: skip
# why a fit is degenerate (its statistics are not finite): said in the table's `degenerate`
# column (its values are NaN) and in meta["degenerate_fits"]
NON_FINITE = "non-finite activations (NaN or infinity): the model overflows"


def probe_layers(n_layers: int, hook: str = "resid_post", layers=None) -> dict[int, str]:
    """layer -> TL hook name for `hook` (see the module docstring for the numbering)."""
    check_choice(hook, HOOKS, "hook", error=ValueError)
    lo = 0 if hook == "resid_post" else 1
    out = {}
    for layer in layer_list(layers, lo, n_layers, f" for hook {hook!r}"):
        out[layer] = act_name("resid_pre", 0) if layer == 0 else act_name(hook, layer - 1)
    return dict(sorted(out.items()))


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return torch.arange(mask.shape[1]).expand_as(mask)


class _Metrics:
    def __init__(self):
        self.n = 0
        self.abs = self.sse = self.sy = self.syy = 0.0
        self.correct = 0

    def update(self, y: torch.Tensor, reg: torch.Tensor | None, cls: torch.Tensor | None):
        y = y.double()
        self.n += y.numel()
        self.sy += float(y.sum())
        self.syy += float((y * y).sum())
        if reg is not None:
            err = reg.double() - y
            self.abs += float(err.abs().sum())
            self.sse += float((err * err).sum())
        if cls is not None:
            self.correct += int((cls == y.long()).sum())

    def rows(self) -> dict[str, float]:
        sst = self.syy - self.sy**2 / self.n
        r2 = 1 - self.sse / sst if sst > 0 else float("nan")
        return {"r2": r2, "mae": self.abs / self.n, "accuracy": self.correct / self.n}


@dataclass(repr=False)
class ProbeResult(Result):
    """Position-probe results; `table` is tidy (one row per model, layer, split, metric);
    `alphas`: the ridge penalty chosen per (model, layer, probe); `probes`: the fitted probes
    (weights only), keyed by (model, layer, probe)."""

    alphas: pd.DataFrame = field(default_factory=pd.DataFrame)
    probes: dict = field(default_factory=dict)

    name: ClassVar[str] = "probe_position"
    title: ClassVar[str] = "Position probe"
    extra_tables: ClassVar[tuple[str, ...]] = ("alphas",)

    def pivot(
        self,
        metrics: Sequence[str] = ("r2", "mae"),
        models: Sequence[str] = ("trained", "random_init"),
    ) -> pd.DataFrame:
        """Layers as rows; columns "<split> <metric>" (trained) and "... [<model>]" (others)."""
        t = self.table[self.table.metric.isin(metrics) & self.table.model.isin(models)].copy()
        t["column"] = [
            f"{s} {m}" if mod == "trained" else f"{s} {m} [{mod}]"
            for s, m, mod in zip(t.split, t.metric, t.model, strict=True)
        ]
        order = [
            f"{s} {m}" if mod == "trained" else f"{s} {m} [{mod}]"
            for mod in models
            for m in metrics
            for s in ("ID", "OOD")
        ]
        p = t.pivot_table(index="layer", columns="column", values="value", aggfunc="first")
        return p[[c for c in order if c in p.columns]]


def _fit_and_eval(
    model,
    sets: dict[str, Sequences],
    layer_hooks: dict[int, str],
    *,
    n_classes: int,
    shuffled_labels: dict[str, torch.Tensor] | None,
    alphas,
    batch_size,
    progress,
    label,
    model_name="",
    check_finite=True,
):
    d = model.cfg.d_model
    P = n_classes
    groups = {"trained": (0, slice(1, 1 + P))}
    if shuffled_labels is not None:
        groups["shuffled"] = (1 + P, slice(2 + P, 2 + 2 * P))
    k = (1 + P) * len(groups)

    def batches(split: str):
        """(index, mask, {layer: activations}) of `sets[split]`, a batch at a time."""
        return stream(
            model,
            sets[split],
            layer_hooks,
            batch_size=batch_size,
            progress=progress,
            desc=f"probe {model_name} {label}: {split}",
            check_finite=check_finite,
        )

    stats = {name: {layer: RidgeStats(d, k) for layer in layer_hooks} for name in ("fit", "val")}
    for name in ("fit", "val"):
        batch = None
        for idx, mask, acts in batches(name):
            if idx is not batch:  # a new batch (its layers come one at a time)
                batch, real = idx, mask.bool()
                pos = _positions(real)[real]
                shuf = None
                if shuffled_labels is not None:
                    shuf = shuffled_labels[name][idx, : real.shape[1]][real]
                Y = position_targets(pos, P, shuf)
            for layer, act in acts.items():
                stats[name][layer].update(act[real], Y)
            del acts, act  # before the pass computes the next layer

    weights, alpha_rows, probes, degenerate = {}, [], {}, set()
    for layer in layer_hooks:
        path = RidgePath(stats["fit"][layer])
        full = RidgePath(stats["fit"][layer].merged(stats["val"][layer]))
        if path.degenerate or full.degenerate:  # non-finite fit or val activations
            degenerate.update((split, layer) for split in ("ID", "OOD"))
        W = torch.zeros(d, k, dtype=torch.float64)
        c = torch.zeros(k, dtype=torch.float64)
        for group, (reg_col, cls_cols) in groups.items():
            for probe_kind, cols in (("regression", [reg_col]), ("classifier", cls_cols)):
                a, _ = select_alpha(path, stats["val"][layer], alphas, cols)
                coef, intercept = full.coef(a)
                W[:, cols], c[cols] = coef[:, cols], intercept[cols]
                name = label if group == "trained" else group
                alpha_rows.append({"model": name, "layer": layer, "probe": probe_kind, "alpha": a})
                # a copy of its columns: a view would keep the whole [d, k] solution alive
                probes[(name, layer, probe_kind)] = RidgeProbe(
                    coef[:, cols].clone(), intercept[cols].clone(), a
                )
        weights[layer] = (W, c)
    del stats
    release_free_memory()

    metrics = {
        (g, split, layer): _Metrics()
        for g in groups
        for split in ("ID", "OOD")
        if split in sets
        for layer in layer_hooks
    }
    for split in ("ID", "OOD"):
        if split not in sets:
            continue
        for _, mask, acts in batches(split):
            real = mask.bool()
            pos = _positions(real)[real]
            for layer, act in acts.items():
                W, c = weights[layer]
                pred = act[real].double() @ W + c
                if not bool(torch.isfinite(pred).all()):  # the control overflows on this split
                    degenerate.add((split, layer))
                for g, (reg_col, cls_cols) in groups.items():
                    metrics[(g, split, layer)].update(
                        pos, pred[:, reg_col], pred[:, cls_cols].argmax(1)
                    )
            del acts, act  # before the pass computes the next layer
    rows = []
    for (g, split, layer), m in metrics.items():
        name = label if g == "trained" else g
        for metric, value in m.rows().items():
            rows.append(
                {
                    "model": name,
                    "layer": layer,
                    "split": split,
                    "metric": metric,
                    "value": float("nan") if (split, layer) in degenerate else value,
                    "n": m.n,
                    "degenerate": (split, layer) in degenerate,
                }
            )
    return rows, alpha_rows, probes


def position_targets(
    pos: torch.Tensor, n_classes: int, shuffled: torch.Tensor | None = None
) -> torch.Tensor:
    """The probes' targets of n tokens, a sparse COO [n, (1 + P) x groups] float64 tensor: per
    group (the positions, then the shuffled labels if given) the label itself (the regression
    column) and its one-hot over P = `n_classes` (a label >= P has no one-hot entry)."""
    n, width = pos.shape[0], 1 + n_classes
    rows, cols, vals = [], [], []
    for g, labels in enumerate(x for x in (pos, shuffled) if x is not None):
        labels = labels.long()
        ok = labels < n_classes
        rows += [torch.arange(n), ok.nonzero().flatten()]
        cols += [torch.full((n,), g * width), g * width + 1 + labels[ok]]
        vals += [labels.double(), torch.ones(int(ok.sum()), dtype=torch.float64)]
    groups = 1 if shuffled is None else 2
    index = torch.stack([torch.cat(rows), torch.cat(cols)])
    shape = (n, width * groups)
    return torch.sparse_coo_tensor(index, torch.cat(vals), shape, check_invariants=False).coalesce()


def _shuffled_labels(sets, names, seed) -> dict[str, torch.Tensor]:
    """Position labels permuted across all real tokens of the named sets, as [B, T] tensors."""
    masks = [sets[n].attention_mask.bool() for n in names]
    labels = torch.cat([_positions(m)[m] for m in masks])
    g = torch.Generator().manual_seed(seed + 7919)
    labels = labels[torch.randperm(labels.numel(), generator=g)]
    out, start = {}, 0
    for n, m in zip(names, masks, strict=True):
        grid = torch.zeros(m.shape, dtype=torch.long)
        cnt = int(m.sum())
        grid[m] = labels[start : start + cnt]
        start += cnt
        out[n] = grid
    return out


def _constant_rows(sets, layers) -> list[dict]:
    train = torch.cat(
        [
            _positions(sets[n].attention_mask.bool())[sets[n].attention_mask.bool()]
            for n in ("fit", "val")
        ]
    )
    mean = train.double().mean()
    mode = int(torch.bincount(train).argmax())
    rows = []
    for split in ("ID", "OOD"):
        if split not in sets:
            continue
        m = sets[split].attention_mask.bool()
        acc = _Metrics()
        pos = _positions(m)[m]
        acc.update(pos, mean.expand(pos.shape), torch.full_like(pos, mode))
        for metric, value in acc.rows().items():
            rows += [
                {
                    "model": "constant",
                    "layer": layer,
                    "split": split,
                    "metric": metric,
                    "value": value,
                    "n": acc.n,
                    "degenerate": False,
                }
                for layer in layers
            ]
    return rows


def run_probe_position(mi: ModelInput, sets: Splits, opts: ProbeOptions) -> ProbeResult:
    """The probes on resolved inputs: "fit", "val", "ID" (and "OOD") `sets` of `mi`."""
    from nopeinterp.models.fresh import random_init_like

    model = mi.model
    if isinstance(model, torch.nn.Module):
        model.eval()
    hook, seed = opts.hook, opts.seed
    alphas = DEFAULT_ALPHAS if opts.alphas is None else opts.alphas
    layer_hooks = probe_layers(model.cfg.n_layers, hook, opts.layers)
    if "ID" not in sets:
        raise ValueError("no held-out ID sequences to evaluate the probe on")
    empty = [n for n in ("fit", "val") if n not in sets or len(sets[n]) == 0]
    if empty:
        raise ValueError(
            f"too few probe-training sequences (n_train={opts.n_train}): the {empty[0]!r} set is "
            "empty, and the probe needs sequences to fit on and to choose alpha with"
        )
    train_masks = [sets[n].attention_mask for n in ("fit", "val")]
    n_classes = max(int(m.sum(1).max()) for m in train_masks)
    common = dict(
        n_classes=n_classes,
        alphas=alphas,
        batch_size=opts.batch_size,
        progress=opts.progress,
        model_name=mi.name,
    )
    shuf = _shuffled_labels(sets, ("fit", "val"), seed) if opts.shuffle_control else None
    rows, alpha_rows, probes = _fit_and_eval(
        model, sets, layer_hooks, shuffled_labels=shuf, label="trained", **common
    )
    meta = {
        "hook": hook,
        "n_layers": model.cfg.n_layers,
        "n_classes": n_classes,
        "alphas": list(alphas),
        "seed": seed,
        "title": opts.title or describe(mi, "Position probe"),
        **sets.meta(),
    }
    if opts.random_baseline:
        fresh = random_init_like(model, opts.random_init_seed)
        release_free_memory()  # the transformers model the twin was converted from
        meta["random_init_seed"] = fresh.cfg.seed
        r_rows, r_alpha, r_probes = _fit_and_eval(
            fresh,
            sets,
            layer_hooks,
            shuffled_labels=None,
            label="random_init",
            check_finite=False,  # an untrained control may overflow: reported, not raised
            **common,
        )
        rows += r_rows
        alpha_rows += r_alpha
        probes.update(r_probes)
        del fresh
    rows += _constant_rows(sets, list(layer_hooks))
    table = pd.DataFrame(rows)
    table["hook"] = hook
    table["hook_name"] = table.layer.map(layer_hooks)
    # layer l reads block l-1's output (layer 0: the embeddings, before any attention)
    block_pe = mi.layer_pe
    table["layer_pe"] = table.layer.map(lambda layer: block_pe[layer - 1] if layer else "embed")
    table["model"] = pd.Categorical(table.model, categories=list(MODELS), ordered=True)
    table["split"] = pd.Categorical(table.split, categories=["ID", "OOD"], ordered=True)
    table["metric"] = pd.Categorical(table.metric, categories=list(METRICS), ordered=True)
    table = table.sort_values(["model", "layer", "split", "metric"])[TABLE_COLUMNS]
    for col in ("model", "split", "metric"):
        table[col] = table[col].astype(str)
    bad = table[table.degenerate].groupby("model", sort=False).layer.unique()
    meta["degenerate_fits"] = [
        {"model": model, "layers": sorted(int(x) for x in layers), "reason": NON_FINITE}
        for model, layers in bad.items()
    ]
    return ProbeResult(
        table.reset_index(drop=True), meta, alphas=pd.DataFrame(alpha_rows), probes=probes
    )


probe_position = analysis_front(
    run_probe_position,
    ProbeOptions,
    name="probe_position",
    purpose="probe",
    doc="""Probe every layer of `model` for absolute position; see the module docstring.

`model`: a hooked model (ours, `from_hf`, a TL model), a Checkpoint or a checkpoint path. `data`: anything
`nopeinterp.data.make_sequences` takes; None = the checkpoint's own task (then `n_train`
train-pool and `n_eval` held-out sequences per split, lengths from `id_lengths` /
`ood_lengths` or the task's). Token data are split by their `lengths` (task length, else
token count): ID = within `id_lengths` (all, if neither range is given), OOD = within
`ood_lengths` (or longer than the ID range); ID sequences are split 20% held-out ID / 80%
probe training (of which 20% choose alpha), seeded by `seed`. The random-init baseline
is a fresh model of the same config (`random_init_seed`, default the model's seed + 1).
Options (`nopeinterp.options.ProbeOptions`): pass `options=` or any of its fields, e.g.
`n_train=64, layers=[0, 1]`.
""",
)


__all__ = [
    "HOOKS",
    "METRICS",
    "ProbeResult",
    "probe_layers",
    "probe_position",
    "run_probe_position",
]
