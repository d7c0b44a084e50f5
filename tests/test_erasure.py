"""Position erasure: the Theorem 1 acceptance test, the eraser against the concept-erasure
package fitted in one shot, LEACE's defining property, the random control's geometry, and
task metrics against an independent computation."""

import pytest
import torch
from concept_erasure import LeaceFitter

from nopeinterp.models import build_model
from nopeinterp.probing.erasure import (
    ErasureResult,
    erase_position,
    eraser_rank,
    erasing,
    fit_position_erasers,
    position_concept,
    random_subspace_eraser,
)
from nopeinterp.theory import absolute_position_model, bos_sequences

TINY = dict(n_layers=2, n_heads=2, d_model=32, d_vocab=20, n_ctx=64)


def _mixed(n, lo, hi, seed=0, d_vocab=20):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g)
    T = int(lens.max())
    tokens = bos_sequences(n, T, d_vocab=d_vocab, seed=seed)
    mask = (torch.arange(T)[None] < lens[:, None]).long()
    return tokens, mask


def _resid(model, tokens, mask, name):
    _, cache = model.run_with_cache(
        tokens, attention_mask=mask, names_filter=lambda n: n == name, return_cache_object=False
    )
    return cache[name]


def test_theorem1_erasure_acceptance():
    """Issue 17: after layer 1 of the Theorem 1 model, LEACE drops the refitted probe's R^2
    to <= 0.05; a random subspace of the same rank leaves it >= 0.99."""
    model = absolute_position_model(d_vocab=20, n_ctx=64, max_length=64)
    tokens, mask = _mixed(1000, 8, 40)
    res = erase_position(
        model,
        tokens,
        attention_mask=mask,
        id_lengths=(8, 30),
        ood_lengths=(31, 40),
        layers=[1],
        progress=False,
    )
    assert isinstance(res, ErasureResult)
    r2 = res.table[(res.table.metric == "r2") & (res.table.split == "ID")].set_index("condition")
    assert r2.value["none"] >= 0.99  # position is there before erasure
    assert r2.value["leace"] <= 0.05
    assert r2.value["random"] >= 0.99
    assert r2["rank"]["leace"] == r2["rank"]["random"] == 1
    assert r2.delta["leace"] == pytest.approx(r2.value["leace"] - r2.value["none"])
    # the erase / probe-fit / val / ID / OOD sets are disjoint and all used
    assert res.meta["n_seq_erase"] > 0 and res.meta["n_seq_fit"] > 0


def test_streamed_eraser_matches_package_one_shot_fit():
    model = build_model("nope", **TINY, seed=3)
    tokens, mask = _mixed(24, 4, 20, seed=1)
    erasers = fit_position_erasers(model, tokens, mask, layers=[0, 2], batch_size=24)
    streamed = fit_position_erasers(model, tokens, mask, layers=[2], batch_size=5)[2]
    real = mask.bool()
    pos = torch.arange(tokens.shape[1]).expand_as(real)[real]
    for layer, name in ((0, "blocks.0.hook_resid_pre"), (2, "blocks.1.hook_resid_post")):
        x = _resid(model, tokens, mask, name)[real].double()
        ref = LeaceFitter.fit(x, pos.double()[:, None]).eraser
        ours = erasers[layer]
        torch.testing.assert_close(ours.P, ref.P, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(ours.bias, ref.bias, rtol=1e-8, atol=1e-8)
        # LEACE's defining property: erased features have zero covariance with the concept
        xe = ours(x)
        cov = ((xe - xe.mean(0)) * (pos - pos.double().mean())[:, None]).mean(0)
        assert cov.abs().max() < 1e-8 * x.abs().max()
        assert eraser_rank(ours) == 1
    # in 5 batches (other padding, so float32 activations differ in the last bits): the same
    torch.testing.assert_close(streamed.P, erasers[2].P, rtol=0, atol=1e-5)


def test_erasing_hook_changes_the_stream_and_everything_after():
    model = build_model("nope", **TINY, seed=4)
    tokens, mask = _mixed(10, 4, 12, seed=2)
    eraser = fit_position_erasers(model, tokens, mask, layers=[1])[1]
    name = "blocks.0.hook_resid_post"
    x = _resid(model, tokens, mask, name)
    logits = model(tokens, attention_mask=mask)
    with erasing(model, name, eraser):
        xe = _resid(model, tokens, mask, name)
        logits_e = model(tokens, attention_mask=mask)
    torch.testing.assert_close(xe, eraser(x.double()).float(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits, logits_e)
    torch.testing.assert_close(model(tokens, attention_mask=mask), logits)  # hook removed


def test_random_subspace_eraser_is_an_orthogonal_projection_of_the_rank():
    d, rank = 16, 3
    mean = torch.arange(d, dtype=torch.float64)
    e = random_subspace_eraser(d, rank, mean, seed=7)
    P = e.P
    torch.testing.assert_close(P, P.T)
    torch.testing.assert_close(P @ P, P)
    assert float(torch.trace(P)) == pytest.approx(d - rank)
    assert eraser_rank(e) == rank
    torch.testing.assert_close(e(mean[None]), mean[None])  # the mean is left in place
    other = random_subspace_eraser(d, rank, mean, seed=8)
    assert not torch.allclose(other.P, P)


def test_position_concept():
    pos = torch.tensor([0, 2, 1, 5])
    assert position_concept(pos).flatten().tolist() == [0, 2, 1, 5]
    oh = position_concept(pos, "onehot", 3)
    assert oh.tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="concept"):
        position_concept(pos, "sine")


def test_erase_position_task_metrics(tmp_path):
    from nopeinterp.evaluation import exact_match
    from nopeinterp.tasks import encode_examples, get_task, task_tokenizer
    from nopeinterp.training.trainer import target_loss

    task = get_task("copy")
    tok = task_tokenizer(task)
    model = build_model("nope", **{**TINY, "d_vocab": len(tok)}, seed=5)
    kw = dict(id_lengths=(2, 6), ood_lengths=(7, 9), n_train=60, n_eval=12, seed=0)
    res = erase_position(model, (task, tok), progress=False, batch_size=5, **kw)
    t = res.table
    assert set(t.metric) == {"r2", "mae", "accuracy", "exact_match", "target_loss"}
    assert set(t.condition) == {"none", "leace", "random"}
    assert set(t.layer) == {0, 1, 2}
    # the "none" task metrics equal a direct computation on the same examples, in one batch
    exs = task.generate(12, lengths=(7, 9), seed=0, split="test")
    none = t[(t.condition == "none") & (t.split == "OOD") & (t.layer == 1)].set_index("metric")
    with torch.inference_mode():
        loss = float(target_loss(model, encode_examples(tok, exs)))
    assert none.value["target_loss"] == pytest.approx(loss, rel=1e-5)
    em = exact_match(model, tok, task, exs)
    assert none.value["exact_match"] == pytest.approx(sum(em) / len(em))
    # erasing at a layer that feeds the logits changes the loss
    leace = t[(t.condition == "leace") & (t.metric == "target_loss") & (t.layer == 2)]
    assert (leace.delta.abs() > 0).all()
    paths = res.save(tmp_path)
    assert paths["erase_position"].read_text().startswith("condition,layer")
    assert "<html" in paths["html"].read_text()[:300].lower()


def test_erase_position_bad_input():
    model = build_model("nope", **TINY)
    tokens, mask = _mixed(20, 4, 10)
    with pytest.raises(ValueError, match="concept"):
        erase_position(model, tokens, attention_mask=mask, concept="sine", progress=False)
    with pytest.raises(ValueError, match="erase_fraction"):
        erase_position(model, tokens, attention_mask=mask, erase_fraction=1.0, progress=False)


def test_onehot_concept_erases_every_position_indicator():
    model = build_model("nope", **TINY, seed=6)
    tokens, mask = _mixed(30, 3, 8, seed=3)
    eraser = fit_position_erasers(model, tokens, mask, layers=[1], concept="onehot")[1]
    real = mask.bool()
    pos = torch.arange(tokens.shape[1]).expand_as(real)[real]
    z = position_concept(pos, "onehot", 8)
    x = _resid(model, tokens, mask, "blocks.0.hook_resid_post")[real].double()
    xe = eraser(x)
    cov = (xe - xe.mean(0)).T @ (z - z.mean(0)) / len(z)
    assert cov.abs().max() < 1e-8 * x.abs().max()
    assert 1 < eraser_rank(eraser) <= 7  # at most one fewer than the 8 positions
