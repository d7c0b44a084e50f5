"""Smoke test of the hand-run benchmarks: each `bench.<module>.run(quick=True)` at a tiny size
returns summary rows with the expected keys. No timing is asserted (benchmarks are scripts).
"""

import importlib
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import MODULES  # noqa: E402
from bench._common import ROW_KEYS, format_table  # noqa: E402


def check_rows(rows):
    assert isinstance(rows, list) and rows
    for r in rows:
        assert set(ROW_KEYS) <= set(r), r
        assert isinstance(r["figure"], str) and r["figure"]
        assert r["met"] in (True, False, None)
        for key in ("ours", "baseline", "ratio"):
            assert r[key] is None or isinstance(r[key], int | float)
        if r["met"] is not None:
            assert r["ratio"] is not None and not math.isnan(r["ratio"])
    assert format_table(rows)  # the summary table renders


@pytest.mark.parametrize("name", [m for m in MODULES if m != "probe"])
def test_bench_quick(name):
    mod = importlib.import_module(f"bench.{name}")
    check_rows(mod.run(quick=True))


def test_bench_probe_quick():
    pytest.importorskip("sklearn")  # the bench extra; CI does not install it
    mod = importlib.import_module("bench.probe")
    check_rows(mod.run(quick=True))


def test_outside_rss_quick():
    """bench.scaling --outside end to end at two short lengths (its child processes run the
    real CLI), and its summary rows: growth between lengths against one layer's attention."""
    scaling = importlib.import_module("bench.scaling")
    records = scaling.outside_rss((16, 32))
    assert [(r["kind"], r["length"]) for r in records] == [
        ("probe-distance", 16), ("compare-attention", 16),
        ("probe-distance", 32), ("compare-attention", 32),
    ]  # fmt: skip
    rows = scaling.outside_summary(records)
    check_rows(rows)
    first = rows[0]
    grew = (records[2]["growth_kib"] - records[0]["growth_kib"]) / 1024
    assert first["ours"] == pytest.approx(grew)
    assert first["baseline"] == pytest.approx(16 * (32**2 - 16**2) * 4 / 2**20)
