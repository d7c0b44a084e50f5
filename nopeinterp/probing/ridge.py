"""Closed-form ridge regression on torch, from streamed sufficient statistics.

Model. Features are standardised with the training mean and standard deviation (a constant
feature gets sd 1, i.e. it is only centred), targets are centred, and an unpenalised intercept
is fitted. With ``Z = (X - mu) / sd`` the coefficients in standardised units solve

    (Z^T Z / n + alpha * I) B = Z^T (Y - y_mean) / n

i.e. alpha penalises ||B||^2 against the *mean* squared error, so its scale does not depend on
the number of rows (alpha = 1 means "as large as a unit-variance feature's own variance").
``RidgeProbe.coef = B / sd`` and ``intercept = y_mean - mu @ coef`` are in raw units, so
``predict(X) = X @ coef + intercept``. With ``alpha = 0`` this is ordinary least squares with
an intercept (the minimum-norm solution when Z^T Z is singular: eigenvalues below a relative
cut-off are dropped, as ``numpy.linalg.lstsq`` does).

Streaming. Everything the solve and the alpha selection need is a sufficient statistic:
``n``, column sums of X and Y, ``X^T X``, ``X^T Y`` and the sum of Y^2 per output, all in
float64 (:class:`RidgeStats`, updated batch by batch; X is shifted by the first batch's mean
before squaring, to avoid cancellation). One eigendecomposition of the training correlation
matrix then gives B for every alpha at the cost of a matrix product, and the validation mean
squared error of every alpha follows from the *validation* split's sufficient statistics
without keeping its rows (:meth:`RidgePath.mse`).

Classification. A "ridge classifier" here is a multi-output ridge regression onto one-hot
targets, predicting the argmax: a linear least-squares classifier, not logistic regression.
Its alpha is chosen by the validation mean squared error on the one-hot targets (the
criterion the classifier is fitted by), not by accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

DEFAULT_ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2)
_DTYPE = torch.float64


class RidgeStats:
    """Sufficient statistics of (X [n, d], Y [n, k]) rows for ridge, accumulated by `update`."""

    def __init__(self, d: int, k: int):
        self.d, self.k = d, k
        self.n = 0
        self.shift: torch.Tensor | None = None  # X is accumulated as X - shift
        self.sx = torch.zeros(d, dtype=_DTYPE)
        self.sy = torch.zeros(k, dtype=_DTYPE)
        self.sxx = torch.zeros(d, d, dtype=_DTYPE)
        self.sxy = torch.zeros(d, k, dtype=_DTYPE)
        self.syy = torch.zeros(k, dtype=_DTYPE)

    def update(self, X: torch.Tensor, Y: torch.Tensor) -> RidgeStats:
        """Add rows X [n, d], Y [n, k]. Y may be a sparse COO tensor (one-hot targets): its
        sums then cost its nonzeros, not n x k."""
        # a float64 copy of its own, so the shift is subtracted in place (one n x d buffer)
        X = X.detach().reshape(-1, self.d).to(_DTYPE, copy=True)
        Y = Y.detach().to(_DTYPE)
        Y = Y.coalesce() if Y.is_sparse else Y.reshape(-1, self.k)
        if Y.shape[1] != self.k:
            raise ValueError(f"Y has {Y.shape[1]} columns, the statistics {self.k}")
        if X.shape[0] != Y.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows, Y has {Y.shape[0]}")
        if X.shape[0] == 0:
            return self
        if self.shift is None:
            self.shift = X.mean(0)
        Xs = X.sub_(self.shift)
        self.n += Xs.shape[0]
        self.sx += Xs.sum(0)
        self.sxx += Xs.T @ Xs
        if Y.is_sparse:
            self.sy += torch.sparse.sum(Y, 0).to_dense()
            self.sxy += torch.sparse.mm(Y.t(), Xs).T
            self.syy += torch.sparse.sum(Y * Y, 0).to_dense()
        else:
            self.sy += Y.sum(0)
            self.sxy += Xs.T @ Y
            self.syy += (Y * Y).sum(0)
        return self

    def merged(self, other: RidgeStats) -> RidgeStats:
        """Statistics of the union of both row sets (a new object)."""
        if other.n == 0:
            return self._copy()
        if self.n == 0:
            return other._copy()
        out = self._copy()
        delta = other.shift - self.shift  # other's rows: X - self.shift = (X - other.shift) + delta
        sx_o = other.sx + other.n * delta
        out.sxx = (
            self.sxx
            + other.sxx
            + torch.outer(other.sx, delta)
            + torch.outer(delta, other.sx)
            + other.n * torch.outer(delta, delta)
        )
        out.sxy = self.sxy + other.sxy + torch.outer(delta, other.sy)
        out.sx = self.sx + sx_o
        out.sy = self.sy + other.sy
        out.syy = self.syy + other.syy
        out.n = self.n + other.n
        return out

    def _copy(self) -> RidgeStats:
        out = RidgeStats(self.d, self.k)
        out.n, out.shift = self.n, None if self.shift is None else self.shift.clone()
        out.sx, out.sy, out.syy = self.sx.clone(), self.sy.clone(), self.syy.clone()
        out.sxx, out.sxy = self.sxx.clone(), self.sxy.clone()
        return out

    def columns(self, cols) -> RidgeStats:
        """View of the statistics restricted to some outputs (X statistics shared)."""
        out = RidgeStats.__new__(RidgeStats)
        out.__dict__.update(self.__dict__)
        out.sy, out.sxy, out.syy = self.sy[cols], self.sxy[:, cols], self.syy[cols]
        out.k = out.sy.shape[0]
        return out

    @property
    def mean_x(self) -> torch.Tensor:
        return self.shift + self.sx / self.n

    @property
    def mean_y(self) -> torch.Tensor:
        return self.sy / self.n


@dataclass
class RidgeProbe:
    """A fitted linear probe in raw feature units: ``predict(X) = X @ coef + intercept``."""

    coef: torch.Tensor  # [d, k] float64
    intercept: torch.Tensor  # [k] float64
    alpha: float
    val_mse: dict[float, float] | None = None  # mean over outputs, per alpha tried

    def predict(self, X: torch.Tensor) -> torch.Tensor:
        return X.to(_DTYPE) @ self.coef + self.intercept

    def classify(self, X: torch.Tensor) -> torch.Tensor:
        """Argmax class of each row (one-hot ridge classifier)."""
        return self.predict(X).argmax(-1)


class RidgePath:
    """All ridge solutions of one training set, from a single eigendecomposition."""

    def __init__(self, stats: RidgeStats, rcond: float | None = None):
        if stats.n < 2:
            raise ValueError(f"ridge needs at least 2 training rows, got {stats.n}")
        n = stats.n
        mx_s = stats.sx / n  # mean of shifted X
        self.mu = stats.mean_x
        self.my = stats.mean_y
        cxx = stats.sxx / n - torch.outer(mx_s, mx_s)  # covariance (1/n)
        cxy = stats.sxy / n - torch.outer(mx_s, self.my)
        var = cxx.diagonal().clamp(min=0)
        scale = var.max().clamp(min=1e-300)
        self.sd = torch.where(var > 1e-12 * scale, var.sqrt(), torch.ones_like(var))
        corr = cxx / torch.outer(self.sd, self.sd)
        corr = (corr + corr.T) / 2
        # Non-finite statistics (a model whose activations overflow): a degenerate fit whose
        # every coefficient is NaN, so its metrics come out NaN in the table, never an error.
        self.degenerate = not bool(torch.isfinite(corr).all() and torch.isfinite(cxy).all())
        if self.degenerate:
            corr, cxy = torch.eye(stats.d, dtype=_DTYPE), torch.full_like(cxy, float("nan"))
        self.eigvals, self.eigvecs = torch.linalg.eigh(corr)
        self.eigvals = self.eigvals.clamp(min=0)
        self.zty = self.eigvecs.T @ (cxy / self.sd[:, None])  # V^T Z^T Yc / n
        if rcond is None:
            rcond = torch.finfo(_DTYPE).eps * max(stats.d, n)
        self.cutoff = rcond * float(self.eigvals.max().clamp(min=1e-300))

    def coef(self, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(coef [d, k], intercept [k]) in raw units for penalty `alpha`."""
        denom = self.eigvals + alpha
        inv = torch.where(denom > self.cutoff, 1.0 / denom, torch.zeros_like(denom))
        B = self.eigvecs @ (inv[:, None] * self.zty)
        coef = B / self.sd[:, None]
        intercept = self.my - self.mu @ coef
        return coef, intercept

    def probe(self, alpha: float) -> RidgeProbe:
        coef, intercept = self.coef(alpha)
        return RidgeProbe(coef, intercept, float(alpha))


def stats_mse(stats: RidgeStats, coef: torch.Tensor, intercept: torch.Tensor) -> torch.Tensor:
    """Mean squared error per output [k] of ``X @ coef + intercept`` on the rows behind `stats`."""
    n = stats.n
    c = intercept + stats.shift @ coef  # intercept for the shifted features
    quad = (coef * (stats.sxx @ coef)).sum(0)
    sse = (
        stats.syy
        - 2 * (coef * stats.sxy).sum(0)
        - 2 * c * stats.sy
        + quad
        + 2 * c * (stats.sx @ coef)
        + n * c * c
    )
    return sse.clamp(min=0) / n


def select_alpha(
    path: RidgePath,
    val: RidgeStats | None,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    columns: slice | Sequence[int] | None = None,
) -> tuple[float, dict[float, float]]:
    """Alpha with the lowest validation MSE (mean over `columns` of the outputs).

    Ties go to the larger alpha (more regularisation). With a single alpha, or no validation
    statistics, the first (only) alpha is returned. Non-finite scores are never chosen; when
    no alpha scores finite (a degenerate fit), the largest alpha is returned with the scores.
    """
    alphas = [float(a) for a in alphas]
    if not alphas:
        raise ValueError("alphas is empty")
    if val is None or val.n == 0 or len(alphas) == 1:
        if len(alphas) > 1:
            raise ValueError("choosing among several alphas needs validation rows")
        return alphas[0], {}
    cols = slice(None) if columns is None else columns
    val = val.columns(cols)
    scores = {}
    for a in alphas:
        coef, intercept = path.coef(a)
        scores[a] = float(stats_mse(val, coef[:, cols], intercept[cols]).mean())
    finite = {a: s for a, s in scores.items() if math.isfinite(s)}
    if not finite:
        return max(alphas), scores
    best = min(finite.values())
    chosen = max(a for a, s in finite.items() if s <= best * (1 + 1e-9) + 1e-300)
    return chosen, scores


def fit_ridge(
    X: torch.Tensor,
    Y: torch.Tensor,
    alphas: float | Sequence[float] = DEFAULT_ALPHAS,
    *,
    X_val: torch.Tensor | None = None,
    Y_val: torch.Tensor | None = None,
    val_fraction: float = 0.2,
    seed: int = 0,
) -> RidgeProbe:
    """Fit a ridge probe of Y [n] or [n, k] on X [n, d], choosing alpha on a validation split.

    With several `alphas` and no (X_val, Y_val), a random `val_fraction` of the rows (seeded)
    is held out for the choice and the probe is then refitted on all rows with the chosen
    alpha. A single alpha fits on all rows directly. A 1-D Y gives a [d, 1] coef.
    """
    X = torch.as_tensor(X)
    Y = torch.as_tensor(Y)
    if Y.ndim == 1:
        Y = Y[:, None]
    if isinstance(alphas, (int, float)):
        alphas = [float(alphas)]
    alphas = [float(a) for a in alphas]
    d, k = X.shape[1], Y.shape[1]
    if len(alphas) == 1:
        return RidgePath(RidgeStats(d, k).update(X, Y)).probe(alphas[0])
    split = X_val is None
    if split:
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(X.shape[0], generator=g)
        n_val = max(1, int(round(val_fraction * X.shape[0])))
        vi, ti = perm[:n_val], perm[n_val:]
        X_fit, Y_fit, X_val, Y_val = X[ti], Y[ti], X[vi], Y[vi]
    else:
        X_fit, Y_fit = X, Y
        Y_val = torch.as_tensor(Y_val)
        Y_val = Y_val[:, None] if Y_val.ndim == 1 else Y_val
    fit, val = RidgeStats(d, k).update(X_fit, Y_fit), RidgeStats(d, k).update(X_val, Y_val)
    path = RidgePath(fit)
    alpha, val_mse = select_alpha(path, val, alphas)
    if split:  # refit on all rows: merging the two splits' statistics is a second pass saved
        path = RidgePath(fit.merged(val))
    probe = path.probe(alpha)
    probe.val_mse = val_mse
    return probe


__all__ = [
    "DEFAULT_ALPHAS",
    "RidgePath",
    "RidgeProbe",
    "RidgeStats",
    "fit_ridge",
    "select_alpha",
    "stats_mse",
]
