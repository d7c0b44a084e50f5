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

Streaming: activations are never kept. Pass 1 accumulates ridge sufficient statistics per
layer (fit and val); the probes are solved; pass 2 runs over ID/OOD and accumulates the
metrics from the predictions. Only the needed hooks are cached (names_filter), with at most
`max_cache_mb` of activations cached per forward pass (layers split over passes if needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import pandas as pd
import torch

from nopeinterp.data import Sequences, as_model, describe, make_sequences
from nopeinterp.probing._stream import stream
from nopeinterp.probing.ridge import DEFAULT_ALPHAS, RidgePath, RidgeProbe, RidgeStats, select_alpha
from nopeinterp.results import Result

HOOKS = ("resid_post", "resid_mid", "attn_out", "mlp_out")
METRICS = ("r2", "mae", "accuracy")
MODELS = ("trained", "random_init", "shuffled", "constant")
TABLE_COLUMNS = ["model", "layer", "layer_pe", "hook", "hook_name", "split", "metric", "value", "n"]


def probe_layers(n_layers: int, hook: str = "resid_post", layers=None) -> dict[int, str]:
    """layer -> TL hook name for `hook` (see the module docstring for the numbering)."""
    if hook not in HOOKS:
        raise ValueError(f"unknown hook {hook!r}; choose one of {', '.join(HOOKS)}")
    lo = 0 if hook == "resid_post" else 1
    if layers is None:
        layers = range(lo, n_layers + 1)
    out = {}
    for layer in layers:
        layer = int(layer)
        if not lo <= layer <= n_layers:
            raise ValueError(f"layer {layer} out of range {lo}..{n_layers} for hook {hook!r}")
        if layer == 0:
            out[layer] = "blocks.0.hook_resid_pre"
        else:
            out[layer] = f"blocks.{layer - 1}.hook_{hook}"
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

    def figure(self, metrics: Sequence[str] = METRICS):
        from nopeinterp.viz.probing import probe_figure

        return probe_figure(self.table, metrics=metrics, title=self.meta.get("title"))

    def html_sections(self) -> list:
        notes = (
            "<p>Linear probes for absolute position (0 = &lt;bos&gt;). r2/mae: ridge regression; "
            "accuracy: one-hot ridge (least-squares) classifier, positions beyond the largest "
            "training position count as wrong. Baselines: random_init (fresh model, same "
            "config), shuffled (probe on permuted labels), constant (train mean / mode).</p>"
        )
        meta = pd.DataFrame({"key": list(self.meta), "value": [str(v) for v in self.meta.values()]})
        return [
            ("Probe metrics per layer", self.figure()),
            ("Summary", notes),
            ("Table (layers x split/metric)", self.pivot(metrics=METRICS).reset_index()),
            ("Settings", meta),
        ]


def _fit_and_eval(
    model,
    sets: dict[str, Sequences],
    layer_hooks: dict[int, str],
    *,
    n_classes: int,
    shuffled_labels: dict[str, torch.Tensor] | None,
    alphas,
    batch_size,
    max_cache_mb,
    progress,
    label,
    model_name="",
):
    d = model.cfg.d_model
    P = n_classes
    groups = {"trained": (0, slice(1, 1 + P))}
    if shuffled_labels is not None:
        groups["shuffled"] = (1 + P, slice(2 + P, 2 + 2 * P))
    k = (1 + P) * len(groups)

    def targets(pos: torch.Tensor, shuf: torch.Tensor | None) -> torch.Tensor:
        cols = [pos[:, None].double(), _onehot(pos, P)]
        if shuf is not None:
            cols += [shuf[:, None].double(), _onehot(shuf, P)]
        return torch.cat(cols, 1)

    def bytes_per_item(t):
        return t * d * 4

    stats = {name: {layer: RidgeStats(d, k) for layer in layer_hooks} for name in ("fit", "val")}
    for name in ("fit", "val"):
        s = sets[name]
        for idx, mask, acts in stream(
            model,
            s,
            layer_hooks,
            batch_size=batch_size,
            bytes_per_item=bytes_per_item,
            max_cache_mb=max_cache_mb,
            progress=progress,
            desc=f"probe {model_name} {label}: {name}",
        ):
            real = mask.bool()
            pos = _positions(real)[real]
            shuf = None
            if shuffled_labels is not None:
                shuf = shuffled_labels[name][idx, : real.shape[1]][real]
            Y = targets(pos, shuf)
            for layer, act in acts.items():
                stats[name][layer].update(act[real], Y)

    weights, alpha_rows, probes = {}, [], {}
    for layer in layer_hooks:
        path = RidgePath(stats["fit"][layer])
        full = RidgePath(stats["fit"][layer].merged(stats["val"][layer]))
        W = torch.zeros(d, k, dtype=torch.float64)
        c = torch.zeros(k, dtype=torch.float64)
        for group, (reg_col, cls_cols) in groups.items():
            for probe_kind, cols in (("regression", [reg_col]), ("classifier", cls_cols)):
                a, _ = select_alpha(path, stats["val"][layer], alphas, cols)
                coef, intercept = full.coef(a)
                W[:, cols], c[cols] = coef[:, cols], intercept[cols]
                name = label if group == "trained" else group
                alpha_rows.append({"model": name, "layer": layer, "probe": probe_kind, "alpha": a})
                probes[(name, layer, probe_kind)] = RidgeProbe(coef[:, cols], intercept[cols], a)
        weights[layer] = (W, c)
    del stats

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
        for _, mask, acts in stream(
            model,
            sets[split],
            layer_hooks,
            batch_size=batch_size,
            bytes_per_item=bytes_per_item,
            max_cache_mb=max_cache_mb,
            progress=progress,
            desc=f"probe {model_name} {label}: {split}",
        ):
            real = mask.bool()
            pos = _positions(real)[real]
            for layer, act in acts.items():
                W, c = weights[layer]
                pred = act[real].double() @ W + c
                for g, (reg_col, cls_cols) in groups.items():
                    metrics[(g, split, layer)].update(
                        pos, pred[:, reg_col], pred[:, cls_cols].argmax(1)
                    )
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
                    "value": value,
                    "n": m.n,
                }
            )
    return rows, alpha_rows, probes


def _onehot(labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    out = torch.zeros(labels.shape[0], n_classes, dtype=torch.float64)
    ok = labels < n_classes
    out[ok.nonzero().flatten(), labels[ok]] = 1.0
    return out


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
                }
                for layer in layers
            ]
    return rows


def probe_position(
    model,
    data=None,
    *,
    layers: Sequence[int] | None = None,
    hook: str = "resid_post",
    id_lengths: tuple[int, int] | None = None,
    ood_lengths: tuple[int, int] | None = None,
    random_baseline: bool = True,
    shuffle_control: bool = True,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
    attention_mask: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    tokenizer=None,
    n_train: int = 512,
    n_eval: int = 256,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    random_init_seed: int | None = None,
    max_cache_mb: float = 256,
    title: str | None = None,
) -> ProbeResult:
    """Probe every layer of `model` for absolute position; see the module docstring.

    `model`: a HookedTransformer, a Checkpoint or a checkpoint path. `data`: anything
    `nopeinterp.data.make_sequences` takes; None = the checkpoint's own task (then `n_train`
    train-pool and `n_eval` held-out sequences per split, lengths from `id_lengths` /
    `ood_lengths` or the task's). Token data are split by their `lengths` (task length, else
    token count): ID = within `id_lengths` (all, if neither range is given), OOD = within
    `ood_lengths` (or longer than the ID range); ID sequences are split 20% held-out ID / 80%
    probe training (of which 20% choose alpha), seeded by `seed`. The random-init baseline
    is a fresh model of the same config (`random_init_seed`, default the model's seed + 1).
    """
    for name, value in (("n_train", n_train), ("n_eval", n_eval), ("batch_size", batch_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    from nopeinterp.models.fresh import random_init_like

    mi = as_model(model)
    model = mi.model
    if isinstance(model, torch.nn.Module):
        model.eval()
    layer_hooks = probe_layers(model.cfg.n_layers, hook, layers)
    sets = make_sequences(
        data,
        mi,
        purpose="probe",
        attention_mask=attention_mask,
        lengths=lengths,
        tokenizer=tokenizer,
        id_lengths=id_lengths,
        ood_lengths=ood_lengths,
        n_train=n_train,
        n_eval=n_eval,
        seed=seed,
    )
    if "ID" not in sets:
        raise ValueError("no held-out ID sequences to evaluate the probe on")
    empty = [n for n in ("fit", "val") if n not in sets or len(sets[n]) == 0]
    if empty:
        raise ValueError(
            f"too few probe-training sequences (n_train={n_train}): the {empty[0]!r} set is "
            "empty, and the probe needs sequences to fit on and to choose alpha with"
        )
    train_masks = [sets[n].attention_mask for n in ("fit", "val")]
    n_classes = max(int(m.sum(1).max()) for m in train_masks)
    common = dict(
        n_classes=n_classes,
        alphas=alphas,
        batch_size=batch_size,
        max_cache_mb=max_cache_mb,
        progress=progress,
        model_name=mi.name,
    )
    shuf = _shuffled_labels(sets, ("fit", "val"), seed) if shuffle_control else None
    rows, alpha_rows, probes = _fit_and_eval(
        model, sets, layer_hooks, shuffled_labels=shuf, label="trained", **common
    )
    meta = {
        "hook": hook,
        "n_layers": model.cfg.n_layers,
        "n_classes": n_classes,
        "alphas": list(alphas),
        "seed": seed,
        "title": title or describe(mi, "Position probe"),
        **sets.meta(),
    }
    if random_baseline:
        fresh = random_init_like(model, random_init_seed)
        meta["random_init_seed"] = fresh.cfg.seed
        r_rows, r_alpha, r_probes = _fit_and_eval(
            fresh, sets, layer_hooks, shuffled_labels=None, label="random_init", **common
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
    return ProbeResult(
        table.reset_index(drop=True), meta, alphas=pd.DataFrame(alpha_rows), probes=probes
    )


__all__ = [
    "HOOKS",
    "METRICS",
    "ProbeResult",
    "probe_layers",
    "probe_position",
]
