"""Compare regenerated analysis tables with committed ones, on their common rows.

    python analyses/compare_tables.py NEW_RESULTS_DIR analyses/results

For each committed CSV: rows are matched on every non-float column (and, where those do not
name a row, on the float columns whose values are the same set on both sides, such as bin
edges), and each float column's largest absolute difference over the matched rows is printed
when it exceeds 1e-6 (used to check that a refactoring leaves the numbers alone).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from nopeinterp.errors import NopeinterpError


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("new_dir", type=Path, help="the regenerated tables")
    p.add_argument("old_dir", type=Path, help="the committed tables (analyses/results)")
    args = p.parse_args(argv)
    new_dir, old_dir = args.new_dir, args.old_dir
    for d in (new_dir, old_dir):
        if not d.is_dir():
            raise NopeinterpError(f"{d}: not a folder")
    for old_path in sorted(old_dir.glob("*.csv")):
        new_path = new_dir / old_path.name
        if not new_path.exists():
            print(f"{old_path.name}: not regenerated")
            continue
        old, new = pd.read_csv(old_path), pd.read_csv(new_path)
        floats = [
            c for c in old.columns if c in new.columns and pd.api.types.is_float_dtype(old[c])
        ]
        keys = [c for c in old.columns if c in new.columns and c not in floats]
        if old.duplicated(keys).any():  # float coordinates (bin edges) name rows too
            same = [c for c in floats if set(old[c].dropna()) == set(new[c].dropna())]
            keys, floats = keys + same, [c for c in floats if c not in same]
        m = old.merge(new, on=keys, how="inner", suffixes=("_old", "_new"))
        diffs = {}
        for c in floats:
            a, b = m[f"{c}_old"].to_numpy(float), m[f"{c}_new"].to_numpy(float)
            both_nan = np.isnan(a) & np.isnan(b)
            with np.errstate(invalid="ignore"):
                d = np.where(both_nan | (a == b), 0.0, np.abs(a - b))  # inf == inf too
            d = np.nan_to_num(d, nan=np.inf)
            if len(d) and d.max() > 1e-6:
                diffs[c] = (float(d.max()), int((d > 1e-6).sum()))
        extra_cols = sorted(set(new.columns) ^ set(old.columns))
        print(
            f"{old_path.name}: old {len(old)} rows, new {len(new)}, matched {len(m)} on {keys[:6]}"
            + (f"; columns differ {extra_cols}" if extra_cols else "")
            + ("; all floats equal to 1e-6" if not diffs else f"; DIFF {diffs}")
        )


if __name__ == "__main__":
    from _common import run_script

    run_script(main)
