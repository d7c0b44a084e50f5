"""The random-init control on imported models, and degenerate ridge fits: a model whose
activations are not finite gives NaN probe metrics in the table, never an error."""

import math

import pytest
import torch
import transformers as tf

from nopeinterp.models.fresh import random_init_like
from nopeinterp.models.hf import from_hf
from nopeinterp.probing import probe_position
from nopeinterp.probing.ridge import RidgePath, RidgeStats, select_alpha

pytestmark = pytest.mark.tl4

VOCAB = 40


def gpt2(seed=0):
    # transformers' own GPT-2 initialisation (initializer_range 0.02), as a researcher saves it
    config = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_positions=64)
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(config).eval()


def test_random_init_of_an_imported_model_is_its_config_freshly_initialised():
    hf = gpt2()
    model = from_hf(hf)
    fresh = random_init_like(model, seed=7)
    torch.manual_seed(7)
    expected = from_hf(tf.GPT2LMHeadModel(hf.config).eval())  # the same draw, done by hand
    toks = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        got = fresh(toks)
        assert torch.allclose(got, expected(toks), atol=1e-5)
        assert not torch.allclose(got, model(toks), atol=1e-3)  # not the trained weights
    assert fresh.cfg.seed == 7 and type(fresh) is type(model)
    for name, p in fresh.named_parameters():  # every weight drawn (nothing left empty)
        assert torch.isfinite(p).all(), name
    assert fresh.W_E.std() > 0.01


def test_probe_position_on_an_imported_model_runs_with_its_control():
    model = from_hf(gpt2())
    toks = torch.randint(0, VOCAB, (40, 24), generator=torch.Generator().manual_seed(0))
    lengths = torch.randint(8, 25, (40,), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(24)[None] < lengths[:, None]).long()
    result = probe_position(
        model, toks, attention_mask=mask, id_lengths=(8, 16), ood_lengths=(17, 24),
        progress=False, n_train=32, n_eval=8,
    )  # fmt: skip
    table = result.table
    control = table[table["model"] == "random_init"]
    assert len(control) and control.select_dtypes("number").notna().all().all()


def test_select_alpha_on_a_degenerate_fit_returns_nan_scores():
    d, k = 6, 3
    X, Y = torch.randn(60, d), torch.randn(60, k)
    X[5, 2] = float("inf")  # an overflowing activation
    path = RidgePath(RidgeStats(d, k).update(X, Y))
    assert path.degenerate
    alpha, scores = select_alpha(path, RidgeStats(d, k).update(X[:10], Y[:10]), [0.1, 1.0])
    assert alpha == 1.0 and all(math.isnan(s) for s in scores.values())
    assert torch.isnan(path.coef(alpha)[0]).all()
