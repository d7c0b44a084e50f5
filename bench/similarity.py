"""Throughput of attention_divergence vs a plain scipy row loop (a script, not a test).

Two random 4-layer, 4-head, d_model 128 models; 200 sequences of 40 tokens; batch 32.
  ours (end to end): attention_divergence(a, b, tokens) incl. both forward passes
  ours (core):       head_pair_divergence + min over heads on cached patterns
  scipy loop:        for example, layer, head pair, row: jensenshannon(p, q) ** 2, on the
                     same cached patterns, timed on a small subset and extrapolated per example
Prints the median of repeats and the speed-up ratios.

    python bench/similarity.py [--repeats 3] [--scipy-examples 2] [--threads N]

On a shared, busy machine torch's intra-op threads can make these small kernels much
slower than one thread; compare --threads 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
import torch
from scipy.spatial.distance import jensenshannon

from nopeinterp.models import build_model
from nopeinterp.similarity import attention_divergence, attention_patterns, head_pair_divergence


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def scipy_loop(pats_a: dict, pats_b: dict, examples: range) -> np.ndarray:
    """The straightforward version: every example, layer, head pair and row in Python."""
    out = []
    for e in examples:
        per_layer = []
        for layer in pats_a:
            pa, pb = pats_a[layer][e].double().numpy(), pats_b[layer][e].double().numpy()
            best = np.inf
            for i in range(pa.shape[0]):
                for j in range(pb.shape[0]):
                    rows = [
                        jensenshannon(pa[i, t, : t + 1], pb[j, t, : t + 1]) ** 2
                        for t in range(1, pa.shape[1])
                    ]
                    best = min(best, float(np.mean(rows)))
            per_layer.append(best)
        out.append(per_layer)
    return np.array(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scipy-examples", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    print(
        f"CPU: {cpu_model()} | os.cpu_count()={os.cpu_count()} | "
        f"torch threads={torch.get_num_threads()} | torch {torch.__version__} | "
        f"load avg {os.getloadavg()[0]:.1f}"
    )
    arch = dict(n_layers=4, n_heads=4, d_model=128, d_vocab=64, n_ctx=64)
    model_a = build_model("nope", seed=0, **arch)
    model_b = build_model("t5", seed=1, **arch)
    tokens = torch.randint(
        0, arch["d_vocab"], (args.examples, args.length), generator=torch.Generator().manual_seed(0)
    )
    n = args.examples
    print(
        f"{n} examples x {args.length} tokens, batch {args.batch_size}, "
        f"{arch['n_layers']} layers x {arch['n_heads']} heads, d_model {arch['d_model']}"
    )

    frame = None

    def run_ours():
        nonlocal frame
        frame = attention_divergence(
            model_a, model_b, tokens, batch_size=args.batch_size, progress=False
        )

    t_end = median_time(run_ours, args.repeats)

    layers = list(range(arch["n_layers"]))
    pats_a = attention_patterns(model_a, tokens, layers=layers)
    pats_b = attention_patterns(model_b, tokens, layers=layers)
    valid = torch.ones(tokens.shape, dtype=torch.bool)
    valid[:, 0] = False

    def run_core():
        for layer in layers:
            for s in range(0, n, args.batch_size):
                sl = slice(s, s + args.batch_size)
                head_pair_divergence(pats_a[layer][sl], pats_b[layer][sl], valid[sl]).amin((1, 2))

    t_core = median_time(run_core, args.repeats)

    subset = range(args.scipy_examples)
    t_scipy = median_time(lambda: scipy_loop(pats_a, pats_b, subset), args.repeats)
    ref = scipy_loop(pats_a, pats_b, subset)
    ours = frame["value"].to_numpy().reshape(n, -1)[: len(subset)]
    max_err = float(np.abs(ours - ref).max())

    ex_end, ex_core = n / t_end, n / t_core
    ex_scipy = len(subset) / t_scipy  # extrapolated per example
    print(f"ours end-to-end (2 forwards + divergence): {ex_end:10.1f} examples/s  ({t_end:.3f} s)")
    print(
        f"ours core (divergence on cached patterns):  {ex_core:10.1f} examples/s  ({t_core:.3f} s)"
    )
    print(
        f"scipy row loop ({len(subset)} examples, extrapolated): {ex_scipy:8.2f} examples/s  "
        f"({t_scipy / len(subset):.3f} s/example)"
    )
    print(f"speed-up, end-to-end vs scipy loop: {ex_end / ex_scipy:8.0f}x")
    print(f"speed-up, core vs scipy loop:       {ex_core / ex_scipy:8.0f}x")
    print(f"max |ours - scipy| on the subset: {max_err:.2e}")


if __name__ == "__main__":
    main()
