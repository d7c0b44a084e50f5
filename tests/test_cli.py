"""The analysis subcommands, end to end on tiny untrained checkpoints (fast)."""

from conftest import TASK_OPTIONS

from nopeinterp import load_checkpoint, save_checkpoint
from nopeinterp.cli import main


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
        and "Distance dependence" in printed
        and "Attention divergence" in printed
    )
    index = out / "index.html"
    assert f"report written to {index}" in printed
    page = index.read_text(encoding="utf-8")
    for title in (
        "Length generalization (claim 1)",
        "Theorem 1: absolute position in NoPE",
        "Theorem 2: relative distance in later layers",
        "Attention similarity: what NoPE learns (claim 4)",
        "Attention explorer",
        "Heads: what dominates each head",
    ):
        assert f"<h2>{title}</h2>" in page
    assert page.count("class='verdict'") == 6
    assert "Head taxonomy" in printed
    # the tables behind the page, as data; one HTML file (the page), not one per analysis
    assert (out / "attention_similarity_copy" / "attention_similarity_ranking.csv").exists()
    assert (out / "length_generalization" / "accuracy_by_length.csv").exists()
    assert (out / "distance_dependence" / "copy-t5" / "distance.csv").exists()
    assert sorted(p.name for p in out.rglob("*.html")) == ["index.html"]
    assert main(["report", "--checkpoints", str(tmp_path / "empty"), "--out", str(out)]) == 2


def _one_line_exit_2(proc):
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "error" in proc.stderr


def test_erase_position_cli(ckpt_dir, tmp_path, cli):
    proc = cli(
        "erase-position", str(ckpt_dir / "copy-nope.pt"), "--layers", "1,2",
        "--n-train", "40", "--n-eval", "8", "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "r2 leace ID" in proc.stdout and "exact_match random OOD" in proc.stdout
    import pandas as pd

    t = pd.read_csv(tmp_path / "erase_position.csv")
    assert set(t.layer) == {1, 2} and set(t.condition) == {"none", "leace", "random"}
    assert {"exact_match", "target_loss", "r2"} <= set(t.metric)
    assert (tmp_path / "erase_position.html").exists()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    _one_line_exit_2(cli("erase-position", str(bad)))
    _one_line_exit_2(cli("erase-position", str(ckpt_dir / "copy-nope.pt"), "--layers", "9"))


def test_heads_cli(ckpt_dir, tmp_path, cli):
    proc = cli("heads", str(ckpt_dir), "--n-eval", "8", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "copy-t5" in proc.stdout and "copy-ape" in proc.stdout
    assert "entropy_slope" in proc.stdout and "H1" in proc.stdout
    for name in ("attention_sinks.csv", "attention_sinks_dilution.csv", "heads.csv", "heads.html"):
        assert (tmp_path / "copy-alibi" / name).exists(), name
    import pandas as pd

    labels = pd.read_csv(tmp_path / "copy-nope" / "heads.csv").label
    assert len(labels) == 2 * 2 * 2  # ID and OOD, 2 layers x 2 heads
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    _one_line_exit_2(cli("heads", str(bad)))


def test_rope_scaling_flag_is_the_python_api(tmp_path, capsys):
    """--rope-scaling TYPE:FACTOR on eval and the analyses = load_checkpoint(rope_scaling=)."""
    import pandas as pd

    from nopeinterp import build_model
    from nopeinterp.probing import distance_dependence
    from nopeinterp.tasks import get_task, task_tokenizer

    tok = task_tokenizer(get_task("copy", **TASK_OPTIONS))
    model = build_model(
        "rotary", n_layers=1, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=8, tokenizer=tok
    )
    path = save_checkpoint(model, tmp_path / "rot.pt", task="copy", task_options=TASK_OPTIONS)
    scaling = {"rope_type": "yarn", "factor": 4.0}
    argv = ["probe-distance", str(path), "--n-eval", "4", "--rope-scaling", "yarn:4"]
    assert main([*argv, "--out", str(tmp_path / "scaled")]) == 0
    assert main(argv[:-2] + ["--out", str(tmp_path / "plain")]) == 0
    scaled = pd.read_csv(tmp_path / "scaled" / "distance.csv")
    plain = pd.read_csv(tmp_path / "plain" / "distance.csv")
    want = distance_dependence(
        load_checkpoint(path, rope_scaling=scaling), n_eval=4, progress=False
    ).table
    pd.testing.assert_series_equal(scaled["score"], want["score"], check_names=False)
    assert not scaled["score"].equals(plain["score"])  # the scaling reached the model
    assert (
        main(["eval", str(path), "--n", "2", "--lengths", "3", "--rope-scaling", "linear:2"]) == 0
    )
    capsys.readouterr()
