import os
import stat

import pytest
import torch

from nopeinterp import NopeinterpError, save_checkpoint
from nopeinterp._io import OutputError, atomic_write, atomic_write_text, versions
from nopeinterp.viz import html


@pytest.fixture
def umask():
    """Set the process umask for one test, restoring it afterwards."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002, 0o027])
def test_written_files_get_the_umask_permissions(umask, mask, tmp_path, tiny):
    umask(mask)
    expected = 0o666 & ~mask  # what open(path, "w") gives
    reference = tmp_path / "reference.txt"
    reference.write_text("x")
    assert mode(reference) == expected
    assert mode(atomic_write_text(tmp_path / "a.csv", "x")) == expected
    assert mode(html.atomic_write_text(tmp_path / "b.html", "x")) == expected
    assert mode(save_checkpoint(tiny("nope"), tmp_path / "m.pt")) == expected
    assert mode(save_checkpoint(tiny("nope"), tmp_path / "m.safetensors")) == expected
    assert mode(tmp_path / "m.json") == expected
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_viz_html_reexports_the_one_atomic_write():
    assert html.atomic_write_text is atomic_write_text


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path):
    path = atomic_write_text(tmp_path / "out.txt", "old")

    def broken(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        atomic_write(path, broken)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_unwritable_folder_is_an_output_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(OutputError, match=r"ro/x\.csv: cannot write \(Permission denied\)"):
        atomic_write_text(ro / "x.csv", "x")


def test_bad_destinations_are_output_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = {
        tmp_path / "file" / "x.csv": "Not a directory",
        tmp_path / ("n" * 300 + ".csv"): "File name too long",
    }
    for path, reason in cases.items():
        with pytest.raises(OutputError, match=f"cannot write \\({reason}") as e:
            atomic_write_text(path, "x")
        assert isinstance(e.value, NopeinterpError) and isinstance(e.value, OSError)
    (tmp_path / "folder").mkdir()
    with pytest.raises(OutputError, match="folder: cannot write"):
        atomic_write_text(tmp_path / "folder", "x")  # a folder where the file should go


def test_versions_are_the_installed_ones():
    from importlib.metadata import version

    v = versions()
    assert v["transformer_lens"] == version("transformer-lens") != "unknown"
    assert v["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert set(v) == {"nopeinterp", "python", "torch", "transformer_lens"}
