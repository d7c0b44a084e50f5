"""Sinks, entropy and the head taxonomy on heads whose attention is known in closed form:
logits set through a hook on hook_attn_scores, and the hand-built Theorem 1/2 weights."""

import math

import pytest
import torch

from nopeinterp.models import build_model
from nopeinterp.probing.heads import (
    LOCAL_WINDOW,
    THRESHOLDS,
    PatternStats,
    attention_sinks,
    classify_heads,
    label_head,
)
from nopeinterp.theory import bos_sequences, relative_attention_model

SHARP = 12.0  # logit of the attended key; exp(-12) * 40 keys < 3e-4 mass elsewhere


def _set_scores(scores, hook):
    """Head 0 previous-token, 1 uniform, 2 sink (first token), 3 iid random logits."""
    B, H, N, _ = scores.shape
    q = torch.arange(N)
    new = torch.zeros_like(scores)
    new[:, 0] = SHARP * (q[:, None] - q[None, :] == 1)
    new[:, 2, :, 0] = SHARP
    g = torch.Generator().manual_seed(B * 1000 + N)
    new[:, 3] = 3.0 * torch.randn(B, N, N, generator=g)
    return torch.where(torch.isfinite(scores), new, scores)


def _hand_model():
    model = build_model("nope", n_layers=1, n_heads=4, d_model=32, d_vocab=20, n_ctx=64)
    return model


def _tokens(n=24, lo=8, hi=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g)
    T = int(lens.max())
    tokens = bos_sequences(n, T, d_vocab=20, seed=seed)
    return tokens, (torch.arange(T)[None] < lens[:, None]).long()


def test_hand_built_heads_are_labelled():
    model = _hand_model()
    tokens, mask = _tokens()
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", _set_scores)]):
        res = classify_heads(model, tokens, attention_mask=mask, progress=False)
    t = res.table.set_index("head")
    assert t.label.tolist() == ["previous_token", "uniform", "sink", "content"]
    assert t.previous_token[0] > 0.99 and t.sink[2] > 0.99
    assert t.uniform[1] == pytest.approx(1.0, abs=1e-6)
    assert t.distance[1] == 0.0 and t.content[1] == 0.0  # constant logits: nothing to explain
    assert t.distance[0] == pytest.approx(1.0, abs=1e-9)  # a function of n - m only
    assert t.content[3] > 0.8  # random logits: relative distance explains little
    assert res.labels().loc[0].tolist() == t.label.tolist()


def test_theorem_heads_from_weights_are_labelled():
    """Layer 1 of the Theorem 1/2 model: uniform counting heads; layer 2: a recency head
    (logit -0.1 (n - m)) is distance-based, the target-distance-1 head is previous-token."""
    model = relative_attention_model(
        d_vocab=20, n_ctx=64, max_length=64, recency_slope=0.1, target_distance=1
    )
    tokens, mask = _tokens(seed=1)
    t = classify_heads(model, tokens, attention_mask=mask, progress=False).table
    labels = {(r.layer, r["head"]): r.label for _, r in t.iterrows()}
    assert labels == {
        (0, 0): "uniform",
        (0, 1): "uniform",
        (1, 0): "distance",
        (1, 1): "previous_token",
    }


def test_sinks_and_entropy_closed_forms(tmp_path):
    model = _hand_model()
    tokens, mask = _tokens(n=12, lo=3, hi=20)
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", _set_scores)]):
        res = attention_sinks(model, tokens, attention_mask=mask, progress=False)
    t = res.table
    assert set(t.split) == {"all"} and t.n_keys.min() == 1 and t.n_keys.max() == 20
    # rows with n keys: as many as the sequences reaching position n - 1
    lens = mask.sum(1)
    counts = t[t["head"] == 0].set_index("n_keys").n_rows
    assert all(counts[n] == int((lens >= n).sum()) for n in counts.index)
    uni = t[t["head"] == 1].set_index("n_keys")
    n = uni.index.to_series()
    torch.testing.assert_close(torch.tensor(uni.first_mass.values), torch.tensor(1 / n.values))
    torch.testing.assert_close(
        torch.tensor(uni.entropy.values), torch.tensor(n.map(math.log).values), atol=1e-6, rtol=0
    )
    sink = t[t["head"] == 2].set_index("n_keys")
    expected = math.exp(SHARP) / (math.exp(SHARP) + n - 1)
    torch.testing.assert_close(
        torch.tensor(sink.first_mass.values), torch.tensor(expected.values), atol=1e-6, rtol=0
    )
    assert (sink.entropy_ratio[n > 1] < 0.01).all()
    assert (uni.uniform_entropy == n.map(math.log)).all()
    slope = res.dilution.set_index("head").entropy_slope
    assert slope[1] == pytest.approx(1.0, abs=1e-6)  # uniform: entropy = log(n) exactly
    assert abs(slope[0]) < 0.01 and abs(slope[2]) < 0.01  # one-key heads stay sharp
    paths = res.save(tmp_path)
    assert paths["attention_sinks_dilution"].read_text().startswith("split,layer,head,entropy")
    assert len(res.figure().data) > 0


def test_pattern_stats_lifts_on_exact_patterns():
    N, n_seq = 12, 3
    q = torch.arange(N)
    prev = (q[:, None] - q[None, :] == 1).double()
    prev[0, 0] = 1.0
    uniform = torch.tril(torch.ones(N, N, dtype=torch.float64)) / (q + 1)[:, None]
    pattern = torch.stack([prev, uniform])[None].expand(n_seq, 2, N, N)
    real = torch.ones(n_seq, N, dtype=torch.bool)
    st = PatternStats(2).update(pattern, real)
    lifts = st.lifts(min_keys=LOCAL_WINDOW + 2)
    n = (q + 1)[LOCAL_WINDOW + 1 :].double()  # rows used
    assert float(lifts["previous_token"][0]) == pytest.approx(1.0)
    assert float(lifts["sink"][0]) == pytest.approx(float((-1 / (n - 1)).mean()))
    assert float(lifts["uniform"][0]) == pytest.approx(0.0, abs=1e-12)
    ul = (LOCAL_WINDOW + 1) / n  # previous token is in the local window
    assert float(lifts["local"][0]) == pytest.approx(float(((1 - ul) / (1 - ul)).mean()))
    for k in ("sink", "previous_token", "local"):
        assert float(lifts[k][1]) == pytest.approx(0.0, abs=1e-12)
    assert float(lifts["uniform"][1]) == pytest.approx(1.0)
    assert lifts["n_rows"] == n_seq * len(n)


def test_label_rule_order_and_thresholds():
    base = dict(sink=0, previous_token=0, local=0, uniform=0, distance=0, content=1)
    assert label_head(base) == "content"
    assert label_head({**base, "distance": THRESHOLDS["distance"]}) == "distance"
    # a previous-token head is also local and distance-based: the specific kind wins
    assert label_head({**base, "previous_token": 0.9, "local": 0.9, "distance": 1}) == (
        "previous_token"
    )
    assert label_head({**base, "sink": 0.6, "previous_token": 0.9}) == "sink"
    assert label_head({**base, "uniform": 0.89}) == "content"
    assert label_head({**base, "distance": float("nan")}) == "content"


def test_taxonomy_save(tmp_path):
    model = _hand_model()
    tokens, mask = _tokens(n=8)
    res = classify_heads(
        model, tokens, attention_mask=mask, id_lengths=(8, 20), progress=False, layers=[0]
    )
    assert set(res.table.split) <= {"ID", "OOD"}
    paths = res.save(tmp_path)
    assert paths["heads"].read_text().startswith("split,layer,head,sink")
    assert "thresholds" in paths["meta"].read_text()
    assert len(res.figure().data) == 1
