"""Throughput of attention_divergence vs a plain scipy row loop (a script, not a test).

Two random 4-layer, 4-head, d_model 128 models; 200 sequences of 40 tokens; batch 32.
  ours (end to end): attention_divergence(a, b, tokens) incl. both forward passes
  ours (core):       head_pair_divergence + min over heads on cached patterns
  scipy loop:        for example, layer, head pair, row: jensenshannon(p, q) ** 2, on the
                     same cached patterns, timed on a small subset and extrapolated per example
Prints the median of repeats and the speed-up ratios.

    python -m bench.similarity [--repeats 3] [--scipy-examples 2] [--threads N]
    python -m bench.similarity [--quick]     # the summary rows of `run` (also: python -m bench)

`run(quick)` adds peak RSS at 100 vs 1000 examples, each measured in a fresh subprocess
(`--rss-child N` prints the child's own peak RSS as JSON), so the figure is not polluted by
whatever the parent allocated before; target: flat within 10%.

On a shared, busy machine torch's intra-op threads can make these small kernels much
slower than one thread; compare --threads 1.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.spatial.distance import jensenshannon

from bench._common import cpu_model, median_time
from nopeinterp.models import build_model
from nopeinterp.similarity import attention_divergence, attention_patterns, head_pair_divergence


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


ARCH = dict(n_layers=4, n_heads=4, d_model=128, d_vocab=64, n_ctx=64)
QUICK_ARCH = dict(n_layers=2, n_heads=4, d_model=32, d_vocab=24, n_ctx=16)


def _models_and_tokens(arch, examples, length):
    model_a = build_model("nope", seed=0, **arch)
    model_b = build_model("t5", seed=1, **arch)
    tokens = torch.randint(
        0, arch["d_vocab"], (examples, length), generator=torch.Generator().manual_seed(0)
    )
    return model_a, model_b, tokens


def measure(examples=200, length=40, batch_size=32, repeats=3, scipy_examples=2, arch=ARCH) -> dict:
    """Throughputs (examples/s) of ours end to end, ours core and the scipy row loop."""
    model_a, model_b, tokens = _models_and_tokens(arch, examples, length)
    n = examples
    frame = None

    def run_ours():
        nonlocal frame
        frame = attention_divergence(
            model_a, model_b, tokens, batch_size=batch_size, progress=False
        )

    t_end = median_time(run_ours, repeats, warmup=0)

    layers = list(range(arch["n_layers"]))
    pats_a = attention_patterns(model_a, tokens, layers=layers)
    pats_b = attention_patterns(model_b, tokens, layers=layers)
    valid = torch.ones(tokens.shape, dtype=torch.bool)
    valid[:, 0] = False

    def run_core():
        for layer in layers:
            for s in range(0, n, batch_size):
                sl = slice(s, s + batch_size)
                head_pair_divergence(pats_a[layer][sl], pats_b[layer][sl], valid[sl]).amin((1, 2))

    t_core = median_time(run_core, repeats, warmup=0)

    def run_forwards():  # the two models' pattern captures alone: a floor for end to end
        for s in range(0, n, batch_size):
            attention_patterns(model_a, tokens[s : s + batch_size], layers=layers)
            attention_patterns(model_b, tokens[s : s + batch_size], layers=layers)

    t_fwd = median_time(run_forwards, repeats, warmup=0)

    subset = range(scipy_examples)
    t_scipy = median_time(lambda: scipy_loop(pats_a, pats_b, subset), repeats, warmup=0)
    ref = scipy_loop(pats_a, pats_b, subset)
    ours = frame["value"].to_numpy().reshape(n, -1)[: len(subset)]
    return {
        "n": n,
        "t_end": t_end,
        "t_core": t_core,
        "t_fwd": t_fwd,
        "t_scipy_per_example": t_scipy / len(subset),
        "ex_end": n / t_end,
        "ex_core": n / t_core,
        "ex_scipy": len(subset) / t_scipy,  # extrapolated per example
        "scipy_examples": len(subset),
        "max_err": float(np.abs(ours - ref).max()),
    }


def _rss_child(examples: int, length: int, batch_size: int, quick: bool) -> None:
    """In a fresh process: attention_divergence on `examples` sequences; print peak RSS."""
    import psutil

    arch = QUICK_ARCH if quick else ARCH
    model_a, model_b, tokens = _models_and_tokens(arch, examples, length)
    attention_divergence(
        model_a, model_b, tokens[:batch_size], batch_size=batch_size, progress=False
    )
    before = psutil.Process().memory_info().rss  # after imports, models and one warm-up batch
    frame = attention_divergence(model_a, model_b, tokens, batch_size=batch_size, progress=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"examples": examples, "rows": len(frame), "before": before, "peak": peak}))


def _in_process_peak(examples: int, length: int, batch_size: int) -> int:
    model_a, model_b, tokens = _models_and_tokens(QUICK_ARCH, examples, length)
    attention_divergence(model_a, model_b, tokens, batch_size=batch_size, progress=False)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss(examples: int, length: int, batch_size: int, quick: bool) -> dict:
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "bench.similarity",
        "--rss-child",
        str(examples),
        "--length",
        str(length),
        "--batch-size",
        str(batch_size),
        "--threads",
        str(torch.get_num_threads()),
    ] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    """Summary rows: throughput vs the scipy loop on the same patterns (target >= 50x), end to
    end (no target: bounded by the forward passes), peak RSS 100 vs 1000 examples."""
    from bench._common import row

    if quick:
        m = measure(
            examples=8, length=12, batch_size=4, repeats=1, scipy_examples=1, arch=QUICK_ARCH
        )
        rss_sizes, length, bs = (10, 40), 12, 4
    else:
        m = measure()
        rss_sizes, length, bs = (100, 1000), 40, 32
    shape = f"{m['n']} ex"
    core, end = m["ex_core"] / m["ex_scipy"], m["ex_end"] / m["ex_scipy"]
    ceiling = m["t_scipy_per_example"] / (m["t_fwd"] / m["n"])
    rows = [
        row(
            f"attention divergence on the same cached patterns vs scipy row loop ({shape})",
            m["ex_core"],
            m["ex_scipy"],
            core,
            target=">= 50",
            met=core >= 50,
            unit="examples/s",
            note=(
                "ours: head_pair_divergence + min over head pairs, the computation "
                "attention_divergence runs per batch; scipy: jensenshannon per row, "
                f"{m['scipy_examples']} example(s) extrapolated; max |ours - scipy| "
                f"{m['max_err']:.1e}"
            ),
        ),
        row(
            f"attention_divergence end to end vs scipy row loop ({shape})",
            m["ex_end"],
            m["ex_scipy"],
            end,
            unit="examples/s",
            note=(
                "ours includes both models' forward passes, the scipy loop does not; the two "
                f"forward passes alone run at {m['n'] / m['t_fwd']:.0f} examples/s, so no "
                f"end-to-end ratio can exceed {ceiling:.0f}x here"
            ),
        ),
    ]
    if quick:  # smoke run: in-process (two fresh interpreters would cost ~2x their import)
        small, large = ({"before": 0, "peak": _in_process_peak(n, length, bs)} for n in rss_sizes)
    else:
        small, large = (peak_rss(n, length, bs, quick) for n in rss_sizes)
    ratio = large["peak"] / small["peak"]
    grow_small = max(small["peak"] - small["before"], 0) / 2**20
    grow_large = max(large["peak"] - large["before"], 0) / 2**20
    rows.append(
        row(
            f"attention_divergence peak RSS, {rss_sizes[1]} vs {rss_sizes[0]} examples",
            large["peak"] / 2**20,
            small["peak"] / 2**20,
            ratio,
            target="<= 1.10",
            met=ratio <= 1.10,
            unit="MiB",
            note=(
                "fresh subprocess each (ru_maxrss); growth of the peak above the RSS before the "
                f"timed call: {grow_large:.1f} MiB vs {grow_small:.1f} MiB"
            ),
        )
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scipy-examples", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help="with no other option: run(quick)")
    parser.add_argument("--summary", action="store_true", help="print run()'s summary rows")
    parser.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.rss_child is not None:
        _rss_child(args.rss_child, args.length, args.batch_size, args.quick)
        return

    print(
        f"CPU: {cpu_model()} | os.cpu_count()={os.cpu_count()} | "
        f"torch threads={torch.get_num_threads()} | torch {torch.__version__} | "
        f"load avg {os.getloadavg()[0]:.1f}"
    )
    if args.summary or args.quick:
        from bench._common import print_rows

        print_rows("similarity", run(args.quick))
        return
    arch = ARCH
    print(
        f"{args.examples} examples x {args.length} tokens, batch {args.batch_size}, "
        f"{arch['n_layers']} layers x {arch['n_heads']} heads, d_model {arch['d_model']}"
    )
    m = measure(args.examples, args.length, args.batch_size, args.repeats, args.scipy_examples)
    ex_end, ex_core, ex_scipy = m["ex_end"], m["ex_core"], m["ex_scipy"]
    t_end, t_core = m["t_end"], m["t_core"]
    print(f"ours end-to-end (2 forwards + divergence): {ex_end:10.1f} examples/s  ({t_end:.3f} s)")
    print(
        f"ours core (divergence on cached patterns):  {ex_core:10.1f} examples/s  ({t_core:.3f} s)"
    )
    print(
        f"scipy row loop ({m['scipy_examples']} examples, extrapolated): {ex_scipy:8.2f} examples/s  "
        f"({m['t_scipy_per_example']:.3f} s/example)"
    )
    print(f"the two forward passes alone:       {m['n'] / m['t_fwd']:10.1f} examples/s")
    print(f"speed-up, end-to-end vs scipy loop: {ex_end / ex_scipy:8.0f}x")
    print(f"speed-up, core vs scipy loop:       {ex_core / ex_scipy:8.0f}x")
    print(f"max |ours - scipy| on the subset: {m['max_err']:.2e}")


if __name__ == "__main__":
    main()
