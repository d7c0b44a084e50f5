"""nopeinterp.similarity: JSD, attention_divergence, compare_attention (tiny models, CPU)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon

from nopeinterp.models import build_model
from nopeinterp.similarity import (
    attention_divergence,
    attention_patterns,
    bootstrap_ci,
    compare_attention,
    head_pair_divergence,
    jsd,
    paper_jsd,
)

LN2 = math.log(2)
VOCAB = 24
ARCH = dict(n_layers=2, n_heads=4, d_model=32, d_vocab=VOCAB, n_ctx=64)


def sharpened(model, factor=6.0):
    """Scale W_Q so random-init attention is far from uniform (heads clearly differ)."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.mul_(factor)
    return model


def tiny(pe="nope", seed=0, **kw):
    return sharpened(build_model(pe, seed=seed, **{**ARCH, **kw}))


@pytest.fixture(scope="module")
def model():
    return tiny("nope", seed=0)


@pytest.fixture(scope="module")
def other():
    return tiny("nope", seed=1)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (4, 10), generator=torch.Generator().manual_seed(0))


def head_permuted(model, perm):
    """Same function, heads relabelled: permute every head-indexed attention weight."""
    copy = build_model(model.pe, **{**ARCH, "seed": 123})
    state = model.state_dict()
    for key in list(state):
        name = key.rsplit(".", 1)[-1]
        if ".attn." in key and name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
            state[key] = state[key][list(perm)]
    copy.load_state_dict(state)
    return copy


# --- jsd ---------------------------------------------------------------------------------------


def random_dists(rng, n, k, zero_frac=0.3):
    x = rng.random((n, k)) * (rng.random((n, k)) > zero_frac)
    x[:, 0] += 1e-3  # never all zero
    return x / x.sum(1, keepdims=True)


def test_jsd_matches_scipy_with_zeros():
    rng = np.random.default_rng(0)
    p, q = random_dists(rng, 200, 7), random_dists(rng, 200, 7)
    p[:5, 1:] = 0.0  # one-hot rows
    p[:5, 0] = 1.0
    ours = jsd(torch.tensor(p), torch.tensor(q)).numpy()
    ref = np.array([jensenshannon(a, b) ** 2 for a, b in zip(p, q, strict=True)])  # base e
    np.testing.assert_allclose(ours, ref, atol=1e-12)
    assert np.isfinite(ours).all() and (ours <= LN2).all()


def test_jsd_disjoint_support_is_ln2_and_dim_argument():
    p = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert torch.allclose(jsd(p[0], p[1]), torch.tensor(LN2))
    # dim=0 compares columns
    assert torch.allclose(jsd(p, p.flip(0), dim=0), torch.tensor([LN2, LN2]))


def test_paper_jsd_is_reversed_kl_and_unbounded():
    rng = np.random.default_rng(1)
    p, q = random_dists(rng, 50, 6, zero_frac=0.0), random_dists(rng, 50, 6, zero_frac=0.0)
    m = 0.5 * (p + q)
    ref = 0.5 * ((m * np.log(m / p)).sum(1) + (m * np.log(m / q)).sum(1))
    np.testing.assert_allclose(paper_jsd(torch.tensor(p), torch.tensor(q)).numpy(), ref, rtol=1e-10)
    assert paper_jsd(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == math.inf
    # masked (both-zero) entries contribute nothing, no NaN
    a, b = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.75, 0.0])
    assert torch.allclose(paper_jsd(a, b), paper_jsd(a[:2], b[:2]))


weights = st.one_of(st.just(0.0), st.floats(1e-6, 1.0))
pairs = st.integers(2, 8).flatmap(
    lambda n: st.tuples(
        st.lists(weights, min_size=n, max_size=n), st.lists(weights, min_size=n, max_size=n)
    )
)


def _norm(xs):
    x = torch.tensor([*xs, 1e-3], dtype=torch.float64)  # last entry: never all zero
    return x / x.sum()


@settings(max_examples=150, deadline=None)
@given(pairs)
def test_jsd_properties(pair):
    p, q = _norm(pair[0]), _norm(pair[1])
    d = jsd(p, q)
    assert torch.isfinite(d) and 0.0 <= d.item() <= LN2
    assert torch.allclose(d, jsd(q, p), atol=1e-15)
    assert jsd(p, p).item() == pytest.approx(0.0, abs=1e-15)
    assert not torch.isnan(paper_jsd(p, q))  # zeros give +inf at worst, never NaN
    assume((p - q).abs().max().item() > 1e-3)
    assert d.item() > 0.0


# --- head_pair_divergence vs a scipy row loop --------------------------------------------------


def oracle_matrix(pa, pb, first_row=1, metric="jsd"):
    """Plain loops: examples x heads x heads x rows (the official code's shape of work)."""
    pa, pb = pa.double().numpy(), pb.double().numpy()
    n, ha, t, _ = pa.shape
    out = np.zeros((n, ha, pb.shape[1]))
    for e in range(n):
        for i in range(ha):
            for j in range(pb.shape[1]):
                vals = []
                for r in range(first_row, t):
                    p, q = pa[e, i, r, : r + 1], pb[e, j, r, : r + 1]
                    if metric == "jsd":
                        vals.append(jensenshannon(p, q) ** 2)
                    else:
                        m = 0.5 * (p + q)
                        vals.append(0.5 * ((m * np.log(m / p)).sum() + (m * np.log(m / q)).sum()))
                out[e, i, j] = np.mean(vals)
    return out


@pytest.mark.parametrize("metric", ["jsd", "paper_jsd"])
def test_head_pair_matrix_matches_scipy_oracle(model, other, tokens, metric):
    toks = tokens[:2]
    pa = attention_patterns(model, toks, layers=[1])[1]
    pb = attention_patterns(other, toks, layers=[1])[1]
    valid = torch.ones(toks.shape, dtype=torch.bool)
    first_row = 1 if metric == "jsd" else 0
    valid[:, :first_row] = False
    ours = head_pair_divergence(pa, pb, valid, metric=metric).double().numpy()
    ref = oracle_matrix(pa, pb, first_row=first_row, metric=metric)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=2e-6)
    if metric == "jsd":  # and the frame's "min" row is the min of that matrix
        df = attention_divergence(model, other, toks, layers=[1], progress=False)
        np.testing.assert_allclose(df["value"], ref.reshape(2, -1).min(1), rtol=1e-4, atol=2e-6)


def test_chunking_does_not_change_the_result(model, other, tokens):
    pa = attention_patterns(model, tokens, layers=[0])[0]
    pb = attention_patterns(other, tokens, layers=[0])[0]
    full = head_pair_divergence(pa, pb)
    tiny_chunks = head_pair_divergence(pa, pb, chunk_elements=1)
    torch.testing.assert_close(full, tiny_chunks, rtol=1e-5, atol=1e-7)


# --- attention_divergence ----------------------------------------------------------------------


@pytest.mark.parametrize("heads", ["min", "hungarian", "same"])
def test_self_comparison_is_zero(model, tokens, heads):
    df = attention_divergence(model, model, tokens, heads=heads, progress=False)
    assert len(df) == tokens.shape[0] * model.cfg.n_layers
    np.testing.assert_allclose(df["value"], 0.0, atol=1e-6)
    assert set(df.columns) >= {"example", "length", "split", "layer", "value", "heads"}
    assert (df["metric"] == "jsd").all() and (df["reducer"] == heads).all()


def test_head_permutation_invariance(model, tokens):
    perm = [2, 0, 3, 1]
    permuted = head_permuted(model, perm)
    # same function: identical logits
    torch.testing.assert_close(model(tokens), permuted(tokens), rtol=1e-5, atol=1e-5)
    for heads in ("min", "hungarian"):
        df = attention_divergence(model, permuted, tokens, heads=heads, progress=False)
        np.testing.assert_allclose(df["value"], 0.0, atol=1e-6)
    hung = attention_divergence(model, permuted, tokens, heads="hungarian", progress=False)
    # the matching recovers the permutation: model_a head perm[j] is model_b head j
    expected = ",".join(f"{i}-{perm.index(i)}" for i in range(4))
    assert (hung["heads"] == expected).all()
    same = attention_divergence(model, permuted, tokens, heads="same", progress=False)
    assert (same["value"] > 1e-3).all()


def test_paper_compat_self_comparison_is_positive(model, tokens):
    df = attention_divergence(model, model, tokens, paper_compat=True, progress=False)
    assert (df["value"] > 1e-3).all()
    assert (df["metric"] == "paper_jsd").all() and (df["reducer"] == "paper_min").all()
    # chosen pairs are (a, b) with a > b, the official combinations order
    for pair in df["heads"]:
        a, b = map(int, pair.split("-"))
        assert a > b
    # row 0 included by default under paper_compat: excluding it changes the value
    no_row0 = attention_divergence(
        model, model, tokens, paper_compat=True, include_first_row=False, progress=False
    )
    assert (no_row0["value"] > df["value"]).all()  # row 0 (always 0) no longer dilutes


def test_different_models_score_positive(model, other, tokens):
    df = attention_divergence(model, other, tokens, progress=False)
    assert (df["value"] > 1e-3).all() and (df["value"] <= LN2).all()
    t5 = tiny("t5", seed=3)
    assert (attention_divergence(model, t5, tokens, progress=False)["value"] > 1e-3).all()


def padded_batch(seqs):
    width = max(len(s) for s in seqs)
    toks = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        toks[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return toks, mask


def test_padding_rows_are_excluded(model, other):
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g) for n in (4, 9, 6)]
    toks, mask = padded_batch(seqs)
    data = {"tokens": toks, "attention_mask": mask, "lengths": torch.tensor([4, 9, 6])}
    padded = attention_divergence(model, other, data, heads="hungarian", progress=False)
    for i, s in enumerate(seqs):
        alone = attention_divergence(model, other, s[None], heads="hungarian", progress=False)
        np.testing.assert_allclose(
            padded[padded["example"] == i]["value"], alone["value"], rtol=1e-5, atol=1e-7
        )
    assert padded.groupby("example")["n_tokens"].first().tolist() == [4, 9, 6]


def test_results_do_not_depend_on_batch_size(model, other):
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g) for n in (3, 8, 5, 7, 8)]
    toks, mask = padded_batch(seqs)
    batch = {"tokens": toks, "attention_mask": mask}
    runs = [
        attention_divergence(model, other, batch, batch_size=bs, progress=False)["value"]
        for bs in (1, 2, 32)
    ]
    for r in runs[1:]:
        np.testing.assert_allclose(r, runs[0], rtol=1e-5, atol=1e-7)
    # the same sequences as Sequences from the data layer give the same frame
    from nopeinterp.data import make_sequences

    sets = make_sequences({"tokens": toks, "attention_mask": mask})
    it = attention_divergence(model, other, sets, progress=False)
    np.testing.assert_allclose(it["value"], runs[0], rtol=1e-5, atol=1e-7)
    assert it["example"].unique().tolist() == list(range(5))


def test_only_the_layers_q_and_k_are_read(model, other, tokens, monkeypatch):
    """Our layers give their pattern by blocks of rows from q and k: nothing T x T is read."""
    calls = []
    original = type(model).run_with_hooks

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "run_with_hooks", spy)
    attention_divergence(model, other, tokens, layers=[0], progress=False)
    assert len(calls) == 2  # one pass per model per batch
    for kwargs in calls:
        admitted = [name for name, _ in kwargs["fwd_hooks"]]
        assert sorted(admitted) == sorted(f"blocks.0.attn.{h}" for h in ("hook_q", "hook_k"))
        assert kwargs["stop_at_layer"] == 1


def test_validation_errors(model, tokens):
    deeper = build_model("nope", **{**ARCH, "n_layers": 3})
    with pytest.raises(ValueError, match="layers"):
        attention_divergence(model, deeper, tokens, progress=False)
    assert len(attention_divergence(model, deeper, tokens, layers=[0, 1], progress=False)) == 8
    with pytest.raises(ValueError, match="vocabular"):
        attention_divergence(model, build_model("nope", **{**ARCH, "d_vocab": 30}), tokens)
    with pytest.raises(ValueError, match="no examples"):
        attention_divergence(model, model, [], progress=False)
    with pytest.raises(ValueError, match="heads"):
        attention_divergence(model, model, tokens, heads="max", progress=False)
    with pytest.raises(ValueError, match="paper"):
        attention_divergence(model, model, tokens, heads="hungarian", paper_compat=True)
    with pytest.raises(ValueError, match="vocabulary"):
        attention_divergence(model, model, torch.full((1, 4), VOCAB), progress=False)
    two_heads = build_model("nope", **{**ARCH, "n_heads": 2})
    with pytest.raises(ValueError, match="same"):
        attention_divergence(model, two_heads, tokens, heads="same", progress=False)
    # min and hungarian accept different head counts
    assert len(attention_divergence(model, two_heads, tokens, heads="hungarian", progress=False))


# --- compare_attention -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def copy_setup():
    from nopeinterp.tasks import get_task, task_tokenizer

    task = get_task("copy")
    tok = task_tokenizer(task)
    arch = {**ARCH, "d_vocab": len(tok), "n_ctx": 128}
    models = {
        name: sharpened(build_model(pe, seed=seed, tokenizer=tok, **arch))
        for name, pe, seed in [("nope", "nope", 0), ("t5", "t5", 1), ("nope2", "nope", 2)]
    }
    return task, tok, models


def test_paper_inputs_group_by_length_with_splits(copy_setup):
    from nopeinterp.data import make_sequences

    task, tok, _ = copy_setup
    sets = make_sequences((task, tok), n_per_length=3, id_lengths=(3, 5), ood_lengths=(25, 25))
    assert list(sets) == ["ID", "OOD"]
    batches = [b for s in sets.values() for b in s.batches(32)]
    assert [len(b) for b in batches] == [3, 3, 3, 3]
    assert [b.split for b in batches] == ["ID", "ID", "ID", "OOD"]
    assert [int(b.lengths[0]) for b in batches] == [3, 4, 5, 25]
    assert all(b.attention_mask.all() for b in batches)  # one length per batch: no padding


def test_compare_attention_ranking_ci_and_report(copy_setup, tmp_path):
    task, tok, m = copy_setup
    result = compare_attention(
        m["nope"],
        {"t5": m["t5"], "self": m["nope"]},
        (task, tok),
        n_per_length=3,
        id_lengths=(4, 4),
        ood_lengths=(25, 25),
        nope_prime=m["nope2"],
        n_boot=200,
        progress=False,
    )
    pe = result.per_example
    assert set(pe["ref"]) == {"t5", "self", "nope_prime"}
    assert len(pe) == 3 * 6 * 2  # refs x examples x layers
    for split in ("ID", "OOD"):
        ranking = result.ranking[result.ranking["split"] == split]
        assert ranking.iloc[0]["ref"] == "self" and ranking.iloc[0]["mean"] < 1e-6
        assert ranking["rank"].tolist() == [1, 2, 3]
    table = result.table
    assert ((table["ci_low"] <= table["mean"]) & (table["mean"] <= table["ci_high"])).all()
    assert set(table["layer"]) == {0, 1, "all"}
    # layer "all" = mean over layers per example, then over examples
    t5_id = pe[(pe["ref"] == "t5") & (pe["split"] == "ID")]
    row = table[(table["ref"] == "t5") & (table["layer"] == "all") & (table["split"] == "ID")]
    assert row["mean"].item() == pytest.approx(t5_id.groupby("example")["value"].mean().mean())
    assert row["n"].item() == 3

    paths = result.save(tmp_path / "out")
    assert set(paths) == {
        "attention_similarity",
        "attention_similarity_per_example",
        "attention_similarity_ranking",
        "meta",
        "html",
    }
    for path in paths.values():
        assert path.parent == tmp_path / "out" and path.stat().st_size > 0
    # the result holds data only: no model, and saving runs no forward pass
    assert not any(isinstance(v, torch.nn.Module) for v in vars(result).values())
    text = paths["html"].read_text()
    assert not re.search(r"<script[^>]*src=[\"']https?://", text)
    assert "Ranking" in text and "Attention: nope vs t5" in text and "distance" in text
    assert len(result.figure().data) > 0


def test_bootstrap_ci_contains_mean():
    values = np.random.default_rng(0).normal(1.0, 0.5, 40)
    mean, low, high = bootstrap_ci(values, n_boot=500, seed=1)
    assert low < mean < high and mean == pytest.approx(values.mean())
    assert bootstrap_ci([2.0]) == (2.0, 2.0, 2.0)


def test_compare_attention_rejects_mismatched_checkpoints(copy_setup, tmp_path):
    from nopeinterp.checkpoint import save_checkpoint

    _, tok, m = copy_setup
    a = save_checkpoint(m["nope"], tmp_path / "a.pt", tokenizer=tok, task="copy", seed=0)
    c = save_checkpoint(m["t5"], tmp_path / "c.pt", tokenizer=tok, task="copy", seed=0)
    # data=None: the paper's inputs for the checkpoint's task, 1 per ID and OOD length
    ok = compare_attention(
        a, {"t5": c}, None, n_per_length=1, layers=[0], n_boot=20, progress=False
    )
    assert set(ok.per_example["split"]) == {"ID", "OOD"}
    assert ok.per_example["length"].tolist() == list(range(2, 41))
    b = save_checkpoint(m["t5"], tmp_path / "b.pt", tokenizer=tok, task="reverse", seed=0)
    with pytest.raises(ValueError, match="task"):
        compare_attention(a, {"t5": b}, torch.zeros(1, 4, dtype=torch.long), progress=False)
    with pytest.raises(ValueError, match="vocabular"):
        compare_attention(m["nope"], {"x": build_model("nope", **ARCH)}, None, progress=False)


def test_bfloat16_patterns_are_compared_in_float32(model, other, tokens):
    """A bfloat16 model's patterns: the divergence is computed in float32 (the same numbers as
    float32 copies of the same bfloat16 values), and compare_attention runs on bf16 models."""
    pa = attention_patterns(model, tokens, layers=[0])[0].bfloat16()
    pb = attention_patterns(other, tokens, layers=[0])[0].bfloat16()
    got = head_pair_divergence(pa, pb)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, head_pair_divergence(pa.float(), pb.float()))
    half = tiny("nope", seed=3, dtype=torch.bfloat16)
    cmp = compare_attention(half, {"ref": tiny("t5", seed=4, dtype=torch.bfloat16)}, n_per_length=1)
    numeric = cmp.table.select_dtypes("number")
    assert len(numeric.columns) and np.isfinite(numeric.to_numpy()).all()
