"""Hand-built NoPE models realising the paper's Theorems 1 and 2 (Kazemnejad et al. 2023).

`absolute_position_model` is a 1-layer NoPE model whose first layer writes the absolute
position t into the residual stream (Theorem 1); `relative_attention_model` adds a second
layer whose heads have attention logits that depend on n - m only, up to a per-row offset
(Theorem 2). Every weight is set by hand (all others are zero); nothing is trained or tuned.
Both are ordinary `build_model("nope", ..., attn_scale=False)` models, with their pre-LN
blocks kept: the construction makes each LayerNorm act as a known map instead of removing it.

Residual layout (coordinate indices; a "pair" (i, i+1) always holds (+v, -v), so every
residual vector has mean exactly 0 over d_model and LayerNorm's mean subtraction is a no-op):

  0, 1   BOS pair     embedding of <bos> only: (+1, -1)
  2, 3   ATTN pair    layer-1 head output: (+1/(t+1), -1/(t+1)); erased again by the MLP
  4, 5   POS pair     MLP output: (+t, -t)
  6, 7   SQ pair      MLP output: (+t^2/K, -t^2/K)
  8, 9   COMP pair    MLP output: (+h(t), -h(t)), h(t) = sqrt(R^2 - t^2 - (t^2/K)^2), R = 2K
  10     CONST        always 0 in the residual; the layer-2 LN bias puts a constant 1 here
  11..   TOKEN region the k-th non-<bos> token (k = 0, 1, ... in id order): +1 at 11 + i and
                      -1 at 11 + j, i = k mod d_tok, j = (i + 1 + (k // d_tok) mod (d_tok - 1))
                      mod d_tok, d_tok = d_model - 11 (distinct for k < d_tok (d_tok - 1))

K is `max_length`. Every embedding has entries in {0, +-1}, two of them nonzero: squared norm
exactly 2 and float sum exactly 0 for every token.

Layer 1 (Theorem 1), exact weights
----------------------------------
- ln1: w = sigma1 on coordinate 0, 0 elsewhere; b = 0. sigma1 = sqrt(2/d_model + eps) is the
  LN scale of every embedding, so ln1(x)[0] = 1 for <bos> and 0 for every other token.
- head 0: W_Q = W_K = 0 (all logits 0 -> uniform causal attention, a_{t,m} = 1/(t+1));
  W_V[0][0, 0] = 1 (reads the <bos> coordinate); W_O[0][0, 2] = 1, W_O[0][0, 3] = -1. Hence
  attn_out[t] = (1/(t+1)) * (e_2 - e_3) EXACTLY (float rounding only). Other heads are zero.
- ln2: w = 1 on coordinate 2, 0 elsewhere; b = 0. resid_mid = embedding + attn_out has
  squared norm 2 + 2 s^2 with s = 1/(t+1), so ln2(x)[2] = z(t) = s / sqrt((2 + 2 s^2)/d + eps),
  a known, strictly decreasing function of t.
- MLP (relu, d_mlp >= K + 1): neuron j = 0..K computes relu(y_j - z) with y_j = z(j)
  (W_in[2, j] = -1, b_in[j] = y_j). For a target F given at the integers, the output
  F(0) + sum_j a_j relu(y_j - z) with slopes s_k = (F(k+1) - F(k)) / (y_k - y_{k+1}),
  a_0 = s_0, a_j = s_j - s_{j-1}, a_K = -s_{K-1} is the piecewise-linear interpolant of F
  through the knots (y_k, F(k)): EXACT at every integer t <= K, constant F(K) beyond.
  The MLP writes four such targets (b_out holds the F(0) terms): -1/(t+1) on ATTN (erasing
  the attention signal), t on POS, t^2/K on SQ and h(t) on COMP.

So for 0 <= t <= K, resid_post of layer 1 at position t is exactly (up to float rounding)
  embedding(token_t) + t (e_4 - e_5) + (t^2/K) (e_6 - e_7) + h(t) (e_8 - e_9),
which is linear in t along `direction("pos")` and has a t-independent squared norm 2 + 2 R^2
(that is what COMP is for): every later LayerNorm divides all positions by the same constant
sigma2 = sqrt((2 + 2 R^2)/d + eps). For t > K the MLP saturates: POS stays at K, SQ and COMP
stay at their t = K values, and ATTN keeps a residue 1/(t+1) - 1/(K+1) (O(1/K), so sigma2
moves by a relative O(1/K^3)). Position is therefore not decodable beyond K.

Layer 2 (Theorem 2), exact weights (relative_attention_model only)
------------------------------------------------------------------
- ln1: w = sigma2 on POS (4) and SQ (6), 0 elsewhere; b = 1 on CONST (10), 0 elsewhere. So
  ln1(x) = t e_4 + (t^2/K) e_6 + e_10: position, squared position and a constant 1.
- head 0, "recency" (ALiBi-like): W_Q[0][10, 0] = 1, W_K[0][4, 0] = lam. Logit(n, m) = lam*m
  = lam*n - lam*(n - m): a row offset plus a linear penalty on the distance n - m.
- head 1, "target distance" delta with sharpness beta (if n_heads >= 2):
  W_Q[1][4, 0] = 1, W_Q[1][10, 1] = 1; W_K[1][4, 0] = 2 beta, W_K[1][6, 1] = -beta K,
  W_K[1][4, 1] = -2 beta delta. Logit(n, m) = 2 beta n m - beta m^2 - 2 beta delta m
  = -beta (n - m - delta)^2 + beta (n - delta)^2: a row offset plus a function of n - m peaked
  at n - m = delta (the head attends to position n - delta; rows n < delta peak at m = 0).
- W_V = W_O = 0, MLP = 0 in layer 2 (it only shapes attention); other heads zero;
  ln_final w = 1, b = 0; W_U = b_U = 0.
The logits are exactly of the stated form for n, m <= K, up to float rounding. In float32,
head 0's error is ~1e-7 relative (< 5e-4 absolute at n = 1024); head 1's terms are ~2 beta n m,
so its absolute error grows like n^2: measured max 0.06 (n < 128), 3.2 (n <= 512) and 13
(n <= 1024) at beta = 4 on an AMD EPYC, against a logit gap of beta between distance delta and
delta +- 1. Its argmax is n - delta for every row n <= 512 and for 99.6% of rows 513..1024
there. The rounding depends on the CPU's matmul kernels: on an Intel Xeon the error at
n <= 512 was 13.9 and the argmax right in 99.8% of those rows.
`dtype=torch.float64` (cfg.dtype and all weights) removes this: errors ~1e-12 (head 0) and
4e-8 (head 1) at K = 1024.

Measured (float32, d_model 32, K = max_length = 1024; tests/test_theory.py): the layer-1
attention output equals 1/(t+1) to < 1e-8; the POS readout equals t to 5e-4 (t <= 512) and
1e-3 (t <= 1024); a least-squares linear probe fit on positions 0..63 has 1 - R^2 < 1e-10 on
0..511 and 5e-9 on 0..1024; `probing.probe_position` (ridge) gives R^2 1.0 (ID, <= 63) and
0.99997 (OOD, <= 511) at layer 1; layer-2 logits fit row offset + f(n - m) with
1 - R^2 < 1e-12 (both heads; `probing.distance_dependence` scores 1.0). Nothing is tuned on
any length range: the construction is exact (up to float error) for every t <= max_length,
whatever range a probe is fit on, and max_length is only bounded by the MLP width (K + 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from nopeinterp.models import build_model

BOS, ATTN, POS, SQ, COMP, CONST, TOKEN0 = 0, 2, 4, 6, 8, 10, 11
PAIRS = {"bos": BOS, "attn": ATTN, "pos": POS, "sq": SQ, "comp": COMP}


@dataclass(frozen=True)
class Construction:
    """What a hand-built model encodes; attached to the model as `model.construction`."""

    max_length: int
    bos_token_id: int
    d_model: int
    eps: float
    recency_slope: float | None = None
    target_distance: int | None = None
    sharpness: float | None = None

    @property
    def comp_radius(self) -> float:
        return 2.0 * self.max_length

    @property
    def sigma2(self) -> float:
        """LN scale of every layer-1 resid_post at t <= max_length."""
        return math.sqrt((2 + 2 * self.comp_radius**2) / self.d_model + self.eps)

    def direction(self, name: str) -> torch.Tensor:
        """Readout vector v for a pair: resid @ v is the pair's value (e.g. t for "pos")."""
        v = torch.zeros(self.d_model)
        v[PAIRS[name]], v[PAIRS[name] + 1] = 0.5, -0.5
        return v


def _z(t: np.ndarray, d_model: int, eps: float) -> np.ndarray:
    """ln2 output on ATTN at position t (float64): s / sqrt((2 + 2 s^2)/d + eps)."""
    s = 1.0 / (t + 1.0)
    return s / np.sqrt((2 + 2 * s**2) / d_model + eps)


def _relu_coefficients(knots: np.ndarray, values: np.ndarray) -> np.ndarray:
    """a_j with values[0] + sum_j a_j relu(knots[j] - z) interpolating (knots, values).

    knots strictly decreasing (K+1 of them); the interpolant is constant beyond knots[-1].
    """
    slopes = np.diff(values) / -np.diff(knots)  # s_k, k = 0..K-1
    a = np.empty(len(knots))
    a[0] = slopes[0]
    a[1:-1] = np.diff(slopes)
    a[-1] = -slopes[-1]
    return a


def _token_embedding(d_vocab: int, d_model: int, bos_token_id: int) -> torch.Tensor:
    d_tok = d_model - TOKEN0
    W_E = torch.zeros(d_vocab, d_model)
    W_E[bos_token_id, BOS], W_E[bos_token_id, BOS + 1] = 1.0, -1.0
    others = [v for v in range(d_vocab) if v != bos_token_id]
    for idx, v in enumerate(others):
        i = idx % d_tok
        j = (i + 1 + (idx // d_tok) % (d_tok - 1)) % d_tok
        W_E[v, TOKEN0 + i] = 1.0
        W_E[v, TOKEN0 + j] = -1.0
    return W_E


def _build(
    *,
    n_layers: int,
    n_heads: int,
    d_vocab: int,
    n_ctx: int,
    bos_token_id: int,
    d_model: int,
    max_length: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    if d_model < TOKEN0 + 2:
        raise ValueError(f"d_model must be >= {TOKEN0 + 2}, got {d_model}")
    if not 0 <= bos_token_id < d_vocab:
        raise ValueError(f"bos_token_id={bos_token_id} outside the vocabulary 0..{d_vocab - 1}")
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    K = max_length
    model = build_model(
        "nope",
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        d_mlp=K + 1,
        attn_scale=False,
        seed=seed,
    )
    if dtype != model.cfg.dtype:
        model.cfg.dtype = dtype  # TL's LayerNorm casts to cfg.dtype
        model = model.to(dtype)
    eps = float(model.cfg.eps)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E.copy_(_token_embedding(d_vocab, d_model, bos_token_id))

        b0 = model.blocks[0]
        b0.ln1.w[BOS] = math.sqrt(2 / d_model + eps)
        b0.attn.W_V[0, BOS, 0] = 1.0
        b0.attn.W_O[0, 0, ATTN], b0.attn.W_O[0, 0, ATTN + 1] = 1.0, -1.0
        b0.ln2.w[ATTN] = 1.0

        t = np.arange(K + 1, dtype=np.float64)
        knots = _z(t, d_model, eps)
        R = 2.0 * K
        targets = {
            ATTN: -1.0 / (t + 1.0),
            POS: t,
            SQ: t**2 / K,
            COMP: np.sqrt(R**2 - t**2 - (t**2 / K) ** 2),
        }
        b0.mlp.W_in[ATTN, :] = -1.0
        b0.mlp.b_in.copy_(torch.from_numpy(knots))
        for dim, values in targets.items():
            a = torch.from_numpy(_relu_coefficients(knots, values)).to(dtype)
            b0.mlp.W_out[:, dim], b0.mlp.W_out[:, dim + 1] = a, -a
            b0.mlp.b_out[dim], b0.mlp.b_out[dim + 1] = values[0], -values[0]

        model.ln_final.w.fill_(1.0)
    model.construction = Construction(
        max_length=K, bos_token_id=bos_token_id, d_model=d_model, eps=eps
    )
    return model


def absolute_position_model(
    *,
    d_vocab: int,
    n_ctx: int,
    bos_token_id: int = 0,
    d_model: int = 32,
    max_length: int = 1024,
    n_heads: int = 1,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """1-layer NoPE model whose layer 1 writes absolute position t (Theorem 1).

    Inputs must start with exactly one <bos> (`bos_token_id`) at position 0; other tokens are
    arbitrary. After layer 1 (`blocks.0.hook_resid_post`), `resid @ model.construction
    .direction("pos")` equals t EXACTLY (float rounding only, ~1e-3 at t ~ 1000) for every
    0 <= t <= max_length; beyond max_length it saturates at max_length. The layer-1 attention
    output is exactly (1/(t+1)) * (e_2 - e_3). MLP width is max_length + 1; exact weights are
    in the module docstring. `n_ctx` only fills the config (NoPE has no length limit).
    `seed` only affects the discarded TL initialisation.
    """
    return _build(
        n_layers=1,
        n_heads=n_heads,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        bos_token_id=bos_token_id,
        d_model=d_model,
        max_length=max_length,
        seed=seed,
        dtype=dtype,
    )


def relative_attention_model(
    *,
    d_vocab: int,
    n_ctx: int,
    bos_token_id: int = 0,
    d_model: int = 32,
    max_length: int = 1024,
    n_heads: int = 2,
    recency_slope: float = 0.5,
    target_distance: int = 1,
    sharpness: float = 4.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """2-layer NoPE model: layer 1 as `absolute_position_model`, layer 2 relative (Theorem 2).

    Layer-2 head 0 has logit(n, m) = recency_slope * m = row offset - recency_slope * (n - m)
    (an ALiBi-like recency bias). If n_heads >= 2, head 1 has logit(n, m) =
    -sharpness * (n - m - target_distance)^2 + row offset, i.e. it attends to position
    n - target_distance. Both are exact (float rounding only) for n, m <= max_length; past
    max_length positions saturate and the logits stop depending on n - m. Layer 2 writes
    nothing (W_V = W_O = 0, MLP = 0). Exact weights are in the module docstring.
    """
    if d_model % n_heads or d_model // n_heads < 2:
        raise ValueError("relative_attention_model needs d_head = d_model / n_heads >= 2")
    model = _build(
        n_layers=2,
        n_heads=n_heads,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        bos_token_id=bos_token_id,
        d_model=d_model,
        max_length=max_length,
        seed=seed,
        dtype=dtype,
    )
    c = model.construction
    lam, beta, delta = float(recency_slope), float(sharpness), int(target_distance)
    with torch.no_grad():
        b1 = model.blocks[1]
        b1.ln1.w[POS] = c.sigma2
        b1.ln1.w[SQ] = c.sigma2
        b1.ln1.b[CONST] = 1.0
        b1.attn.W_Q[0, CONST, 0] = 1.0
        b1.attn.W_K[0, POS, 0] = lam
        if n_heads >= 2:
            b1.attn.W_Q[1, POS, 0] = 1.0
            b1.attn.W_Q[1, CONST, 1] = 1.0
            b1.attn.W_K[1, POS, 0] = 2 * beta
            b1.attn.W_K[1, SQ, 1] = -beta * c.max_length
            b1.attn.W_K[1, POS, 1] = -2 * beta * delta
    model.construction = Construction(
        max_length=c.max_length,
        bos_token_id=c.bos_token_id,
        d_model=c.d_model,
        eps=c.eps,
        recency_slope=lam,
        target_distance=delta if n_heads >= 2 else None,
        sharpness=beta if n_heads >= 2 else None,
    )
    return model


def bos_sequences(
    batch: int, length: int, *, d_vocab: int, bos_token_id: int = 0, seed: int = 0
) -> torch.Tensor:
    """[batch, length] long tokens: <bos> at position 0, then uniform random non-<bos> tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, d_vocab - 1, (batch, length), generator=g)
    tokens = tokens + (tokens >= bos_token_id).long()  # skip bos_token_id
    tokens[:, 0] = bos_token_id
    return tokens


__all__ = [
    "Construction",
    "absolute_position_model",
    "bos_sequences",
    "relative_attention_model",
]
