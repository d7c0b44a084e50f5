"""Redraw the key figures (HTML + PNG) from the tables already in analyses/results/.

    python analyses/figures.py [--out analyses/results]

Computes nothing: each figure is drawn by its own script's figure function from the CSV that
script wrote, so the figures follow the committed (3-seed) tables without re-running the
analyses (which need the seeds in runs/seeds). REPORT.md shows these PNGs. Running a script
itself (e.g. `python analyses/position_probes.py`) writes the same figures beside its tables.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import pandas as pd
from _common import RESULTS, print_written, run_script, write_figure

# figure name -> (script, its figure function, the CSV it draws from)
FIGURES = {
    "length_generalization": ("length_generalization", "figure", "length_generalization_by_length"),
    "position_probes": ("position_probes", "figure", "position_probes"),
    "distance_dependence": ("distance_dependence", "score_figure", "distance_dependence_tidy"),
}


def main(argv=None) -> list[Path]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS), help="where the CSV tables are")
    p.add_argument("--out", default=None, help="where to write the figures (default: --results)")
    args = p.parse_args(argv)
    results = Path(args.results)
    out = Path(args.out or results)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    paths = []
    for name, (script, function, table) in FIGURES.items():
        draw = getattr(importlib.import_module(script), function)
        paths += write_figure(draw(pd.read_csv(results / f"{table}.csv")), out, name, scale=1)
    print_written(paths)
    return paths


if __name__ == "__main__":
    run_script(main)
