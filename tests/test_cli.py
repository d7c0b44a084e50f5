"""The analysis subcommands, end to end on tiny untrained checkpoints (fast)."""

import pytest

from nopeinterp import build_model, load_checkpoint, save_checkpoint
from nopeinterp.cli import main
from nopeinterp.tasks import get_task, task_tokenizer

TASK_OPTIONS = {"id_lengths": [2, 4], "ood_lengths": [5, 6]}


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpts")
    task = get_task("copy", **TASK_OPTIONS)
    tok = task_tokenizer(task)
    for name, pe, seed in [
        ("nope", "nope", 0),
        ("nope-seed1", "nope", 1),
        ("t5", "t5", 0),
        ("alibi", "alibi", 0),
        ("ape", "ape", 0),
    ]:
        n_ctx = 12 if pe == "ape" else 64  # ID sequences fit in 12 tokens, OOD ones do not
        model = build_model(
            pe,
            n_layers=2,
            n_heads=2,
            d_model=32,
            d_vocab=len(tok),
            n_ctx=n_ctx,
            seed=seed,
            tokenizer=tok,
        )
        save_checkpoint(
            model, directory / f"copy-{name}.pt", task="copy", task_options=TASK_OPTIONS, seed=seed
        )
    return directory


def test_probe_position_file_and_directory(ckpt_dir, tmp_path, capsys):
    assert (
        main(
            [
                "probe-position",
                str(ckpt_dir / "copy-nope.pt"),
                "--n-train",
                "64",
                "--n-eval",
                "32",
                "--out",
                str(tmp_path / "one"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ID r2" in out and "random_init" in out
    assert (tmp_path / "one" / "probe_position.csv").exists()
    assert (
        main(
            [
                "probe-position",
                str(ckpt_dir),
                "--layers",
                "0,2",
                "--n-train",
                "32",
                "--n-eval",
                "16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "copy-t5" in out and "copy-alibi" in out


def test_probe_distance(ckpt_dir, tmp_path, capsys):
    assert main(["probe-distance", str(ckpt_dir / "copy-alibi.pt"), "--out", str(tmp_path)]) == 0
    assert "head 0" in capsys.readouterr().out
    assert (tmp_path / "distance.html").exists()


def test_compare_attention_ref_names_all_and_errors(ckpt_dir, tmp_path, capsys):
    base = ["compare-attention", "--checkpoints", str(ckpt_dir), "--n-per-length", "2"]
    assert main([*base, "--ref", "t5", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "t5" in out and "nope_prime" in out  # NoPE-prime found beside NoPE
    assert (tmp_path / "r" / "attention_similarity.html").exists()
    assert main([*base, "--ref", "all", "--heads", "hungarian"]) == 0
    out = capsys.readouterr().out
    for ref in ("t5", "alibi", "ape"):
        assert ref in out
    assert main([*base, "--ref", "rotary"]) == 2
    err = capsys.readouterr().err
    assert "unknown reference 'rotary'" in err and "references for copy" in err and "t5" in err
    assert len(err.strip().splitlines()) == 1


def test_compare_attention_rejects_other_task(ckpt_dir, tmp_path, capsys):
    ckpt = load_checkpoint(ckpt_dir / "copy-t5.pt")
    other = tmp_path / "rev.pt"
    save_checkpoint(ckpt.model, other, task="reverse", task_options=TASK_OPTIONS)
    args = [
        "compare-attention",
        "--checkpoints",
        str(ckpt_dir),
        "--ref",
        str(other),
        "--n-per-length",
        "2",
    ]
    assert main(args) == 2
    assert "task" in capsys.readouterr().err


def test_main_job_report(ckpt_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert (
        main(
            [
                "report",
                "--checkpoints",
                str(ckpt_dir),
                "--out",
                str(out),
                "--n",
                "2",
                "--n-attention",
                "1",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert (
        "Length generalization" in printed
        and "Position probes" in printed
        and "Attention divergence" in printed
    )
    assert f"reports written to {out}" in printed
    assert (out / "attention_similarity_copy" / "attention_similarity.html").exists()
    assert (out / "length_generalization" / "accuracy.html").exists()
    assert main(["report", "--checkpoints", str(tmp_path / "empty"), "--out", str(out)]) == 2
