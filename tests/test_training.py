import re

import pandas as pd
import pytest
import torch

from nopeinterp import PE_TYPES, build_model, load_checkpoint, save_checkpoint
from nopeinterp.cli import main
from nopeinterp.errors import NopeinterpError
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


# --- issue 12: reproducible at any thread count, refused inputs, locks ------------------------
def test_resume_is_exact_at_two_threads(tmp_path):
    """At 2 threads the embedding backward is order-dependent unless the trainer runs torch's
    deterministic algorithms; resume (and so two identical runs) must give equal weights."""
    torch.set_num_threads(2)
    # the case: copy at its own lengths (2-20), batch 32 (small batches hide it)
    run = dict(steps=40, eval_every=40, batch_size=32, task_options={}, eval_n=10)
    whole = load_checkpoint(train(small_config(tmp_path / "a", **run)))
    cfg = small_config(tmp_path / "b", **run, stop_after=10)
    train(cfg)
    cfg.stop_after, cfg.resume = None, True
    resumed = load_checkpoint(train(cfg))
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert not torch.are_deterministic_algorithms_enabled()  # the caller's setting is restored


def test_a_second_run_on_the_same_out_is_refused(tmp_path, capsys):
    from nopeinterp._io import try_lock
    from nopeinterp.training.trainer import RunLockedError

    cfg = small_config(tmp_path)
    with try_lock(cfg.out + ".lock"):  # as a running `train` holds it
        with pytest.raises(RunLockedError, match="another training run"):
            train(cfg)
        code = main(["train", "--task", "copy", "--pe", "nope", "--out", cfg.out, "--steps", "2"])
        assert code == 2 and "another training run" in capsys.readouterr().err
    assert not (tmp_path / "m.pt").exists()


def test_resume_refuses_changed_settings_naming_them(tmp_path):
    train(small_config(tmp_path, stop_after=10))
    changed = small_config(tmp_path, resume=True, seed=1, d_model=64, lr=2e-3, steps=40)
    with pytest.raises(NopeinterpError) as err:
        train(changed)
    message = str(err.value)
    for key in ("seed: 0 -> 1", "d_model: 32 -> 64", "lr:", "steps: 30 -> 40"):
        assert key in message, message
    assert "n_heads" not in message  # unchanged settings are not named
    # the state is untouched: resuming with the original settings still works
    assert load_checkpoint(train(small_config(tmp_path, resume=True))).meta["step"] == 30


@pytest.mark.parametrize(
    "flag, value", [("--steps", "0"), ("--eval-every", "0"), ("--checkpoint-every", "0"),
                    ("--n-layers", "0"), ("--batch-size", "-1"), ("--lr", "nan"),
                    ("--dropout", "1.5"), ("--grad-accum", "3")]
)  # fmt: skip
def test_bad_train_arguments_are_refused_before_any_work(tmp_path, capsys, flag, value):
    out = tmp_path / "sub" / "m.pt"
    args = ["train", "--task", "copy", "--pe", "nope", "--out", str(out), "--batch-size", "16"]
    assert main([*args, flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert flag.lstrip("-").replace("-", "_") in err
    assert not (tmp_path / "sub").exists()  # nothing written, not even the folder


def test_an_out_that_cannot_be_created_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "m.pt"  # its folder would be a file
    # refused while the arguments are parsed
    assert main(["train", "--task", "copy", "--pe", "nope", "--out", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a folder" in err
    with pytest.raises(NopeinterpError, match="cannot create the output folder"):  # the API too
        train(small_config(tmp_path / "file"))


def test_resume_of_a_damaged_state_is_one_clear_error(tmp_path):
    cfg = small_config(tmp_path, stop_after=10)
    train(cfg)
    state = tmp_path / "m.pt.state.pt"
    state.write_bytes(state.read_bytes()[:100])
    cfg.stop_after, cfg.resume = None, True
    with pytest.raises(NopeinterpError, match="not a readable training state.*delete it"):
        train(cfg)


# --- issue 15: presets, precision, accumulation ------------------------------------------------
def test_presets_and_explicit_values_override_them(tmp_path):
    from nopeinterp.training import PRESETS, make_config

    paper = make_config("scan", "nope", tmp_path / "p.pt", preset="paper")
    assert (paper.n_layers, paper.n_heads, paper.d_model, paper.d_mlp) == (12, 12, 768, 3072)
    assert (paper.lr, paper.weight_decay, paper.warmup) == (3e-5, 0.05, 0.06)
    assert (paper.steps, paper.batch_size, paper.dropout, paper.attn_scale) == (
        40_000, 64, 0.1, False)  # fmt: skip
    ref = {
        t: make_config(t, "nope", tmp_path / "r.pt", preset="reference") for t in ("scan", "copy")
    }
    assert ref["scan"].steps == 2500 and ref["copy"].steps == 1500 and ref["copy"].lr == 2e-3
    assert make_config("copy", "nope", tmp_path / "t.pt", preset="tiny", steps=7).steps == 7
    assert set(PRESETS) == {"paper", "reference", "repro", "repro-t5", "lm", "tiny"}
    with pytest.raises(NopeinterpError, match="unknown preset"):
        make_config("copy", "nope", tmp_path / "t.pt", preset="huge")


@pytest.mark.parametrize("task", ["scan", "copy"])
def test_reference_preset_is_what_checkpoints_were_trained_with(task):
    """The shipped checkpoints record their training settings; the preset must equal them,
    and analyses/train_reference.py must use the preset rather than its own numbers."""
    from pathlib import Path

    from nopeinterp.training import make_config

    root = Path(__file__).parents[1]
    recorded = load_checkpoint(root / "checkpoints" / f"{task}-nope.pt").meta["train_config"]
    preset = make_config(task, "nope", "x.pt", preset="reference").to_dict()
    for key, value in recorded.items():
        if key not in ("out", "task", "pe"):
            assert preset[key] == value, key
    text = (root / "analyses" / "train_reference.py").read_text()
    assert '"--preset", "reference"' in text and '"--lr"' not in text


def test_grad_accumulation_matches_one_big_batch(tmp_path):
    """Accumulating 4 micro-batches = one step on the whole batch (same loss normalisation)."""
    a = load_checkpoint(train(small_config(tmp_path / "a", steps=5, eval_every=5)))
    b = load_checkpoint(train(small_config(tmp_path / "b", steps=5, eval_every=5, grad_accum=4)))
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for key in sa:
        if sa[key].is_floating_point() and not key.endswith("b_K"):
            torch.testing.assert_close(sa[key], sb[key], atol=1e-5, rtol=0, msg=key)


@pytest.mark.parametrize("arch, pe", [("default", "nope"), ("t5", "t5"), ("t5", "rotary"),
                                      ("default", "alibi"), ("default", "ape")])  # fmt: skip
def test_length_groups_give_the_whole_batchs_gradient(arch, pe):
    """A batch split into groups of similar length, each cut to its longest row, has the whole
    padded batch's loss and gradient (padding is masked and rows are right-padded)."""
    from nopeinterp.tasks import encode_examples
    from nopeinterp.training.trainer import length_groups, target_loss

    task = get_task("copy", id_lengths=(1, 12), ood_lengths=(13, 14))
    tok = task_tokenizer(task)
    batch = encode_examples(tok, task.generate(13, seed=3, split="train"))
    model = build_model(pe, n_layers=2, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=64,
                        arch=arch, tokenizer=tok)  # fmt: skip
    groups = length_groups(batch, 4)
    assert len(groups) == 4 and sum(len(g) for g in groups) == len(batch)
    widths = [g.tokens.shape[1] for g in groups]
    assert widths == sorted(widths) and widths[0] < batch.tokens.shape[1]  # padding was cut
    for g in groups:  # every group keeps its longest row whole
        assert int(g.attention_mask.sum(1).max()) == g.tokens.shape[1]

    def grads(parts):
        model.zero_grad()
        n = int(batch.target_mask.sum())
        loss = sum(target_loss(model, part, n) for part in parts)
        loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}

    whole_loss, whole = grads([batch])
    group_loss, grouped = grads(groups)
    torch.testing.assert_close(group_loss, whole_loss, atol=1e-6, rtol=1e-5)
    for key in whole:
        torch.testing.assert_close(grouped[key], whole[key], atol=1e-6, rtol=1e-4, msg=key)
    assert length_groups(batch, 1) == [batch] and len(length_groups(batch, 50)) == len(batch)


def test_training_with_length_groups_matches_the_padded_batch(tmp_path):
    """Without dropout, training on length groups reaches the weights of training on the
    padded batch (up to float rounding); the setting is recorded with the run."""
    kw = dict(steps=5, eval_every=5, task_options={"id_lengths": (1, 9), "ood_lengths": (10, 11)})
    a = load_checkpoint(train(small_config(tmp_path / "a", **kw)))
    b = load_checkpoint(train(small_config(tmp_path / "b", length_groups=4, **kw)))
    assert b.meta["train_config"]["length_groups"] == 4
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for key in sa:
        if sa[key].is_floating_point() and not key.endswith("b_K"):
            torch.testing.assert_close(sa[key], sb[key], atol=1e-5, rtol=0, msg=key)
    with pytest.raises(NopeinterpError, match="length_groups=0: must be an integer >= 1"):
        small_config(tmp_path, length_groups=0)


def test_bf16_autocast_trains_with_fp32_master_weights(tmp_path):
    from nopeinterp.training.runtime import Runtime

    rt = Runtime.start("cpu", "bf16")
    with rt.autocast():  # the context the trainer's forward runs in
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    cfg = small_config(
        tmp_path, precision="bf16", steps=300, batch_size=32, lr=3e-3, d_model=64, n_layers=2,
        n_heads=4, eval_every=300, eval_n=50,
    )  # fmt: skip
    ckpt = load_checkpoint(train(cfg))
    assert all(p.dtype == torch.float32 for p in ckpt.model.parameters())
    speed = ckpt.meta["throughput"]
    assert speed["precision"] == "bf16" and speed["tokens_per_s"] > 0 and speed["steps_per_s"] > 0
    assert speed["mfu"] is None  # no known peak FLOP/s for a CPU
    # it learns: an untrained model scores 0; fp32 and bf16 both reached 0.7 when measured
    assert ckpt.meta["val_accuracy"] >= 0.5, ckpt.meta["val_accuracy"]


def test_throughput_formula_and_known_peaks():
    from nopeinterp.training.runtime import PEAK_FLOPS, flops_per_token, peak_flops

    # 6 FLOPs per parameter per token (forward 2, backward 4) plus attention 12*L*d*T
    assert flops_per_token(1000, 2, 8, 10) == 6 * 1000 + 12 * 2 * 8 * 10
    assert PEAK_FLOPS["A100"]["bf16"] == 312e12  # NVIDIA A100 data sheet, dense
    assert peak_flops(torch.device("cpu"), "bf16") is None


# --- how wrong answers fail: by length or by content ------------------------------------------
def test_error_kind_reads_the_answer_length_against_the_target():
    from nopeinterp.evaluation import error_kind
    from nopeinterp.tasks import Example

    task = get_task("copy", **SMALL_COPY)
    ex = Example(prompt="<bos> Copy : a b c =", target="a b c", length=3)
    assert error_kind(task, ex, " a  b c ") == "correct"  # whitespace is not an error
    assert error_kind(task, ex, "a b") == "too short"
    assert error_kind(task, ex, "a b c c") == "too long"
    assert error_kind(task, ex, "a c b") == "wrong words"


def test_evaluate_counts_error_kinds_that_add_up_to_the_wrong_answers(ckpt_dir):
    from nopeinterp.evaluation import ERROR_KINDS

    path = ckpt_dir / "copy-nope.pt"
    plain = evaluate(path, n=6, progress=False)
    result = evaluate(path, n=6, progress=False, error_kinds=True)
    kinds = list(ERROR_KINDS[1:])
    assert not set(kinds) & set(plain.table.columns)  # only when asked
    t = result.table
    assert (t[kinds].sum(axis=1) == t["n"] - t["correct"]).all()
    assert t["correct"].tolist() == plain.table["correct"].tolist()  # the same answers scored
    s = result.summary
    assert (s[kinds].sum(axis=1) + s["accuracy"]).to_numpy() == pytest.approx(1.0)


def test_cli_eval_error_kinds(ckpt_dir, tmp_path, capsys):
    path = ckpt_dir / "copy-nope.pt"
    assert main(["eval", str(path), "--n", "3", "--error-kinds", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "too short" in printed and "wrong words" in printed
    assert "too long" in pd.read_csv(tmp_path / "accuracy_by_length.csv").columns


def test_stop_at_val_finishes_at_the_first_evaluation_that_reaches_it(tmp_path, monkeypatch):
    import nopeinterp.training.trainer as trainer

    calls = []

    def fake_exact_match(model, tokenizer, task, examples):  # 0.5, then 1.0
        calls.append(1)
        return [len(calls) > 1] * len(examples)

    monkeypatch.setattr(trainer, "exact_match", fake_exact_match)
    cfg = small_config(tmp_path, steps=60, eval_every=10, stop_at_val=0.95)
    meta = load_checkpoint(train(cfg)).meta
    assert [h["step"] for h in meta["history"]] == [10, 20]
    assert meta["step"] == 20 and meta["val_accuracy"] == 1.0
    assert not (tmp_path / "m.pt.state.pt").exists()  # finished, not interrupted
    with pytest.raises(NopeinterpError, match="stop_at_val"):
        small_config(tmp_path, stop_at_val=1.5)


def test_stop_val_ends_training_after_enough_evaluations_in_a_row(tmp_path, monkeypatch):
    """`stop_at_val` with `stop_evals`: training ends at the first evaluation that makes
    `stop_evals` in a row at or above it (not at the first one alone), resumed or not; every
    validation is kept."""
    import json

    from nopeinterp.training import trainer

    scripted = iter([0.2, 0.95, 0.5, 1.0, 0.95, 1.0, 1.0, 1.0])  # validation exact match per eval

    def exact_match(model, tokenizer, task, examples):
        k = round(next(scripted) * len(examples))
        return [True] * k + [False] * (len(examples) - k)

    monkeypatch.setattr(trainer, "exact_match", exact_match)
    cfg = small_config(
        tmp_path, eval_every=2, checkpoint_every=2, stop_at_val=0.95, stop_evals=2, stop_after=4
    )
    train(cfg)  # "killed" after 2 evaluations (0.2, 0.95): one at 0.95 is not enough
    assert (tmp_path / "m.pt.state.pt").exists()
    cfg.stop_after, cfg.resume = None, True
    ckpt = load_checkpoint(train(cfg))
    curve = json.loads((tmp_path / "m.pt.history.json").read_text())
    assert [h["step"] for h in curve["history"]] == [2, 4, 6, 8, 10]  # 1.0 then 0.95: stop
    assert [h["val_accuracy"] for h in curve["history"]] == [0.2, 0.95, 0.5, 1.0, 0.95]
    assert curve["stopped_early"] and curve["steps"] == 30
    assert not (tmp_path / "m.pt.state.pt").exists()  # finished
    assert ckpt.meta["step"] == 8 and ckpt.meta["val_accuracy"] == 1.0  # the best one is kept
    with pytest.raises(NopeinterpError, match="stop_at_val"):
        small_config(tmp_path / "x", stop_at_val=1.5)
    with pytest.raises(NopeinterpError, match="stop_evals"):
        small_config(tmp_path / "x", stop_at_val=0.9, stop_evals=0)
    with pytest.raises(NopeinterpError, match="no exact match"):
        small_config(tmp_path / "x", task="lm", task_options={}, stop_at_val=0.9)
