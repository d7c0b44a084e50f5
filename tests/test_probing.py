"""Oracles for nopeinterp.probing: ridge vs numpy/scipy, the distance score vs a dense
dummy-variable regression and exact constructions, and end-to-end runs on tiny models."""

import numpy as np
import pytest
import scipy.linalg
import torch

from nopeinterp.models import build_model
from nopeinterp.probing import (
    DistanceStats,
    RidgePath,
    RidgeStats,
    distance_dependence,
    distance_r2,
    fit_ridge,
    probe_position,
)
from nopeinterp.probing.position import position_targets
from nopeinterp.probing.ridge import select_alpha, stats_mse

TINY = dict(n_layers=2, n_heads=2, d_model=32, d_vocab=20, n_ctx=64)


def _rand(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 10, size=d) + rng.normal(size=d) * 5
    Y = X @ rng.normal(size=(d, k)) + rng.normal(size=(n, k)) + 3
    return X, Y


def _batch(n_seq=48, lo=4, hi=30, vocab=20, seed=0, bos=1):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n_seq,), generator=g)
    T = int(lens.max())
    tokens = torch.randint(2, vocab, (n_seq, T), generator=g)
    tokens[:, 0] = bos
    mask = (torch.arange(T)[None] < lens[:, None]).long()
    tokens[mask == 0] = 0
    return tokens, mask


# ---------------------------------------------------------------------------------- ridge
def test_ridge_alpha0_matches_lstsq_with_intercept():
    X, Y = _rand(200, 6, 3)
    probe = fit_ridge(torch.tensor(X), torch.tensor(Y), alphas=[0.0])
    A = np.hstack([X, np.ones((len(X), 1))])
    sol = np.linalg.lstsq(A, Y, rcond=None)[0]
    np.testing.assert_allclose(probe.coef.numpy(), sol[:-1], rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(probe.intercept.numpy(), sol[-1], rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(probe.predict(torch.tensor(X)).numpy(), A @ sol, atol=1e-8)


def test_ridge_alpha0_rank_deficient_is_min_norm_fit():
    X, Y = _rand(50, 4, 2, seed=1)
    X = np.hstack([X, X[:, :1] * 2, np.full((50, 1), 7.0)])  # duplicate + constant column
    probe = fit_ridge(torch.tensor(X), torch.tensor(Y), alphas=[0.0])
    A = np.hstack([X, np.ones((50, 1))])
    sol = np.linalg.lstsq(A, Y, rcond=None)[0]
    np.testing.assert_allclose(probe.predict(torch.tensor(X)).numpy(), A @ sol, atol=1e-8)


@pytest.mark.parametrize("alpha", [1e-3, 0.5, 30.0])
def test_ridge_matches_scipy_normal_equations(alpha):
    X, Y = _rand(120, 8, 2, seed=2)
    probe = fit_ridge(torch.tensor(X), torch.tensor(Y), alphas=[alpha])
    n = len(X)
    mu, sd = X.mean(0), X.std(0)
    Z = (X - mu) / sd
    B = scipy.linalg.solve(Z.T @ Z / n + alpha * np.eye(8), Z.T @ (Y - Y.mean(0)) / n)
    coef = B / sd[:, None]
    np.testing.assert_allclose(probe.coef.numpy(), coef, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(probe.intercept.numpy(), Y.mean(0) - mu @ coef, rtol=1e-8)


def test_streaming_stats_and_merge_equal_one_shot():
    X, Y = _rand(300, 5, 2, seed=3)
    X, Y = torch.tensor(X), torch.tensor(Y)
    whole = RidgeStats(5, 2).update(X, Y)
    chunked = RidgeStats(5, 2)
    for i in range(0, 300, 37):
        chunked.update(X[i : i + 37], Y[i : i + 37])
    a, b = RidgeStats(5, 2).update(X[:100], Y[:100]), RidgeStats(5, 2).update(X[100:], Y[100:])
    merged = a.merged(b)
    for st in (chunked, merged):
        for alpha in (0.0, 0.3):
            c1, i1 = RidgePath(whole).coef(alpha)
            c2, i2 = RidgePath(st).coef(alpha)
            torch.testing.assert_close(c1, c2, rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(i1, i2, rtol=1e-9, atol=1e-9)
    # validation MSE from sufficient statistics equals the direct computation
    coef, intercept = RidgePath(a).coef(0.1)
    direct = ((X[100:] @ coef + intercept - Y[100:]) ** 2).mean(0)
    torch.testing.assert_close(stats_mse(b, coef, intercept), direct, rtol=1e-9, atol=1e-9)


def test_alpha_selection_is_reasonable():
    rng = np.random.default_rng(4)
    n, d = 400, 20
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    clean = fit_ridge(torch.tensor(X), torch.tensor(X @ w + 0.01 * rng.normal(size=n)))
    assert clean.alpha <= 1e-2
    noise = fit_ridge(torch.tensor(X), torch.tensor(rng.normal(size=n)))
    assert noise.alpha >= 10
    assert set(noise.val_mse) == {1e-4, 1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2}
    # select_alpha on explicit stats: ties go to the larger alpha
    st = RidgeStats(d, 1).update(torch.tensor(X), torch.zeros(n, 1))
    assert select_alpha(RidgePath(st), st, [0.1, 1.0])[0] == 1.0


# ------------------------------------------------------------------------- distance score
def _dense_oracle(scores, valid):
    """R^2 of logit ~ row dummies + distance dummies via numpy lstsq, per head."""
    H, N, _ = scores.shape
    out = []
    for h in range(H):
        cells = [(n, m) for n in range(N) for m in range(n + 1) if valid[n, m]]
        rows = sorted({n for n, _ in cells if sum(valid[n, : n + 1]) >= 2})
        cells = [(n, m) for n, m in cells if n in rows]
        y = np.array([scores[h, n, m] for n, m in cells])
        A = np.zeros((len(cells), len(rows) + N))
        for i, (n, m) in enumerate(cells):
            A[i, rows.index(n)] = 1
            A[i, len(rows) + n - m] = 1
        fit = A @ np.linalg.lstsq(A, y, rcond=None)[0]
        row_means = {r: y[[i for i, c in enumerate(cells) if c[0] == r]].mean() for r in rows}
        yc = y - np.array([row_means[n] for n, _ in cells])
        out.append(1 - ((y - fit) ** 2).sum() / (yc**2).sum())
    return np.array(out)


def test_distance_r2_matches_dense_dummy_regression():
    g = torch.Generator().manual_seed(5)
    N, H = 9, 3
    scores = torch.randn(H, N, N, generator=g, dtype=torch.float64)
    scores += 3 * torch.randn(N, 1, generator=g, dtype=torch.float64)  # row offsets
    d = torch.arange(N)[:, None] - torch.arange(N)[None]
    scores += 0.5 * torch.cos(d.clamp(min=0).double())  # partly distance-dependent
    valid = torch.rand(N, N, generator=g) < 0.8
    ours = distance_r2(scores, valid).numpy()
    np.testing.assert_allclose(ours, _dense_oracle(scores.numpy(), valid.numpy()), atol=1e-10)


@pytest.fixture
def eigh_calls(monkeypatch):
    """A list that grows by one at each torch.linalg.eigh call (the fit's fallback solver)."""
    calls = []
    real_eigh = torch.linalg.eigh
    monkeypatch.setattr(torch.linalg, "eigh", lambda *a, **k: calls.append(1) or real_eigh(*a, **k))
    return calls


def _masks(connected: bool):
    g = torch.Generator().manual_seed(7)
    N, H = 10, 2
    scores = torch.randn(H, N, N, generator=g, dtype=torch.float64)
    d = torch.arange(N)[:, None] - torch.arange(N)[None]
    valid = d >= 0
    if not connected:  # rows 3-5 hold distances 1-2 only, rows 6-9 distances 5-6 only
        valid = torch.zeros(N, N, dtype=torch.bool)
        valid[3:6] = (d[3:6] >= 1) & (d[3:6] <= 2)
        valid[6:] = (d[6:] >= 5) & (d[6:] <= 6)
    return scores, valid


@pytest.mark.parametrize("connected", [True, False])
def test_distance_fit_by_cholesky_or_eigh_matches_the_dense_regression(connected, eigh_calls):
    """Connected distances (every row holds d = 0): the in-place Cholesky solve, eigh never
    runs. Distances in groups no row links: G is singular; whether LAPACK's Cholesky then
    fails (eigh fallback) or passes with a tiny pivot (any exact solution of the normal
    equations gives the same fit, checked by the residual) depends on the CPU; the fit must
    match either way."""
    scores, valid = _masks(connected)
    ours = distance_r2(scores, valid).numpy()
    if connected:
        assert not eigh_calls
    np.testing.assert_allclose(ours, _dense_oracle(scores.numpy(), valid.numpy()), atol=1e-10)


@pytest.mark.parametrize("connected", [True, False])
def test_distance_fit_falls_back_to_eigh_when_cholesky_fails(connected, eigh_calls, monkeypatch):
    scores, valid = _masks(connected)
    failed = lambda G, out: (out[0], torch.tensor(1, dtype=torch.int32))  # noqa: E731
    monkeypatch.setattr(torch.linalg, "cholesky_ex", failed)
    ours = distance_r2(scores, valid).numpy()
    assert eigh_calls
    np.testing.assert_allclose(ours, _dense_oracle(scores.numpy(), valid.numpy()), atol=1e-10)


def test_layers_sharing_one_design_get_their_own_fits():
    """One D x D design for all layers; a layer whose logits are -inf on some used cells (a
    sliding window) keeps its difference, and every fit equals the layer's own."""
    from nopeinterp.probing.distance import DistanceDesign, DistanceStats

    g = torch.Generator().manual_seed(8)
    B, H, N = 3, 2, 12
    real = torch.ones(B, N, dtype=torch.bool)
    real[1, 9:] = False
    valid = real[:, :, None] & real[:, None, :]
    d = torch.arange(N)[:, None] - torch.arange(N)[None]
    full = torch.randn(B, H, N, N, generator=g, dtype=torch.float64) + torch.cos(d.double())
    window = full.masked_fill(d > 4, float("-inf"))
    design = DistanceDesign()
    shared = {"full": DistanceStats(H, design), "window": DistanceStats(H, design)}
    scores = {"full": full, "window": window}
    for r0, r1 in [(0, 3), (3, 7), (7, 12)]:
        design.update_rows(valid[:, r0:r1, :r1], r0)
        for name, st in shared.items():
            st.update_rows(scores[name][:, :, r0:r1, :r1], valid[:, r0:r1, :r1], r0)
    assert shared["full"].own is None  # nothing of its own: the shared gram serves it
    assert shared["window"].own is not None
    for name, st in shared.items():
        alone = DistanceStats(H).update(scores[name], valid)
        for attr in ("count", "gram", "b", "ss_tot"):
            torch.testing.assert_close(getattr(st, attr), getattr(alone, attr))
        assert (st.n_cells, st.n_rows) == (alone.n_cells, alone.n_rows)
        for x, y in zip(st.solve(), alone.solve(), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-10)
    assert shared["window"].n_cells < shared["full"].n_cells


def test_distance_r2_toeplitz_plus_row_offsets_is_one():
    g = torch.Generator().manual_seed(6)
    B, H, N = 4, 3, 17
    f = torch.randn(H, N, generator=g, dtype=torch.float64)
    d = (torch.arange(N)[:, None] - torch.arange(N)[None]).clamp(min=0)
    offsets = 10 * torch.randn(B, H, N, 1, generator=g, dtype=torch.float64)
    scores = f[:, d][None] + offsets
    lens = torch.tensor([17, 12, 5, 9])
    real = torch.arange(N)[None] < lens[:, None]
    valid = real[:, :, None] & real[:, None, :]
    scores = scores.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    r2 = distance_r2(scores, valid)
    torch.testing.assert_close(r2, torch.ones(H, dtype=torch.float64), atol=1e-6, rtol=0)
    # float32 input, as hook_attn_scores gives
    torch.testing.assert_close(distance_r2(scores.float(), valid), r2, atol=1e-6, rtol=0)
    # a 2-D matrix gives a scalar
    assert distance_r2(scores[0, 0]).shape == ()
    # the naive estimator (row-centre, then per-distance mean) would not reach 1
    st = DistanceStats(H).update(scores, valid)
    naive = (st.b**2 / st.count.clamp(min=1)).sum(-1) / st.ss_tot
    assert (naive < 0.999).all()


def test_distance_r2_iid_noise_is_small_and_streaming_is_exact():
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(8, 2, 30, 30, generator=g)
    r2 = distance_r2(scores)
    assert (r2 < 0.1).all() and (r2 > 0).all()
    # streaming: batches of different widths give the same result as one padded batch
    short = scores[:3].clone()
    short[..., 20:, :] = float("-inf")
    short[..., :, 20:] = float("-inf")
    st = DistanceStats(2).update(scores[:3, :, :20, :20]).update(scores[3:])
    one = DistanceStats(2).update(torch.cat([short, scores[3:]]))
    assert st.n_rows == one.n_rows == 3 * 19 + 5 * 29
    torch.testing.assert_close(st.solve()[0], one.solve()[0])


def test_relative_distance_mass():
    """rel_mass bins each key by d / n: attend-to-self -> bin 0, attend-to-first -> last bin,
    uniform -> spread over every bin; rows of different lengths (padding) are handled."""
    from nopeinterp.probing.distance import REL_BINS

    N, lens = 21, torch.tensor([21, 11, 6])
    real = torch.arange(N)[None] < lens[:, None]
    valid = real[:, :, None] & real[:, None, :]
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    scores = torch.randn(3, 3, N, N, generator=torch.Generator().manual_seed(0))
    pattern = torch.zeros(3, 3, N, N)
    pattern[:, 0] = torch.eye(N)  # head 0: the query itself (d = 0)
    pattern[:, 1, :, 0] = 1.0  # head 1: the first token (d = n)
    uniform = (valid & causal).float()
    pattern[:, 2] = uniform / uniform.sum(-1, keepdim=True).clamp(min=1)  # head 2: uniform
    st = DistanceStats(3).update(scores, valid, pattern)
    rel, uniform_ref = st.rel_mass_per_row()
    torch.testing.assert_close(rel.sum(-1), torch.ones(3, dtype=torch.float64))
    assert rel[0, 0] == pytest.approx(1.0) and rel[1, -1] == pytest.approx(1.0)
    assert (rel[2] > 0.5 / REL_BINS).all()  # no bin empty under uniform attention
    # by hand for head 2: mean over rows n >= 1 of the share of keys m with bin(d / n) = b
    expected = torch.zeros(REL_BINS, dtype=torch.float64)
    rows = 0
    for length in lens.tolist():
        for n in range(1, length):
            for d in range(n + 1):
                expected[min(int(d / n * REL_BINS), REL_BINS - 1)] += 1 / (n + 1)
            rows += 1
    torch.testing.assert_close(rel[2], expected / rows)
    torch.testing.assert_close(uniform_ref, expected / rows)  # the uniform reference column


def test_distance_r2_constant_rows_is_nan():
    assert torch.isnan(distance_r2(torch.zeros(1, 6, 6))).all()


# ------------------------------------------------------------------- end to end, models
def test_alibi_with_zero_wq_scores_one_everywhere():
    model = build_model("alibi", **{**TINY, "n_heads": 4})
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    tokens, mask = _batch(12, 3, 16)
    res = distance_dependence(model, tokens, attention_mask=mask, batch_size=5, progress=False)
    assert list(res.table.columns)[:5] == ["split", "layer", "layer_pe", "head", "score"]
    assert len(res.table) == 2 * 4 and set(res.table.split) == {"all"}
    np.testing.assert_allclose(res.table.score, 1.0, atol=1e-6)
    # the fitted profile is the ALiBi line -slope * d
    from nopeinterp.models import alibi_slopes

    prof = res.mass[(res.mass.layer == 0) & (res.mass["head"] == 1)].profile.to_numpy()
    slope = float(alibi_slopes(4)[1])
    assert len(prof) == 16
    np.testing.assert_allclose(prof, -slope * np.arange(len(prof)), atol=1e-4)


def test_distance_dependence_nope_tiny_model(tmp_path):
    model = build_model("nope", **TINY)
    tokens, mask = _batch(16, 3, 24, seed=1)
    res = distance_dependence(
        model, tokens, attention_mask=mask, id_lengths=(3, 14), progress=False
    )
    assert set(res.table.split) == {"ID", "OOD"}
    assert res.table.score.between(0, 1).all()
    sums = res.mass.groupby(["split", "layer", "head"]).mass.sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0, atol=1e-5)
    rel_sums = res.rel_mass.groupby(["split", "layer", "head"]).mass.sum()
    np.testing.assert_allclose(rel_sums.to_numpy(), 1.0, atol=1e-5)
    paths = res.save(tmp_path)
    assert all(
        paths[k].exists() for k in ("distance", "distance_mass", "distance_rel_mass", "meta")
    )
    assert "plotly" in paths["html"].read_text()


def _position_hook(kind, seed=0, d=32):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=g)
    basis = torch.linalg.qr(torch.randn(d, d, generator=g))[0]

    def hook(resid, hook):
        pos = torch.arange(resid.shape[1]).float()
        noise = torch.randn(resid.shape, generator=g)
        if kind == "linear":
            return pos[None, :, None] * u + 0.01 * noise
        if kind == "onehot":
            return basis[pos.long()].expand_as(resid).clone()
        return noise

    return ("blocks.0.hook_resid_pre", hook)


def test_probe_recovers_linear_position_and_not_noise():
    model = build_model("nope", **TINY)
    tokens, mask = _batch(60, 4, 30, seed=2)
    kw = dict(
        layers=[0],
        attention_mask=mask,
        id_lengths=(4, 20),
        ood_lengths=(21, 30),
        random_baseline=False,
        progress=False,
    )
    with model.hooks(fwd_hooks=[_position_hook("linear")]):
        lin = probe_position(model, tokens, **kw).table
    with model.hooks(fwd_hooks=[_position_hook("noise")]):
        noise = probe_position(model, tokens, **kw).table

    def val(t, split, metric, m="trained"):
        return float(t[(t.model == m) & (t.split == split) & (t.metric == metric)].value.iloc[0])

    assert val(lin, "ID", "r2") > 0.999 and val(lin, "OOD", "r2") > 0.999  # extrapolates
    assert val(lin, "ID", "mae") < 0.1
    assert -0.05 < val(noise, "ID", "r2") < 0.05
    assert val(lin, "ID", "r2", "shuffled") < 0.05
    assert abs(val(lin, "ID", "r2", "constant")) < 0.05


def test_classifier_counts_unseen_positions_as_wrong():
    model = build_model("nope", **TINY)
    tokens, mask = _batch(60, 4, 30, seed=3)
    with model.hooks(fwd_hooks=[_position_hook("onehot")]):
        res = probe_position(
            model,
            tokens,
            layers=[0],
            attention_mask=mask,
            id_lengths=(4, 20),
            random_baseline=False,
            shuffle_control=False,
            progress=False,
            alphas=[1e-4],
        )
    t = res.table[res.table.model == "trained"].set_index(["split", "metric"]).value
    n_classes = res.meta["n_classes"]
    ood = mask[mask.sum(1) > 20].bool()
    pos = torch.arange(ood.shape[1]).expand_as(ood)[ood]
    assert t[("ID", "accuracy")] == pytest.approx(1.0)
    assert t[("OOD", "accuracy")] == pytest.approx(float((pos < n_classes).double().mean()))


def test_probe_position_end_to_end_table_and_save(tmp_path):
    model = build_model("nope", **TINY)
    tokens, mask = _batch(40, 4, 24, seed=4)
    res = probe_position(
        model, tokens, attention_mask=mask, id_lengths=(4, 16), batch_size=16, progress=False
    )
    t = res.table
    assert {"model", "layer", "split", "metric", "value", "n"} <= set(t.columns)
    assert set(t.model) == {"trained", "random_init", "constant", "shuffled"}
    assert set(t.layer) == {0, 1, 2} and set(t.split) == {"ID", "OOD"}
    assert set(t.metric) == {"r2", "mae", "accuracy"}
    assert len(t) == 4 * 3 * 2 * 3 and t.value.notna().all()
    p = res.pivot()
    assert list(p.index) == [0, 1, 2] and "OOD r2 [random_init]" in p.columns
    assert len(res.figure().data) > 0
    paths = res.save(tmp_path / "out")
    assert paths["probe_position"].read_text().startswith("model,layer")
    assert "<html" in paths["html"].read_text()[:300].lower()


def test_probe_position_from_task():
    from nopeinterp.tasks import get_task, task_tokenizer

    task = get_task("copy")
    tok = task_tokenizer(task)
    model = build_model("nope", **{**TINY, "d_vocab": len(tok)}, tokenizer=None)
    res = probe_position(
        model,
        (task, tok),
        id_lengths=(2, 6),
        ood_lengths=(7, 9),
        n_train=40,
        n_eval=16,
        random_baseline=False,
        progress=False,
        hook="attn_out",
    )
    assert set(res.table.layer) == {1, 2}
    assert res.meta["lengths_OOD"] == (7, 9)
    assert (res.table[res.table.split == "ID"].n > 0).all()


def test_position_targets_are_the_labels_and_their_one_hots():
    """Rebuilt densely here: per group the label, then its one-hot over P (none when >= P)."""
    pos, shuf, P = torch.tensor([0, 1, 2, 3, 5]), torch.tensor([4, 0, 3, 1, 2]), 5
    dense = torch.zeros(5, 2 * (1 + P), dtype=torch.float64)
    for i in range(5):
        dense[i, 0], dense[i, 1 + P] = pos[i], shuf[i]
        if pos[i] < P:
            dense[i, 1 + pos[i]] = 1
        dense[i, 1 + P + 1 + shuf[i]] = 1
    torch.testing.assert_close(position_targets(pos, P, shuf).to_dense(), dense)
    torch.testing.assert_close(position_targets(pos, P).to_dense(), dense[:, : 1 + P])


def test_sparse_targets_give_the_dense_statistics():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 6, generator=g)
    pos, shuf = torch.randint(0, 9, (200,), generator=g), torch.randint(0, 9, (200,), generator=g)
    sparse = position_targets(pos, 8, shuf)
    a, b = RidgeStats(6, 18), RidgeStats(6, 18)
    for i in range(0, 200, 64):
        rows = slice(i, i + 64)
        a.update(X[rows], position_targets(pos[rows], 8, shuf[rows]))
        b.update(X[rows], sparse.to_dense()[rows])
    for name in ("n", "sx", "sy", "sxx", "sxy", "syy"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-12, atol=1e-9)
