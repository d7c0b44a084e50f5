"""The shipped reference checkpoints agree with their README: `checkpoints/README.md`'s ID / OOD
exact match is what `nopeinterp eval FILE --n N` reports (N as the README states). Three of the
fourteen files, one per kind of row (NoPE, a biased PE on SCAN, learned APE with lengths it
cannot read), to keep the suite fast; analyses/checkpoint_table.py regenerates all of them.
"""

import re
from pathlib import Path

import pandas as pd
import pytest

from nopeinterp.cli import main

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
README = CHECKPOINTS / "README.md"


def readme_rows() -> tuple[int, dict[str, dict[str, str]]]:
    text = README.read_text()
    n = int(re.search(r"nopeinterp eval FILE --n (\d+)", text)[1])
    table = [line for line in text.splitlines() if line.startswith("| ")]
    header, *lines = ([c.strip() for c in line.strip().strip("|").split("|")] for line in table)
    return n, {cells[0]: dict(zip(header, cells, strict=True)) for cells in lines}


def test_readme_lists_every_shipped_checkpoint():
    _, rows = readme_rows()
    shipped = {p.name for p in CHECKPOINTS.glob("*.pt") if not p.name.endswith(".state.pt")}
    assert set(rows) == shipped and len(shipped) == 14


@pytest.mark.parametrize("name", ["copy-nope.pt", "scan-t5.pt", "copy-ape.pt"])
def test_readme_figures_match_nopeinterp_eval(name, tmp_path, capsys):
    n, rows = readme_rows()
    assert main(["eval", str(CHECKPOINTS / name), "--n", str(n), "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    summary = pd.read_csv(tmp_path / "accuracy_summary.csv").set_index("split")
    row = rows[name]
    assert f"{summary.loc['ID', 'accuracy']:.3f}" == row["ID exact match"]
    assert f"{summary.loc['OOD', 'accuracy']:.3f}" == row["OOD exact match"]
    not_evaluable = int(summary.loc["OOD", "lengths_not_evaluable"])
    assert str(not_evaluable) == row["OOD lengths not evaluable"]
