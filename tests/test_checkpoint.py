import os
import pickle
import subprocess
import sys

import pytest
import torch

from nopeinterp import PE_TYPES, CheckpointError, load_checkpoint, save_checkpoint
from nopeinterp.cli import main
from nopeinterp.tasks import build_tokenizer

pytestmark = pytest.mark.tl4


@pytest.fixture
def tokenizer():
    return build_tokenizer("a b c d e".split())


def seq(length=10):
    return torch.randint(0, 8, (2, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("pe", PE_TYPES)
def test_roundtrip_pt(pe, tiny, tokenizer, tmp_path):
    model = tiny(pe)
    path = save_checkpoint(model, tmp_path / "m.pt", tokenizer=tokenizer, task="copy", step=7)
    # plain types and tensors only: the stock weights-only loader reads it
    raw = torch.load(path, weights_only=True)
    assert raw["pe"] == pe and "state_dict" in raw
    ckpt = load_checkpoint(path)
    assert not ckpt.model.training
    assert ckpt.meta["task"] == "copy" and ckpt.meta["step"] == 7 and ckpt.meta["pe"] == pe
    assert ckpt.meta["config"]["d_model"] == model.cfg.d_model
    torch.testing.assert_close(ckpt.model(seq()), model(seq()), rtol=0, atol=0)
    assert ckpt.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert ckpt.model.tokenizer is ckpt.tokenizer


def test_pe_options_survive(tiny, tmp_path):
    model = tiny("t5", num_buckets=8, max_distance=20, shared=False)
    ckpt = load_checkpoint(save_checkpoint(model, tmp_path / "t5.pt"))
    assert ckpt.model.pe_options == {"num_buckets": 8, "max_distance": 20, "shared": False}
    torch.testing.assert_close(ckpt.model(seq()), model(seq()))


def test_roundtrip_safetensors_and_fp16(tiny, tokenizer, tmp_path):
    model = tiny("rotary")
    ckpt = load_checkpoint(save_checkpoint(model, tmp_path / "m.safetensors", tokenizer=tokenizer))
    torch.testing.assert_close(ckpt.model(seq()), model(seq()), rtol=0, atol=0)
    half = save_checkpoint(model, tmp_path / "half.pt", dtype=torch.float16)
    assert torch.load(half, weights_only=True)["state_dict"]["embed.W_E"].dtype == torch.float16
    torch.testing.assert_close(load_checkpoint(half).model(seq()), model(seq()), atol=2e-2, rtol=0)
    assert half.stat().st_size < (tmp_path / "m.safetensors").stat().st_size


def test_meta_must_be_plain(tiny, tmp_path):
    with pytest.raises(TypeError, match="plain"):
        save_checkpoint(tiny("nope"), tmp_path / "m.pt", when=object())
    assert not (tmp_path / "m.pt").exists()


def test_crash_mid_save_leaves_old_file_intact(tiny, tmp_path, monkeypatch):
    path = save_checkpoint(tiny("nope"), tmp_path / "m.pt", step=1)

    def broken_save(obj, f, *a, **k):  # f: the open temporary file
        f.write(b"PK\x03\x04 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tiny("nope"), path, step=2)
    monkeypatch.undo()
    assert load_checkpoint(path).meta["step"] == 1
    assert os.listdir(tmp_path) == ["m.pt"]  # no temporary file left behind


# --- bad inputs -----------------------------------------------------------------------------------
class _Payload:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def make_bad_files(tmp_path, tiny):
    good = save_checkpoint(tiny("nope"), tmp_path / "good.pt")
    data = good.read_bytes()
    files = {
        "missing": (tmp_path / "nope.pt", "no such file"),
        "directory": (tmp_path, "directory"),
        "garbage": (tmp_path / "garbage.pt", "not a readable checkpoint"),
        "truncated": (tmp_path / "truncated.pt", "not a readable checkpoint"),
        "foreign": (tmp_path / "foreign.pt", "not a nopeinterp checkpoint"),
        "unknown_pe": (tmp_path / "unknown_pe.pt", "unknown positional encoding 'xpos'"),
        "mismatch": (tmp_path / "mismatch.pt", r"embed.W_E has shape \(24, 32\).*d_model=48"),
    }
    files["garbage"][0].write_bytes(b"\x00\x01 this is not torch")
    files["truncated"][0].write_bytes(data[: len(data) // 2])
    torch.save({"weights": torch.zeros(3)}, files["foreign"][0])
    raw = torch.load(good, weights_only=True)
    torch.save(
        {**raw, "pe": "xpos", "config": {**raw["config"], "pe": "xpos"}}, files["unknown_pe"][0]
    )
    torch.save({**raw, "config": {**raw["config"], "d_model": 48}}, files["mismatch"][0])
    return files


def test_bad_files_raise_checkpoint_error(tmp_path, tiny):
    for _name, (path, message) in make_bad_files(tmp_path, tiny).items():
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(path)


def test_malicious_pickle_is_refused_not_run(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    with open(
        evil, "wb"
    ) as f:  # a bare pickle, as torch.save(..., _use_new_zipfile_serialization=False)
        pickle.dump({"format": "nopeinterp-checkpoint", "x": _Payload(str(marker))}, f)
    zipped = tmp_path / "evil_zip.pt"
    torch.save({"format": "nopeinterp-checkpoint", "x": _Payload(str(marker))}, zipped)
    marker.unlink(missing_ok=True)  # torch.save itself ran __reduce__? make sure we start clean
    for path in (evil, zipped):
        with pytest.raises(CheckpointError, match="refused"):
            load_checkpoint(path)
        assert not marker.exists()
        # and from the CLI: one line, exit 2, no traceback, still no file
        proc = subprocess.run(
            [sys.executable, "-m", "nopeinterp.cli", "info", str(path)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert "refused" in proc.stderr
        assert not marker.exists()


def test_cli_bad_inputs_one_line_exit_2(tmp_path, tiny, capsys):
    for name, (path, _message) in make_bad_files(tmp_path, tiny).items():
        assert main(["info", str(path)]) == 2, name
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "error" in err, (name, err)


def test_cli_info(tmp_path, tiny, tokenizer, capsys):
    path = save_checkpoint(tiny("t5"), tmp_path / "t5.pt", tokenizer=tokenizer, task="copy")
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "pe:         t5" in out and "num_buckets=32" in out and "task:" in out
    n = sum(p.numel() for p in tiny("t5").parameters())
    assert f"{n:,}" in out


def test_cli_version_and_help():
    for flag in ("--version", "--help"):
        proc = subprocess.run(
            [sys.executable, "-m", "nopeinterp.cli", flag], capture_output=True, text=True
        )
        assert proc.returncode == 0 and "nopeinterp" in proc.stdout


def test_info_aligned_portable_and_real_versions(tmp_path, tiny, tokenizer):
    from importlib.metadata import version

    from nopeinterp import format_checkpoint_info

    machine_path = "/home/someone/runs/copy-t5.pt"
    path = save_checkpoint(
        tiny("t5"),
        tmp_path / "t5.pt",
        tokenizer=tokenizer,
        task="copy",
        train_config={"out": machine_path, "steps": 5},
        files=[machine_path],
    )
    text = format_checkpoint_info(path)
    lines = text.splitlines()
    keys = [line.split(":", 1)[0] for line in lines]
    assert keys[:4] == ["checkpoint", "pe", "parameters", "config"] and "installed" in keys
    # aligned: every value starts in the same column, one past the longest key's colon
    column = max(len(k) for k in keys) + 2
    assert all(line[column - 1] == " " and line[column] != " " for line in lines)
    assert "/home/someone" not in text and "out=copy-t5.pt" in text
    tl = version("transformer-lens")
    recorded = next(line for line in lines if line.startswith("versions:"))
    installed = next(line for line in lines if line.startswith("installed:"))
    assert f"transformer_lens={tl}" in recorded and f"transformer_lens={tl}" in installed
