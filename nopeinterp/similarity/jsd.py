"""Divergences between attention distributions, batched over leading dims.

`jsd` is the Jensen-Shannon divergence, 0.5 KL(P||M) + 0.5 KL(Q||M) with M = (P+Q)/2, in nats
(so in [0, ln 2]). `paper_jsd` is the quantity the official code of Kazemnejad et al. (2023)
(McGill-NLP/length-generalization, src/analyzers/attention_kl_analyzer.py) calls "jsd":
`0.5 * (KLDivLoss(p.log(), m) + KLDivLoss(q.log(), m))` with reduction "sum", and since
KLDivLoss(input, target) = sum target * (log target - input), that is
0.5 * (KL(M||P) + KL(M||Q)) -- the arguments reversed. It is symmetric and 0 for P == Q, but
unbounded (it is +inf as soon as one distribution has a zero where the other has mass).

Zero handling: both use `torch.xlogy` (0 log 0 = 0), so entries where p and q are both 0 --
masked keys, padding -- contribute nothing and no NaN appears. For `paper_jsd` an entry with
exactly one of p, q zero contributes +inf, which is what the official code computes
(log 0 = -inf); it never adds an epsilon. The official code only differs on entries where
both are zero (it gets 0 * -inf = NaN there; it never hits that case because it slices each
row to its causal keys 0..t, where softmax probabilities are positive).
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)


def _check(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p, q = torch.as_tensor(p), torch.as_tensor(q)
    if not p.is_floating_point():
        p = p.double()
    if not q.is_floating_point():
        q = q.double()
    dtype = torch.promote_types(p.dtype, q.dtype)
    p, q = torch.broadcast_tensors(p.to(dtype), q.to(dtype))
    return p, q


def jsd(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Jensen-Shannon divergence in nats along `dim`, clamped into [0, ln 2].

    `p`, `q`: probability vectors (broadcastable). Zeros are fine: 0 log 0 = 0.
    """
    p, q = _check(p, q)
    m = 0.5 * (p + q)
    # KL(P||M) = sum p log p - p log m; xlogy gives 0 wherever p == 0 (then m may be 0 too).
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(dim)
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(dim)
    return (0.5 * (kl_pm + kl_qm)).clamp(0.0, LN2)


def paper_jsd(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The official code's "jsd": 0.5 * (KL(M||P) + KL(M||Q)), M = (P+Q)/2, in nats.

    NOT the Jensen-Shannon divergence: unbounded (+inf if exactly one of p, q is 0 at an
    entry), symmetric, 0 iff p == q. Entries with p == q == 0 contribute 0. No epsilon.
    """
    p, q = _check(p, q)
    m = 0.5 * (p + q)
    # KL(M||P) = sum m log m - m log p; xlogy(m, p) = -inf where m > 0 == p -> +inf result.
    kl_mp = (torch.xlogy(m, m) - torch.xlogy(m, p)).sum(dim)
    kl_mq = (torch.xlogy(m, m) - torch.xlogy(m, q)).sum(dim)
    return 0.5 * (kl_mp + kl_mq)
