"""Every bad input of issue 12 (non-trainer part): exit 2, one line on stderr, no traceback.

Each case runs the real command in a subprocess (as a user would); they run concurrently.
"""

import json
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from nopeinterp import build_model, save_checkpoint
from nopeinterp.evaluation import evaluate
from nopeinterp.tasks import task_tokenizer


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_errors")
    out = {}
    for task, pe in (("copy", "nope"), ("copy", "t5"), ("scan", "nope")):
        tok = task_tokenizer(task)
        model = build_model(pe, n_layers=1, n_heads=2, d_model=16, d_vocab=len(tok), n_ctx=64)
        out[f"{task}-{pe}"] = save_checkpoint(
            model, d / f"{task}-{pe}.pt", tokenizer=tok, task=task
        )
    good = out["copy-nope"]
    raw = torch.load(good, weights_only=True)
    torch.save({**raw, "meta": ["not", "a", "dict"]}, d / "meta.pt")
    torch.save({**raw, "config": {**raw["config"], "d_model": "wide"}}, d / "config.pt")
    torch.save({**raw, "tokenizer": 7}, d / "tokenizer.pt")
    (d / "trunc.pt").write_bytes(good.read_bytes()[:100])
    sf = save_checkpoint(
        build_model("nope", n_layers=1, n_heads=2, d_model=16, d_vocab=24, n_ctx=8),
        d / "side.safetensors",
    )
    sf.with_suffix(".json").write_text(json.dumps([1, 2, 3]))
    (d / "afile").write_text("x")
    out["dir"] = d
    return out


def cases(c):
    d, nope, t5, scan = c["dir"], str(c["copy-nope"]), str(c["copy-t5"]), str(c["scan-nope"])
    long_name = str(d / ("x" * 300 + ".pt"))
    return {
        "eval --n 0": (["eval", nope, "--n", "0"], "argument --n: must be >= 1, got 0"),
        "eval --rope-scaling ntk:2": (
            ["eval", nope, "--rope-scaling", "ntk:2"],
            "invalid RoPE scaling 'ntk:2'",
        ),
        "eval --rope-scaling yarn:0.5": (
            ["eval", nope, "--rope-scaling", "yarn:0.5"],
            "FACTOR >= 1",
        ),
        "eval --rope-scaling on a NoPE model": (
            ["eval", nope, "--n", "2", "--lengths", "3", "--rope-scaling", "yarn:2"],
            "rope_scaling needs a rotary layer",
        ),
        "eval --batch-size -1": (
            ["eval", nope, "--n", "2", "--lengths", "3", "--batch-size", "-1"],
            "argument --batch-size: must be >= 1, got -1",
        ),
        "eval --out <existing file>": (
            ["eval", nope, "--out", str(d / "afile")],
            "afile: exists and is not a folder",
        ),
        "eval --out <unwritable folder>": (
            ["eval", nope, "--out", "/proc/nopeinterp-out"],
            "/proc/nopeinterp-out: cannot write a folder in /proc",
        ),
        "eval --out <path under a file>": (
            ["eval", nope, "--out", str(d / "afile" / "sub")],
            "afile is not a folder",
        ),
        "eval --out <over-long name>": (
            ["eval", nope, "--out", str(d / ("y" * 300))],
            "path too long (names up to 255 bytes",
        ),
        "train --out <a folder>": (
            ["train", "--task", "copy", "--pe", "nope", "--out", str(d)],
            "is a folder, give a file path",
        ),
        "info <over-long path>": (
            ["info", long_name],
            "path too long (names up to 255 bytes",
        ),
        "info <missing file>": (
            ["info", str(d / "missing.pt")],
            "missing.pt: no such file or folder",
        ),
        "probe-position --text <missing file>": (
            ["probe-position", nope, "--text", str(d / "missing.txt")],
            "argument --text: ",
        ),
        "compare-attention --nope-prime <missing file>": (
            ["compare-attention", "--nope", nope, "--nope-prime", str(d / "missing.pt")],
            "argument --nope-prime: ",
        ),
        "eval --lengths 1024 (scan)": (
            ["eval", scan, "--n", "1", "--lengths", "1024"],
            "scan: invalid lengths [1024]; this task's lengths are 1-48",
        ),
        "eval --lengths 1-100000": (
            ["eval", nope, "--lengths", "1-100000"],
            "invalid lengths '1-100000': lengths are between 1 and 10000",
        ),
        "probe-position --n-train 1": (
            ["probe-position", nope, "--n-train", "1", "--n-eval", "2"],
            "too few probe-training sequences (n_train=1)",
        ),
        "probe-position --layers -1": (
            ["probe-position", nope, "--layers", "-1"],
            "layers are >= 0",
        ),
        "compare-attention --nope <t5 file>": (
            ["compare-attention", "--nope", t5, "--ref", nope, "--n", "1"],
            "nope must be a NoPE model, got a 't5' model",
        ),
        "compare-attention --nope-prime <t5 file>": (
            ["compare-attention", "--nope", nope, "--nope-prime", t5, "--ref", t5],
            "nope_prime must be a NoPE model, got a 't5' model",
        ),
        "compare-attention --task bogus": (
            ["compare-attention", "--task", "bogus", "--ref", "t5"],
            "unknown task 'bogus'; choose one of copy",
        ),
        "info <sidecar: JSON list>": (
            ["info", str(d / "side.safetensors")],
            "side.json: not a nopeinterp metadata file (a JSON list, not an object)",
        ),
        "info <meta: a list>": (["info", str(d / "meta.pt")], "invalid meta: a list, not a dict"),
        "info <config: d_model a str>": (
            ["info", str(d / "config.pt")],
            "d_model must be a positive integer, got 'wide'",
        ),
        "info <tokenizer: an int>": (
            ["info", str(d / "tokenizer.pt")],
            "invalid tokenizer: a int, not JSON text",
        ),
        "info <truncated>": (
            ["info", str(d / "trunc.pt")],
            "failed reading zip archive: failed finding central directory)",
        ),
    }


def run_cli(argv, cwd):
    return subprocess.run(
        [sys.executable, "-m", "nopeinterp.cli", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_every_bad_input_exits_2_with_one_line(ckpts):
    table = cases(ckpts)
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores: more would only thrash
        procs = dict(
            zip(table, pool.map(lambda c: run_cli(c[0], ckpts["dir"]), table.values()), strict=True)
        )
    failures = []
    for name, proc in procs.items():
        lines = proc.stderr.strip().splitlines()
        print(f"{name} -> {proc.returncode} -> {proc.stderr.strip()}")  # the table (-s)
        ok = proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr
        ok = ok and table[name][1] in lines[0] and "weights_only" not in proc.stderr
        if not ok:
            failures.append((name, proc.returncode, proc.stderr[-600:]))
    assert not failures, failures


def test_scan_skipped_lengths_are_stated_once_in_the_meta(ckpts):
    # SCAN has no held-out command of length 1: stated once, in the result's meta, never as
    # a Python warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = evaluate(ckpts["scan-nope"], lengths=[1, 2, 3], n=2, progress=False)
    assert result.table["length"].tolist() == [2, 3]
    assert result.meta["lengths_without_examples"] == [1]


def test_api_validates_what_a_notebook_passes(ckpts):
    from nopeinterp import load_checkpoint
    from nopeinterp.probing import probe_position
    from nopeinterp.similarity import compare_attention

    for kwargs in ({"n": 0}, {"batch_size": -1}):
        with pytest.raises(ValueError, match="must be >= 1"):
            evaluate(ckpts["copy-nope"], lengths=[3], **{"n": 2, **kwargs})
    ckpt = load_checkpoint(ckpts["copy-nope"])
    with pytest.raises(ValueError, match="n_train must be >= 1"):
        probe_position(ckpt, n_train=0)
    with pytest.raises(ValueError, match="too few probe-training sequences"):
        probe_position(ckpt, n_train=1, n_eval=2, progress=False)
    with pytest.raises(ValueError, match="nope must be a NoPE model"):
        compare_attention(ckpts["copy-t5"], {"nope": ckpts["copy-nope"]}, progress=False)


def test_bad_paths_and_files_are_refused_before_the_heavy_imports(ckpts):
    # A mistyped path fails while the arguments are parsed (no torch); a bad checkpoint file
    # once torch has read it, before TransformerLens (seconds more) is imported.
    d = ckpts["dir"]
    script = (
        "import sys; from nopeinterp.cli import main; "
        "code = main(sys.argv[2:]); "
        "loaded = {m for m in ('torch', 'transformer_lens') if m in sys.modules}; "
        "assert code == 2 and not loaded & set(sys.argv[1].split(',')), (code, loaded)"
    )
    cases = [
        ("torch,transformer_lens", ["eval", str(d / "missing.pt")]),
        ("torch,transformer_lens", ["probe-position", str(ckpts["copy-nope"]), "--text", "no.txt"]),
        ("torch,transformer_lens", ["eval", str(ckpts["copy-nope"]), "--rope-scaling", "ntk:2"]),
        ("torch,transformer_lens", ["eval", str(ckpts["copy-nope"]), "--lengths", "1-100000"]),
        ("torch,transformer_lens", ["train", "--task", "copy", "--pe", "bogus", "--out", "m.pt"]),
        ("torch,transformer_lens", ["sweep", "--tasks", "copy", "--pes", "bogus", "--out", "g"]),
        ("torch,transformer_lens", ["train", "--task", "bogus", "--pe", "nope", "--out", "m.pt"]),
        (
            "torch,transformer_lens",
            ["sweep", "--tasks", "copy", "bogus:n=1", "--pes", "nope", "--out", "g"],
        ),
        ("torch,transformer_lens", ["compare-attention", "--task", "lm", "--ref", "t5"]),
        (
            "transformer_lens",
            ["train", "--task", "addition:scratchpad=xyz", "--pe", "nope", "--out", "m.pt"],
        ),
        ("transformer_lens", ["info", str(d / "trunc.pt")]),
        ("transformer_lens", ["info", str(d / "config.pt")]),
    ]
    for banned, argv in cases:
        proc = subprocess.run(
            [sys.executable, "-c", script, banned, *argv], capture_output=True, text=True, cwd=d
        )
        assert proc.returncode == 0, (argv, proc.stderr[-800:])
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # the one error line
