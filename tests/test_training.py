import re

import pytest
import torch

from nopeinterp import PE_TYPES, build_model, load_checkpoint, save_checkpoint
from nopeinterp.cli import main
from nopeinterp.evaluation import evaluate, exact_match, greedy_decode
from nopeinterp.tasks import get_task, task_tokenizer
from nopeinterp.training import TrainConfig, train
from nopeinterp.training.trainer import lr_factor

SMALL_COPY = {"id_lengths": (2, 5), "ood_lengths": (6, 10)}


def small_config(tmp_path, **overrides):
    base = dict(
        task="copy",
        pe="nope",
        out=str(tmp_path / "m.pt"),
        steps=30,
        batch_size=16,
        d_model=32,
        n_layers=1,
        n_heads=2,
        eval_every=30,
        eval_n=20,
        checkpoint_every=10,
        task_options=SMALL_COPY,
        progress=False,
    )
    return TrainConfig(**{**base, **overrides})


def test_lr_schedule_warms_up_then_decays():
    factors = [lr_factor(s, 100, 10) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[9:], factors[10:], strict=False))
    assert factors[-1] == pytest.approx(1 / 90)


def test_tiny_model_learns_copy(tmp_path):
    """A 2-layer d_model-64 NoPE model learns copy at ID lengths (2-5) to >= 95% exact match."""
    cfg = small_config(
        tmp_path,
        steps=700,
        batch_size=32,
        lr=3e-3,
        d_model=64,
        n_layers=2,
        n_heads=4,
        eval_every=350,
        eval_n=100,
    )
    ckpt = load_checkpoint(train(cfg))
    task = get_task("copy", **SMALL_COPY)
    val = task.generate(200, seed=1, split="val")
    acc = sum(exact_match(ckpt.model, ckpt.tokenizer, task, val)) / len(val)
    assert acc >= 0.95, acc


def test_resume_reaches_same_weights(tmp_path):
    whole = load_checkpoint(train(small_config(tmp_path / "a")))
    cfg = small_config(tmp_path / "b", stop_after=10)
    train(cfg)  # "killed" after 10 steps: only the training state exists
    assert (tmp_path / "b" / "m.pt.state.pt").exists() and not (tmp_path / "b" / "m.pt").exists()
    cfg.stop_after, cfg.resume = None, True
    resumed = load_checkpoint(train(cfg))
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert not (tmp_path / "b" / "m.pt.state.pt").exists()  # cleaned up when finished
    assert resumed.meta["step"] == whole.meta["step"] == 30


def test_meta_records_the_run(tmp_path):
    meta = load_checkpoint(train(small_config(tmp_path, pe="t5", seed=3))).meta
    for key in (
        "task",
        "pe",
        "seed",
        "step",
        "steps",
        "train_lengths",
        "ood_lengths",
        "val_accuracy",
        "wall_time_s",
        "versions",
        "train_config",
    ):
        assert key in meta, key
    assert meta["task"] == "copy" and meta["pe"] == "t5" and meta["seed"] == 3
    assert meta["train_lengths"] == [2, 5] and 0 <= meta["val_accuracy"] <= 1
    assert meta["versions"]["torch"] == str(torch.__version__)


@pytest.mark.parametrize("pe", PE_TYPES)
def test_kv_cache_decoding_equals_recomputation(pe):
    """Left-padded batched greedy decoding with the KV cache = re-running the whole sequence."""
    task = get_task("addition")  # prompts of different lengths in one batch -> left padding
    tok = task_tokenizer(task)
    model = build_model(
        pe, n_layers=2, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=64, tokenizer=tok, seed=1
    )
    examples = task.generate(12, lengths=(1, 4), seed=0, split="val")
    assert len({len(e.prompt.split()) for e in examples}) > 1
    fast = greedy_decode(model, tok, examples, max_new_tokens=8)
    slow = greedy_decode(model, tok, examples, max_new_tokens=8, use_cache=False)
    assert fast == slow
    # and a batch gives what each example gives alone (padding changes nothing)
    assert fast[:3] == [greedy_decode(model, tok, [e], max_new_tokens=8)[0] for e in examples[:3]]


def test_ape_lengths_past_its_table_are_marked_not_evaluable(tmp_path):
    path = train(small_config(tmp_path, pe="ape", steps=10, eval_every=10))
    result = evaluate(path, lengths=[3, 5, 20], n=5, progress=False)
    table = result.table
    assert table.set_index("length")["evaluable"].to_dict() == {3: True, 5: True, 20: False}
    assert table.set_index("length")["accuracy"].isna().to_dict() == {3: False, 5: False, 20: True}
    summary = result.summary
    assert summary.set_index("split").loc["OOD", "lengths_not_evaluable"] == 1


def test_cli_train_and_eval(tmp_path, capsys):
    out = tmp_path / "cli.pt"
    args = [
        "train",
        "--task",
        "copy",
        "--pe",
        "alibi",
        "--out",
        str(out),
        "--steps",
        "10",
        "--d-model",
        "32",
        "--n-layers",
        "1",
        "--eval-every",
        "10",
        "--train-lengths",
        "2-5",
        "--ood-lengths",
        "6-8",
    ]
    assert main(args) == 0
    assert (
        main(["eval", str(out), "--lengths", "2-3,7", "--n", "5", "--out", str(tmp_path / "ev")])
        == 0
    )
    printed = capsys.readouterr().out
    assert "OOD" in printed and "accuracy" in printed
    assert (tmp_path / "ev" / "accuracy_by_length.csv").exists()
    html = (tmp_path / "ev" / "accuracy.html").read_text()
    assert not re.search(r"<script[^>]*src=", html) and "Plotly.newPlot" in html  # offline
    assert main(["eval", str(tmp_path / "missing.pt")]) == 2


def test_saved_checkpoint_evaluates(tmp_path):
    task = get_task("copy", **SMALL_COPY)
    tok = task_tokenizer(task)
    model = build_model(
        "nope", n_layers=1, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=32, tokenizer=tok
    )
    path = save_checkpoint(
        model,
        tmp_path / "r.pt",
        task="copy",
        task_options={"id_lengths": [2, 5], "ood_lengths": [6, 10]},
    )
    table = evaluate(path, n=4, progress=False).table
    assert set(table["split"]) == {"ID", "OOD"} and table["length"].tolist() == list(range(2, 11))
