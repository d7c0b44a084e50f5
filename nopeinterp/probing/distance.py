"""How much of each head's attention logit is a function of relative distance (Theorem 2).

Score. For one head, take the pre-softmax logits ``s[n, m]`` (``hook_attn_scores``, PE bias
included) over the valid causal cells: key m <= query n, both real tokens, finite. Fit, by
least squares pooled over all query rows of all examples,

    s[n, m] ~ a_r + f(n - m)

with one free offset ``a_r`` per query row r = (example, n) and one function ``f`` of the
distance shared by everything (a two-way fixed-effects model). The score is

    R^2 = 1 - SS_res / SS_tot,   SS_tot = sum of squares of the row-centred logits.

Row offsets are free because softmax ignores them. Subtracting row means and then averaging
per distance is *not* the least-squares fit: a row of length n+1 only holds distances 0..n,
so centring mixes a distance profile with the row's own set of distances (a pure Toeplitz
matrix, once row-centred, is no longer a function of n - m alone). The fit above is exact for
that case: Toeplitz + any row offsets -> R^2 = 1; iid noise -> R^2 ~ (#distances) / (#cells).

Estimator (exact, closed form, streaming). Eliminating the row offsets (within-row centring
of both sides) leaves the normal equations ``G f = b`` with

    G = diag(count_d) - sum_r ind_r ind_r^T / c_r,   b_d = sum of row-centred logits at d,

where ``ind_r`` marks the distances present in row r, ``c_r`` its number of cells and
``count_d`` the number of rows holding distance d. G depends only on the mask (shared by all
heads), b and SS_tot are per head; all three are sums over rows, accumulated batch by batch.
G is singular along the constant vector (f is defined up to a constant), so f is the
minimum-norm solution (eigendecomposition with a cut-off), and SS_res = SS_tot - b.f. No
iteration is involved; `tests/test_probing.py` checks it against a dense dummy-variable lstsq.
Rows with fewer than 2 valid cells (e.g. row 0, only <bos>) carry no variation and are
excluded, from the attention-mass histogram too.

Mass. ``mass[d]`` = attention probability (``hook_pattern``) on the key at distance d,
averaged over the valid query rows (rows too short to hold d count as 0), so it sums to 1
over d: the data of the paper's attention-distance histogram. Pooled over rows of different
lengths, a distance means different things (d = 10 is the far end of a short row, the middle
of a long one), so ``rel_mass`` also bins each key by its distance relative to its own row,
r = d / n for query n (0 = the query itself, 1 = the first token), in `REL_BINS` equal bins:
also summing to 1; its column ``uniform`` is what uniform attention over the same rows gives
(about 1 / REL_BINS per bin), the reference for "more near / far than chance".

Layers here are block indices 0..n_layers-1 (the attention of block l).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pandas as pd
import torch

from nopeinterp.data import Splits
from nopeinterp.inputs import ModelInput, analysis_front, describe
from nopeinterp.options import DistanceOptions, layer_list
from nopeinterp.probing._stream import attention_groups, row_blocks
from nopeinterp.results import Result

_DTYPE = torch.float64
TABLE_COLUMNS = ["split", "layer", "layer_pe", "head", "score", "n_cells", "n_rows", "ss_tot"]
MASS_COLUMNS = ["split", "layer", "head", "distance", "mass", "profile", "n_rows"]
REL_MASS_COLUMNS = ["split", "layer", "head", "rel_lo", "rel_hi", "mass", "uniform"]
REL_BINS = 10


def _skew(x: torch.Tensor, row0: int = 0) -> torch.Tensor:
    """[..., R, N] (query rows n = row0..row0+R-1, key m) -> [..., R, N] (query n, distance
    d = n - m); d > n -> 0."""
    R, N = x.shape[-2:]
    n = torch.arange(row0, row0 + R)[:, None]
    d = torch.arange(N)[None, :]
    idx = (n - d).clamp(min=0).expand(*x.shape[:-2], R, N)
    out = torch.gather(x, -1, idx)
    return out.masked_fill(~(d <= n), 0)


class DistanceDesign:
    """The mask side of the fit: which distances each used row holds. `count` [D] (rows
    holding distance d), `gram` [D, D] (sum over rows of ind ind^T / c), and the numbers of
    used cells and rows. The same for every head, and for every layer whose logits are
    finite on the same cells, so one design can serve all layers (see `DistanceStats`)."""

    def __init__(self):
        self.D = 0
        self.count = torch.zeros(0, dtype=_DTYPE)
        self.gram = torch.zeros(0, 0, dtype=_DTYPE)
        self.n_cells = 0
        self.n_rows = 0

    def reserve(self, D: int) -> None:
        """Make room for distances 0..D-1 at once (growing block by block would copy the
        D x D gram once per block)."""
        if D > self.D:
            pad = D - self.D
            self.count = torch.nn.functional.pad(self.count, (0, pad))
            self.gram = torch.nn.functional.pad(self.gram, (0, pad, 0, pad))
            self.D = D

    def update_rows(self, valid: torch.Tensor, row0: int, sign: int = 1) -> DistanceDesign:
        """Add (sign -1: remove) query rows row0..row0+R-1: valid [B, R, N] bool."""
        self.add(used_cells(valid, row0), sign)
        return self

    def update_batch(self, valid, blocks, n_pos: int) -> DistanceDesign:
        """Add one batch, block by block: `valid(start, stop)` -> [B, R, stop] for each
        (start, stop) in `blocks` (its rows over keys 0..stop-1)."""
        self.reserve(n_pos)
        for r0, r1 in blocks:
            self.update_rows(valid(r0, r1), r0)
        return self

    def add(self, sk_used: torch.Tensor, sign: int = 1) -> None:
        """sk_used [B, R, D] (query row, distance) from `used_cells`."""
        N = sk_used.shape[-1]
        self.reserve(N)
        ind = sk_used.reshape(-1, N).to(_DTYPE)
        used = ind.sum(-1) > 0
        ind = ind[used]
        self.count[:N] += sign * ind.sum(0)
        self.gram[:N, :N].addmm_(ind.T, ind / ind.sum(-1, keepdim=True), alpha=sign)  # in place
        self.n_cells += sign * int(ind.sum())
        self.n_rows += sign * int(used.sum())


def used_cells(valid: torch.Tensor, row0: int) -> torch.Tensor:
    """valid [B, R, N] (query row, key) -> [B, R, D] (query row, distance) of the cells the
    fit uses: valid causal cells of rows with at least 2 of them."""
    sk = _skew(valid, row0)
    return sk & (sk.sum(-1, keepdim=True) >= 2)


class DistanceStats:
    """Streaming sufficient statistics of the distance fit for the heads of one layer.

    `design`: a `DistanceDesign` shared with other layers, which the caller updates once per
    block of rows with the cells it passes as `valid` (the D x D gram is then held once, not
    once per layer). Where this layer's logits are not finite on some of those cells (a
    sliding window, a patch), its difference from the shared design is kept here. None: the
    layer keeps its own design.
    """

    def __init__(self, n_heads: int, design: DistanceDesign | None = None):
        self.H = n_heads
        self.D = 0
        self.shared = design
        self.own = DistanceDesign() if design is None else None  # own, or the difference
        self.b = torch.zeros(n_heads, 0, dtype=_DTYPE)
        self.mass = torch.zeros(n_heads, 0, dtype=_DTYPE)
        self.rel_mass = torch.zeros(n_heads, REL_BINS, dtype=_DTYPE)  # by d / n, see module docs
        self.rel_uniform = torch.zeros(REL_BINS, dtype=_DTYPE)  # the same, uniform attention
        self.ss_tot = torch.zeros(n_heads, dtype=_DTYPE)

    # the design this layer's fit uses: the shared one plus this layer's difference
    def _combined(self, name):
        parts = [d for d in (self.shared, self.own) if d is not None]
        if name in ("n_cells", "n_rows"):
            return sum(getattr(d, name) for d in parts)
        out = None  # no copy when one part covers every distance (the usual case)
        for d in parts:
            x = getattr(d, name)
            if d.D < self.D:
                x = torch.nn.functional.pad(x, (0, self.D - d.D) * x.ndim)
            out = x if out is None else out + x
        return out

    count = property(lambda self: self._combined("count"))
    gram = property(lambda self: self._combined("gram"))
    n_cells = property(lambda self: self._combined("n_cells"))
    n_rows = property(lambda self: self._combined("n_rows"))

    def reserve(self, D: int) -> None:
        """Make room for distances 0..D-1 at once."""
        self._grow(D)

    def _grow(self, D: int):
        if D <= self.D:
            return
        pad = D - self.D
        self.b = torch.nn.functional.pad(self.b, (0, pad))
        self.mass = torch.nn.functional.pad(self.mass, (0, pad))
        if self.own is not None:
            self.own.reserve(D)
        self.D = D

    def update(
        self,
        scores: torch.Tensor,
        valid: torch.Tensor | None = None,
        pattern: torch.Tensor | None = None,
    ) -> DistanceStats:
        """scores/pattern [B, H, N, N]; valid [B, N, N] or [N, N] bool (None: causal cells).

        Only cells with key <= query, marked valid and finite in every head are used.
        """
        B, H, N, _ = scores.shape
        if valid is None:
            valid = torch.ones(N, N, dtype=torch.bool)
        valid = valid.to(torch.bool).expand(B, N, N)
        for r0, r1 in row_blocks(B, H, N):  # blocks of query rows: every statistic sums over rows
            self.update_rows(
                scores[:, :, r0:r1],
                valid[:, r0:r1],
                r0,
                None if pattern is None else pattern[:, :, r0:r1],
            )
        return self

    def update_rows(self, scores, valid, row0: int, pattern=None) -> DistanceStats:
        """update() for query rows row0..row0+R-1 over keys 0..N-1 (N >= row0 + R):
        scores/pattern [B, H, R, N], valid [B, R, N] bool. Keys after a row's query are
        never read (causal). With a shared design, the caller has added `valid` to it."""
        B, H, R, N = scores.shape
        if H != self.H:
            raise ValueError(f"expected {self.H} heads, got {H}")
        given = valid.to(torch.bool).expand(B, R, N)
        valid = given & torch.isfinite(scores).all(1)
        self._grow(N)
        sk_valid = used_cells(valid, row0)  # [B, R, D=N]
        if self.shared is None:
            self.own.add(sk_valid)
        else:
            sk_given = used_cells(given, row0)
            if not torch.equal(sk_valid, sk_given):  # this layer differs from the shared
                if self.own is None:
                    self.own = DistanceDesign()
                self.own.reserve(N)
                self.own.add(sk_valid)
                self.own.add(sk_given, -1)
        c = sk_valid.sum(-1, keepdim=True).to(_DTYPE)
        y = _skew(torch.where(valid[:, None], scores, 0).to(_DTYPE), row0)  # [B, H, R, D]
        m = sk_valid[:, None].to(_DTYPE)
        y = y * m
        mean = y.sum(-1, keepdim=True) / c[:, None].clamp(min=1)
        yc = (y - mean) * m
        self.b[:, :N] += yc.sum((0, 2))
        self.ss_tot += (yc * yc).sum((0, 2, 3))
        if pattern is not None:
            p = _skew(pattern.to(_DTYPE), row0) * m
            self.mass[:, :N] += p.sum((0, 2))
            # bin of d / (row's longest distance): valid keys of a row are 0..n, c = n + 1
            rel = torch.arange(N, dtype=_DTYPE) / (c - 1).clamp(min=1)  # [B, N, D]
            bins = (rel * REL_BINS).floor().clamp(max=REL_BINS - 1).long()
            self.rel_mass += torch.zeros_like(self.rel_mass).scatter_add_(
                1, bins.reshape(1, -1).expand(H, -1), p.transpose(0, 1).reshape(H, -1)
            )
            uniform = m[:, 0] / c.clamp(min=1)  # [B, N, D]
            self.rel_uniform += torch.zeros_like(self.rel_uniform).scatter_add_(
                0, bins.reshape(-1), uniform.reshape(-1)
            )

    def solve(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(R^2 per head [H], fitted distance profile f [H, D] with f[:, 0] = 0)."""
        if self.n_rows == 0:
            nan = torch.full((self.H,), float("nan"), dtype=_DTYPE)
            return nan, torch.zeros(self.H, self.D, dtype=_DTYPE)
        f = torch.zeros(self.H, self.D, dtype=_DTYPE)
        seen = (self.count > 0).nonzero().squeeze(1)  # distances no row holds: f = 0
        f[:, seen] = self._solve_seen(seen)
        explained = (self.b * f).sum(-1)
        r2 = torch.where(
            self.ss_tot > 0,
            explained / self.ss_tot.clamp(min=1e-300),
            torch.full_like(self.ss_tot, float("nan")),
        ).clamp(max=1.0)
        return r2, f - f[:, :1]

    def _normal_matrix(self, seen) -> torch.Tensor:
        # one copy (D x D float64 is 32 MiB at D = 2048); all distances seen is the usual case
        if len(seen) == self.D:
            G = self.gram.neg()
        else:
            G = self.gram.index_select(0, seen).index_select(1, seen).neg_()
        G.diagonal().add_(self.count[seen])
        return G

    def _solve_seen(self, seen) -> torch.Tensor:
        """Minimum-norm f [H, len(seen)] of G f = b on the distances rows hold.

        G is singular along the constant vector (b is orthogonal to it), so G + a 11^T is
        positive definite when the distances are connected through shared rows (every row
        holds its query's own distance 0) and its solution is the minimum-norm one: a
        Cholesky factorisation, in place. Otherwise (a caller's mask leaving distances
        disconnected) G stays singular: LAPACK's Cholesky then fails, or on some CPUs passes
        with a tiny pivot; a solution that satisfies G f = b (checked) gives the same fit as any
        other, else the eigendecomposition with a cut-off, which needs about 3x the memory of G.
        """
        b = self.b[:, seen].T
        # G is symmetric: its transposed view is the column-major layout LAPACK factors in
        # place (a row-major `out=` would cost another D x D temporary)
        G = self._normal_matrix(seen).mT
        G.add_(float(G.diagonal().mean()) / max(len(seen), 1))
        info = torch.empty((), dtype=torch.int32)
        L, info = torch.linalg.cholesky_ex(G, out=(G, info))
        if int(info) == 0:
            f = torch.cholesky_solve(b, L)
            del G, L
            # G f without another D x D copy (all distances are seen in the usual case)
            count = self.count[seen][:, None]
            gram_f = 0
            for d in (self.shared, self.own):
                if d is None or d.D == 0:
                    continue
                part = seen[seen < d.D]
                gram = d.gram
                if len(part) < d.D or len(part) < len(seen):
                    gram = gram.index_select(0, part).index_select(1, part)
                    gram = torch.nn.functional.pad(gram, (0, len(seen) - len(part)) * 2)
                gram_f = gram_f + gram @ f
            residual = float((count * f - gram_f - b).abs().max())
            scale = float((count * f).abs().max()) + float(b.abs().max())
            if residual <= 1e-8 * max(scale, 1e-300):
                return f.T
        G = self._normal_matrix(seen)
        G = (G + G.T) / 2
        lam, V = torch.linalg.eigh(G)
        tol = max(len(seen), 1) * torch.finfo(_DTYPE).eps * float(lam.abs().max().clamp(min=1e-300))
        inv = torch.where(lam > tol, 1.0 / lam, torch.zeros_like(lam))
        return (V @ (inv[:, None] * (V.T @ b))).T

    def mass_per_row(self) -> torch.Tensor:
        return self.mass / max(self.n_rows, 1)

    def rel_mass_per_row(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rel_mass [H, REL_BINS], the same under uniform attention [REL_BINS]) per row."""
        return self.rel_mass / max(self.n_rows, 1), self.rel_uniform / max(self.n_rows, 1)


def distance_r2(scores: torch.Tensor, valid_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Distance-dependence R^2 of attention logits, per head (see the module docstring).

    `scores`: [N, N] (one matrix -> a scalar), [H, N, N] (one example -> [H]) or
    [B, H, N, N] (pooled over the batch -> [H]). `valid_mask`: bool, broadcastable to
    [B, N, N]; None = all causal cells (non-finite cells, e.g. -inf masks, are dropped anyway).
    """
    scores = torch.as_tensor(scores)
    squeeze = scores.ndim == 2
    if scores.ndim == 2:
        scores = scores[None, None]
    elif scores.ndim == 3:
        scores = scores[None]
    if valid_mask is not None:
        valid_mask = torch.as_tensor(valid_mask, dtype=torch.bool)
        while valid_mask.ndim < 3:
            valid_mask = valid_mask[None]
    r2, _ = DistanceStats(scores.shape[1]).update(scores, valid_mask).solve()
    return r2[0] if squeeze else r2


@dataclass(repr=False)
class DistanceResult(Result):
    """`table`: one row per (split, layer, head) with the score; `mass`: tidy histogram data
    by distance d; `rel_mass`: by relative distance d / n (see the module docstring)."""

    mass: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MASS_COLUMNS))
    rel_mass: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=REL_MASS_COLUMNS))

    name: ClassVar[str] = "distance"
    title: ClassVar[str] = "Distance dependence"
    extra_tables: ClassVar[tuple[str, ...]] = ("mass", "rel_mass")

    def heatmap(self, split: str | None = None):
        return self.draw("heatmap", split=split)

    def histogram(self, layer: int | None = None, head: int | None = None, max_distance=None):
        return self.draw("histogram", layer=layer, head=head, max_distance=max_distance)

    def pivot(self) -> pd.DataFrame:
        """(split, layer) rows x "head h" columns of the score."""
        wide = self.table.pivot_table(index=["split", "layer"], columns="head", values="score")
        wide.columns = [f"head {h}" for h in wide.columns]
        return wide

    @property
    def splits(self) -> list[str]:
        return list(dict.fromkeys(self.table.split))


def layer_scores(table: pd.DataFrame, keys=()) -> pd.DataFrame:
    """Per (*keys, split, layer) of a `DistanceResult.table` (or several, told apart by `keys`):
    each head's score as a column "head h", then `mean` and `max` over the heads."""
    index = [*keys, "split", "layer"]
    wide = table.pivot_table(index=index, columns="head", values="score", sort=False)
    wide.columns = [f"head {h}" for h in wide.columns]
    return wide.assign(mean=wide.mean(axis=1), max=wide.max(axis=1)).reset_index()


def run_distance_dependence(mi: ModelInput, sets: Splits, opts: DistanceOptions) -> DistanceResult:
    """The score and the mass histograms on resolved inputs (`sets` of `mi`)."""
    model = mi.model
    if isinstance(model, torch.nn.Module):
        model.eval()
    n_layers, H = model.cfg.n_layers, model.cfg.n_heads
    layers = layer_list(opts.layers, 0, n_layers - 1)
    if not sets:
        raise ValueError("no sequences this model can read")
    rows, mass_rows, rel_rows = [], [], []
    block_pe = mi.layer_pe
    for split, s in sets.items():
        design = DistanceDesign()  # which cells are used: one for all layers
        stats = {layer: DistanceStats(H, design) for layer in layers}
        for real, blocks, attention, group in attention_groups(
            model, s, layers, opts, scores=True, desc=f"distance {mi.name}: {split}"
        ):

            def valid(r0, r1, real=real):
                return real[:, r0:r1, None] & real[:, None, :r1]

            if group[0] == layers[0]:  # a new batch (its first group of layers)
                design.update_batch(valid, blocks, real.shape[1])
            for layer in group:
                stats[layer].reserve(real.shape[1])
                for r0, r1 in blocks:
                    scores, pattern = attention.rows(layer, r0, r1)
                    stats[layer].update_rows(scores.cpu(), valid(r0, r1), r0, pattern.cpu())
                del scores, pattern  # views of the layer's tensors
                attention.release(layer)
            del attention
        for layer in layers:
            st = stats[layer]
            r2, profile = st.solve()
            mass, (rel_mass, rel_uniform) = st.mass_per_row(), st.rel_mass_per_row()
            for h in range(H):
                rel_rows += [
                    {
                        "split": split,
                        "layer": layer,
                        "head": h,
                        "rel_lo": b / REL_BINS,
                        "rel_hi": (b + 1) / REL_BINS,
                        "mass": float(rel_mass[h, b]),
                        "uniform": float(rel_uniform[b]),
                    }
                    for b in range(REL_BINS)
                ]
                rows.append(
                    {
                        "split": split,
                        "layer": layer,
                        "layer_pe": block_pe[layer],
                        "head": h,
                        "score": float(r2[h]),
                        "n_cells": st.n_cells,
                        "n_rows": st.n_rows,
                        "ss_tot": float(st.ss_tot[h]),
                    }
                )
                count = st.count
                for d in range(st.D):
                    mass_rows.append(
                        {
                            "split": split,
                            "layer": layer,
                            "head": h,
                            "distance": d,
                            "mass": float(mass[h, d]),
                            "profile": float(profile[h, d]),
                            "n_rows": int(count[d]),
                        }
                    )
    meta = {
        "title": opts.title or describe(mi, "Distance dependence"),
        "layers": layers,
        **sets.meta(),
    }
    return DistanceResult(
        pd.DataFrame(rows, columns=TABLE_COLUMNS),
        meta,
        mass=pd.DataFrame(mass_rows, columns=MASS_COLUMNS),
        rel_mass=pd.DataFrame(rel_rows, columns=REL_MASS_COLUMNS),
    )


distance_dependence = analysis_front(
    run_distance_dependence,
    DistanceOptions,
    name="distance_dependence",
    doc="""Distance-dependence score per (split, layer, head) and the attention-mass histogram.

`model`: a hooked model (ours, `from_hf`, a TL model), a Checkpoint or a path. `data`: anything
`nopeinterp.data.make_sequences` takes (None: the checkpoint's task); sequences are grouped
into "ID"/"OOD" by `id_lengths`/`ood_lengths` (a task: `n_eval` val-split and
test-split examples), or a single split "all" when no lengths are given. Attention is
read by blocks of query rows (`nopeinterp.probing._stream.AttentionRows`): on our models
from cached q and k only, on others from ``hook_attn_scores`` and ``hook_pattern``.
Options (`nopeinterp.options.DistanceOptions`): `options=` or any of its fields.
""",
)


__all__ = [
    "DistanceDesign",
    "DistanceResult",
    "DistanceStats",
    "distance_dependence",
    "distance_r2",
    "layer_scores",
    "run_distance_dependence",
]
