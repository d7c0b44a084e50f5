"""The hand-built Theorem 1 / Theorem 2 models of nopeinterp.theory."""

import numpy as np
import pytest
import scipy.sparse
import torch

from nopeinterp.theory import absolute_position_model, bos_sequences, relative_attention_model

V = 20  # vocabulary (token 0 = <bos>)
K = 1024  # max_length of the construction: exact for positions <= K
ID_LEN, OOD_LEN = 64, 512  # a probe is fit on 0..63 and tested up to 8x that


@pytest.fixture(scope="module")
def rel_model():
    return relative_attention_model(d_vocab=V, n_ctx=ID_LEN, max_length=K)


@pytest.fixture(scope="module")
def rel_cache(rel_model):
    tokens = bos_sequences(2, OOD_LEN, d_vocab=V, seed=1)
    with torch.no_grad():
        _, cache = rel_model.run_with_cache(tokens)
    return cache


def r2_score(y, pred):
    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)
    return 1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()


def linear_readout_r2(X_fit, y_fit, X_eval, y_eval):
    """Least-squares linear probe (with intercept) fit on one set, R^2 on another."""

    def design(X):
        return np.c_[np.asarray(X, np.float64), np.ones(len(X))]

    coef, *_ = np.linalg.lstsq(design(X_fit), np.asarray(y_fit, np.float64), rcond=None)
    return r2_score(y_eval, design(X_eval) @ coef)


def relative_fit_r2(scores: np.ndarray) -> float:
    """R^2 of scores[n, m] ~ a_n + f(n - m) over the causal cells (rows n >= 1), numpy lstsq."""
    N = scores.shape[0]
    n, m = np.tril_indices(N)
    keep = n >= 1
    n, m = n[keep], m[keep]
    y = scores[n, m].astype(np.float64)
    # dummy-variable design: one column per row offset a_n, one per distance value f(d)
    rows = np.repeat(np.arange(len(y)), 2)
    cols = np.stack([n, N + (n - m)], 1).ravel()
    X = scipy.sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(y), 2 * N))
    # normal equations (X'X is 2N x 2N, singular along a_n + c, f - c: lstsq takes min-norm)
    coef, *_ = np.linalg.lstsq((X.T @ X).toarray(), X.T @ y, rcond=None)
    row_mean = np.bincount(n, y, minlength=N) / np.maximum(np.bincount(n, minlength=N), 1)
    ss_tot = ((y - row_mean[n]) ** 2).sum()  # variation left after free row offsets
    return 1 - ((y - X @ coef) ** 2).sum() / ss_tot


# --- (a) layer 1: uniform attention, output exactly 1/(t+1) -------------------------------
def test_layer1_attention_is_uniform_and_writes_inverse_position(rel_model, rel_cache):
    c = rel_model.construction
    t = torch.arange(OOD_LEN, dtype=torch.float64)
    pattern = rel_cache["blocks.0.attn.hook_pattern"][:, 0].double()
    uniform = torch.tril(torch.ones(OOD_LEN, OOD_LEN, dtype=torch.float64)) / (t[:, None] + 1)
    assert torch.allclose(pattern, uniform.expand_as(pattern), atol=1e-7, rtol=0)
    attn_out = rel_cache["blocks.0.hook_attn_out"].double()
    signal = attn_out @ c.direction("attn").double()
    assert (signal - 1 / (t + 1)).abs().max() < 1e-6
    # ... and nothing else: attn_out = (1/(t+1)) (e_2 - e_3)
    expected = (1 / (t + 1))[:, None] * (2 * c.direction("attn").double())
    assert (attn_out - expected).abs().max() < 1e-6


# --- (b) resid_post of layer 1 holds t, linearly, far beyond the fit range -----------------
def test_layer1_resid_post_is_linear_in_position(rel_model):
    c = rel_model.construction
    tokens = bos_sequences(2, K + 1, d_vocab=V, seed=2)
    with torch.no_grad():
        _, cache = rel_model.run_with_cache(
            tokens, names_filter=lambda name: name == "blocks.0.hook_resid_post"
        )
    resid = cache["blocks.0.hook_resid_post"].double()
    t = torch.arange(K + 1, dtype=torch.float64)
    # the POS pair is t itself at every position up to max_length (float32 rounding only)
    assert (resid @ c.direction("pos").double() - t).abs().max() < 1e-2
    # an independent least-squares probe fit on positions < 64 extrapolates to 8x and 16x
    X = resid.numpy()
    fit = X[:, :ID_LEN].reshape(-1, X.shape[-1])
    y_fit = np.tile(np.arange(ID_LEN), 2)
    for length in (ID_LEN, OOD_LEN, K + 1):
        r2 = linear_readout_r2(
            fit, y_fit, X[:, :length].reshape(-1, X.shape[-1]), np.tile(np.arange(length), 2)
        )
        assert r2 >= 0.999, (length, r2)
    # the residual norm is position-independent, so every later LayerNorm is one fixed scale
    norms = resid.norm(dim=-1)
    assert (norms.max() - norms.min()) / norms.mean() < 1e-5


def test_position_saturates_beyond_max_length():
    small = 32
    model = absolute_position_model(d_vocab=V, n_ctx=16, max_length=small)
    assert model.cfg.n_layers == 1
    tokens = bos_sequences(1, 3 * small, d_vocab=V, seed=3)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    pos = (cache["blocks.0.hook_resid_post"][0] @ model.construction.direction("pos")).double()
    t = torch.arange(3 * small, dtype=torch.float64)
    assert (pos[: small + 1] - t[: small + 1]).abs().max() < 1e-3
    assert (pos[small:] - small).abs().max() < 1e-3


def test_float64_construction_is_exact_to_rounding():
    model = relative_attention_model(d_vocab=V, n_ctx=16, max_length=256, dtype=torch.float64)
    tokens = bos_sequences(1, 257, d_vocab=V, seed=4)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    t = torch.arange(257, dtype=torch.float64)
    pos = cache["blocks.0.hook_resid_post"][0] @ model.construction.direction("pos").double()
    assert (pos - t).abs().max() < 1e-9
    n, m = t[:, None], t[None, :]
    scores = cache["blocks.1.attn.hook_attn_scores"][0]
    causal = torch.tril(torch.ones(257, 257, dtype=torch.bool))
    recency = 0.5 * m.expand(257, 257)
    target = -4.0 * (n - m - 1) ** 2 + 4.0 * (n - 1) ** 2
    assert (scores[0] - recency)[causal].abs().max() < 1e-8
    assert (scores[1] - target)[causal].abs().max() < 1e-6


# --- (c) layer 2: logits are a function of n - m plus row offsets --------------------------
def _layer2_errors(model, cache):
    """(max |error| of head 0, of head 1 against the stated logits, head 1's argmax == n - delta
    per row n >= delta) over the causal cells."""
    c = model.construction
    scores = cache["blocks.1.attn.hook_attn_scores"].double()
    t = torch.arange(OOD_LEN, dtype=torch.float64)
    n, m = t[:, None], t[None, :]
    causal = torch.tril(torch.ones(OOD_LEN, OOD_LEN, dtype=torch.bool))
    recency = (c.recency_slope * m).expand(OOD_LEN, OOD_LEN)
    beta, delta = c.sharpness, c.target_distance
    target = -beta * (n - m - delta) ** 2 + beta * (n - delta) ** 2
    err0 = (scores[:, 0] - recency)[:, causal].abs().max()
    err1 = (scores[:, 1] - target).abs()[:, causal].max()
    pattern = cache["blocks.1.attn.hook_pattern"][:, 1]
    hits = pattern.argmax(-1)[:, delta:] == torch.arange(OOD_LEN - delta)
    return err0, err1, hits


def test_layer2_logits_have_the_stated_form(rel_model, rel_cache):
    beta = rel_model.construction.sharpness
    err0, err1, hits = _layer2_errors(rel_model, rel_cache)
    assert err0 < 1e-2
    # float32: head 1's terms are ~2 beta n m, so its rounding grows like n^2 and depends on the
    # CPU's matmul kernels (module docs). Measured max error at n <= 512: 3.2 on an AMD EPYC,
    # 13.9 on an Intel Xeon (6.6e-6 of 2 beta n^2); against a logit gap of beta, so a few rows
    # can peak one step off in float32. The exact claims are checked in float64 below.
    assert err1 < 1e-5 * 2 * beta * OOD_LEN**2
    assert hits.float().mean() >= 0.99  # measured: 1.0 (AMD EPYC), 0.998 (Intel Xeon)


def test_layer2_logits_are_exact_in_float64():
    model = relative_attention_model(d_vocab=V, n_ctx=ID_LEN, max_length=K, dtype=torch.float64)
    tokens = bos_sequences(2, OOD_LEN, d_vocab=V, seed=1)
    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens, names_filter=lambda name: name.startswith("blocks.1.attn.hook_")
        )
    err0, err1, hits = _layer2_errors(model, cache)
    assert err0 < 1e-9 and err1 < 1e-6  # module docs: ~1e-12 and 4e-8 at K = 1024
    assert hits.all()  # the head attends to n - delta in every row n >= delta


@pytest.mark.parametrize("head", [0, 1])
def test_layer2_logits_depend_on_distance_only(rel_cache, head):
    N = 128
    for b in range(2):
        scores = rel_cache["blocks.1.attn.hook_attn_scores"][b, head, :N, :N].double().numpy()
        assert relative_fit_r2(scores) >= 0.99
    # sanity of the checker: random logits are not distance-dependent
    rng = np.random.default_rng(0)
    assert relative_fit_r2(rng.normal(size=(N, N))) < 0.1


# --- (d) the toolkit's probes agree ------------------------------------------------------
def _probing():
    try:
        import nopeinterp.probing as probing
    except ImportError as exc:  # only skip when the module is not importable
        pytest.skip(f"nopeinterp.probing not importable: {exc}")
    return probing


def test_probe_position_recovers_position_id_and_ood(rel_model):
    probing = _probing()
    data = {
        "fit": bos_sequences(24, ID_LEN, d_vocab=V, seed=10),
        "ID": bos_sequences(8, ID_LEN, d_vocab=V, seed=11),
        "OOD": bos_sequences(4, OOD_LEN, d_vocab=V, seed=12),
    }
    result = probing.probe_position(
        rel_model,
        data,
        layers=[1],
        random_baseline=False,
        shuffle_control=False,
        progress=False,
        batch_size=8,
    )
    t = result.table
    r2 = t[(t.model == "trained") & (t.layer == 1) & (t.metric == "r2")].set_index("split").value
    assert set(r2.index) == {"ID", "OOD"}
    assert r2["ID"] >= 0.999 and r2["OOD"] >= 0.999, r2.to_dict()


def test_distance_dependence_of_the_relative_heads(rel_model, rel_cache):
    probing = _probing()
    data = bos_sequences(2, 128, d_vocab=V, seed=13)
    result = probing.distance_dependence(rel_model, data, layers=[1], progress=False)
    t = result.table
    scores = t[t.layer == 1].set_index("head").score
    assert scores[0] >= 0.99 and scores[1] >= 0.99, scores.to_dict()
    # the tensor-level score on the cached logits agrees
    r2 = probing.distance_r2(rel_cache["blocks.1.attn.hook_attn_scores"][:, :, :160, :160])
    assert (r2 >= 0.99).all(), r2
