"""The random-init control on imported models, and degenerate ridge fits: a model whose
activations are not finite gives NaN probe metrics in the table, never an error."""

import math

import pytest
import torch
import transformers as tf

from nopeinterp.models.fresh import random_init_like
from nopeinterp.models.hf import from_hf
from nopeinterp.probing import probe_position
from nopeinterp.probing.position import NON_FINITE
from nopeinterp.probing.ridge import RidgePath, RidgeStats, select_alpha

# The tests on imported models run under TL 4 too (make test-tl4); those on our own
# checkpoints (the ckpt_dir fixture) need what our models are built on.

VOCAB = 40


def gpt2(seed=0):
    # transformers' own GPT-2 initialisation (initializer_range 0.02), as a researcher saves it
    config = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_positions=64)
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(config).eval()


@pytest.mark.tl4
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


@pytest.mark.tl4
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


@pytest.mark.tl4
def test_select_alpha_on_a_degenerate_fit_returns_nan_scores():
    d, k = 6, 3
    X, Y = torch.randn(60, d), torch.randn(60, k)
    X[5, 2] = float("inf")  # an overflowing activation
    path = RidgePath(RidgeStats(d, k).update(X, Y))
    assert path.degenerate
    alpha, scores = select_alpha(path, RidgeStats(d, k).update(X[:10], Y[:10]), [0.1, 1.0])
    assert alpha == 1.0 and all(math.isnan(s) for s in scores.values())
    assert torch.isnan(path.coef(alpha)[0]).all()


def _overflowing_control(monkeypatch):
    """The random-init control comes out overflowing from block 0 on (an infinite MLP weight):
    layer 0 (the embeddings) is finite, layers 1 and 2 are not."""
    from nopeinterp.models import fresh

    real = fresh.random_init_like

    def overflowing(model, seed=None):
        twin = real(model, seed)
        with torch.no_grad():
            twin.blocks[0].mlp.W_in.fill_(float("inf"))
        return twin

    monkeypatch.setattr(fresh, "random_init_like", overflowing)


def test_an_overflowing_control_is_a_degenerate_fit_flagged_in_the_table(ckpt_dir, monkeypatch):
    _overflowing_control(monkeypatch)
    result = probe_position(ckpt_dir / "copy-nope.pt", n_train=32, n_eval=16, progress=False)
    table = result.table
    control = table[table.model == "random_init"]
    bad = control[control.layer >= 1]
    # NaN in every metric, accuracy included (a NaN prediction's argmax would count the
    # tokens at position 0 as right), and flagged
    assert len(bad) and bad.value.isna().all() and bad.degenerate.all()
    good = table[(table.model != "random_init") | (table.layer == 0)]
    assert good.value.notna().all() and not good.degenerate.any()  # the trained probe stands
    assert result.meta["degenerate_fits"] == [
        {"model": "random_init", "layers": [1, 2], "reason": NON_FINITE}
    ]
    assert result.pivot(models=["trained", "random_init"])["ID r2 [random_init]"].isna().sum() == 2


def test_the_cli_names_a_degenerate_control_in_one_line_and_prints_the_table(
    ckpt_dir, monkeypatch, capsys
):
    from nopeinterp.cli import main

    _overflowing_control(monkeypatch)
    ckpt = str(ckpt_dir / "copy-nope.pt")
    args = ["--quiet", "probe-position", ckpt, "--n-train", "32", "--n-eval", "16"]
    assert main(args) == 0
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "copy-nope" in line and "random_init" in line and "layer 1, 2" in line, line
    assert "degenerate" in line and "NaN" in line
    assert "ID r2" in captured.out  # the trained model's table is printed


def test_a_sound_probe_flags_nothing(ckpt_dir, capsys):
    from nopeinterp.cli import main

    result = probe_position(ckpt_dir / "copy-nope.pt", n_train=32, n_eval=16, progress=False)
    assert not result.table.degenerate.any() and result.meta["degenerate_fits"] == []
    assert main(["--quiet", "probe-position", str(ckpt_dir / "copy-nope.pt")]) == 0
    assert capsys.readouterr().err == ""


def test_a_trained_model_that_overflows_is_refused_in_one_line(ckpt_dir, tmp_path, capsys):
    """Finite but huge weights (the loader accepts them): the trained model's activations
    overflow, so no layer of its own probe could be fitted: one line, exit 2, no table."""
    from nopeinterp import load_checkpoint, save_checkpoint
    from nopeinterp.cli import main

    ckpt = load_checkpoint(ckpt_dir / "copy-nope.pt")
    with torch.no_grad():
        ckpt.model.blocks[0].mlp.W_in.fill_(1e38)
    path = tmp_path / "copy-nope.pt"
    save_checkpoint(ckpt.model, path, **{k: ckpt.meta[k] for k in ("task", "task_options")})
    assert main(["--quiet", "probe-position", str(path), "--n-train", "32", "--n-eval", "16"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "non-finite activations" in line and "blocks.0.hook_resid_post" in line, line
    assert captured.out == ""
