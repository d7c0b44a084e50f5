"""Hand-run benchmarks (``python -m bench [--quick]`` or ``make bench``); never timed tests.

Each module exposes ``run(quick: bool) -> list[dict]`` of summary rows (see bench/_common.py)
and can be run on its own: ``python -m bench.train_step`` etc.
"""

MODULES = (
    "train_step", "decode", "similarity", "probe", "scaling", "paper_1b", "real_size", "lm",
    "length_groups",
)  # fmt: skip
