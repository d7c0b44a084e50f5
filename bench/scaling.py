"""How attention capture and divergence scale with sequence length.

At lengths 32, 64, 128, 256, 512 (random tokens, batch of 8, two random 4-layer 4-head
d_model 128 models, NoPE and T5):
  capture     attention_patterns(model, tokens): one teacher-forced pass caching every
              layer's pattern [B, H, T, T]
  divergence  attention_divergence(nope, t5, tokens): both passes + head-pair JSD + min
Per example: median wall time, and peak memory = the process's peak RSS during the calls
(VmHWM, reset through /proc/self/clear_refs before each length) minus its RSS before them. Each kind runs in a fresh subprocess that goes
through the lengths in increasing order (memory grows with length, so each new peak is
that length's), so neither kind's allocations pollute the other's.
The growth exponent k of y ~ T^k is the least-squares slope of log y on log T (memory: over
the lengths >= 128, where the T^2 pattern term dominates allocator noise). Patterns are T^2
per head, so k ~ 2 is expected for both; the rows' target (<= 2.2) is a sanity check of
that expectation.

    python -m bench.scaling [--quick] [--threads N]
    python -m bench.scaling --outside [--lengths 512,1024,2048]

--outside (long sequences): peak RSS growth of the CLI's `probe-distance --n-eval 1` and
`compare-attention --n 1` on a random 2-layer SmolLM3 with 16 heads (d_model 256), one
random-token sequence per split (ID T, OOD T + 1), in a fresh process: the same command first
runs at 8 tokens (imports, lazy initialisation), then the peak (VmHWM, reset) of the real run
minus the RSS before it.
Target: growth between lengths no worse than one layer's attention for one example
(16 x T^2 float32).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench._common import machine_line, print_rows, row

FULL = dict(lengths=(32, 64, 128, 256, 512), batch=8, repeats=3, n_layers=4, d_model=128)
QUICK = dict(lengths=(8, 16, 32), batch=2, repeats=1, n_layers=1, d_model=32)
KINDS = ("capture", "divergence")
TARGET = 2.2


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) so the next reading is this call's own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _measure(kind: str, cfg: dict) -> list[dict]:
    """In this process: per length, time and peak-RSS growth per example."""
    from nopeinterp.models import build_model
    from nopeinterp.similarity import attention_divergence, attention_patterns

    arch = dict(n_layers=cfg["n_layers"], n_heads=4, d_model=cfg["d_model"], d_vocab=64, n_ctx=64)
    a, b = build_model("nope", seed=0, **arch), build_model("t5", seed=1, **arch)
    B = cfg["batch"]
    g = torch.Generator().manual_seed(0)

    def call(tokens):
        if kind == "capture":
            return attention_patterns(a, tokens)
        return attention_divergence(a, b, tokens, batch_size=B, progress=False)

    call(torch.randint(0, 64, (B, 8), generator=g))  # warm-up: lazy init, code paths
    out = []
    for T in cfg["lengths"]:
        tokens = torch.randint(0, 64, (B, T), generator=g)
        before = _rss()
        reset = _reset_peak()
        peak_before = 0 if reset else _peak()
        times = []
        for _ in range(cfg["repeats"]):
            t0 = time.perf_counter()
            res = call(tokens)
            times.append(time.perf_counter() - t0)
            del res
        peak = _peak()
        # the peak since the reset over the RSS before (without a reset: only a new peak counts)
        grow = max(peak - before, 0) if peak > peak_before else 0
        out.append(
            {
                "kind": kind,
                "length": T,
                "s_per_example": statistics.median(times) / B,
                "bytes_per_example": grow / B,
            }
        )
    return out


def _child(kind: str, quick: bool) -> None:
    print(json.dumps(_measure(kind, QUICK if quick else FULL)))


def measure(kind: str, quick: bool, isolated: bool = True) -> list[dict]:
    if not isolated:
        return _measure(kind, QUICK if quick else FULL)
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "bench.scaling", "--child", kind]
    cmd += ["--threads", str(torch.get_num_threads())] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def exponent(lengths, values) -> float:
    x, y = np.log(np.asarray(lengths, float)), np.asarray(values, float)
    ok = y > 0
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(x[ok], np.log(y[ok]), 1)[0])


def run(quick: bool = False, isolated: bool | None = None) -> list[dict]:
    """Summary rows. `isolated` (default: not quick) measures each kind in a subprocess; the
    quick smoke run measures in-process to stay fast (its memory figures are then rough)."""
    if isolated is None:
        isolated = not quick
    rows = []
    for kind in KINDS:
        res = measure(kind, quick, isolated)
        L = [r["length"] for r in res]
        t = [r["s_per_example"] for r in res]
        m = [r["bytes_per_example"] for r in res]
        big = [i for i, x in enumerate(L) if x >= (128 if not quick else L[0])]
        k_t, k_m = exponent(L, t), exponent([L[i] for i in big], [m[i] for i in big])
        per_len = ", ".join(
            f"T={x}: {ti * 1e3:.2f} ms {mi / 2**20:.2f} MiB"
            for x, ti, mi in zip(L, t, m, strict=True)
        )
        what = "attention capture" if kind == "capture" else "attention divergence"
        rows.append(
            row(
                f"{what} time/example growth exponent, T {L[0]}..{L[-1]}",
                k_t,
                2.0,
                k_t / 2.0,
                target=f"<= {TARGET} (sanity)",
                met=bool(k_t <= TARGET),
                unit="k in T^k",
                note=f"per example: {per_len}",
            )
        )
        rows.append(
            row(
                f"{what} peak memory/example growth exponent, T {L[big[0]]}..{L[-1]}",
                k_m,
                2.0,
                k_m / 2.0,
                target=f"<= {TARGET} (sanity)",
                met=bool(k_m <= TARGET) if k_m == k_m else None,
                unit="k in T^k",
                note=f"at T={L[-1]}: {t[-1] * 1e3:.2f} ms, {m[-1] / 2**20:.2f} MiB per example"
                + ("" if isolated else " (measured in-process)"),
            )
        )
    return rows


OUTSIDE_HEADS = 16
_OUTSIDE_CHILD = """
import json, sys
from bench.scaling import _peak, _reset_peak, _rss
from nopeinterp.cli import main
warm, argv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert main(warm) == 0  # the same command at a few tokens: imports, lazy init, plot code
base = _rss()
reset = _reset_peak()
code = main(argv)
print(base // 1024, _peak() // 1024, code, int(reset))
"""


def outside_rss(lengths=(512, 1024, 2048)) -> list[dict]:
    """Peak RSS growth (KiB) of probe-distance / compare-attention on a 16-head outside model."""
    import tempfile

    import transformers as tf

    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = tf.SmolLM3Config(vocab_size=512, hidden_size=256, num_attention_heads=OUTSIDE_HEADS,
                               num_key_value_heads=4, num_hidden_layers=2, intermediate_size=512,
                               no_rope_layers=[1, 0], max_position_embeddings=4096,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
        torch.manual_seed(0)
        tf.SmolLM3ForCausalLM(cfg).save_pretrained(tmp)
        for T in lengths:
            for kind, argv in (
                ("probe-distance", ["probe-distance", "--hf", tmp, "--n-eval", "1"]),
                ("compare-attention",
                 ["compare-attention", "--nope-hf", tmp, "--ref-hf", tmp, "--n", "1"]),
            ):  # fmt: skip
                out_dir = ["--out", str(Path(tmp) / f"out-{kind}-{T}")]
                warm = ["-q", *argv, "--id-lengths", "8", "--ood-lengths", "9", *out_dir]
                real = ["-q", *argv, "--id-lengths", f"{T}", "--ood-lengths", f"{T + 1}", *out_dir]
                t0 = time.perf_counter()
                res = subprocess.run([sys.executable, "-c", _OUTSIDE_CHILD, json.dumps(warm),
                                      json.dumps(real)], env=env, cwd=root, capture_output=True,
                                     text=True)  # fmt: skip
                if res.returncode != 0:
                    raise RuntimeError(res.stderr[-2000:])
                base, peak, code, reset = (
                    int(x) for x in res.stdout.strip().splitlines()[-1].split()
                )
                if not reset:
                    raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs)")
                one_layer = OUTSIDE_HEADS * T * T * 4 / 1024  # KiB
                out.append(dict(kind=kind, length=T, peak_kib=peak, growth_kib=peak - base,
                                one_layer_attention_kib=one_layer,
                                seconds=time.perf_counter() - t0))  # fmt: skip
    return out


def outside_summary(records: list[dict]) -> list[dict]:
    """Per kind and pair of consecutive lengths: how much the peak RSS grew against how much
    one layer's attention for one example grew (the target: ratio <= 1, memory grows no faster
    than one layer's attention)."""
    out = []
    for kind in dict.fromkeys(r["kind"] for r in records):
        rs = sorted((r for r in records if r["kind"] == kind), key=lambda r: r["length"])
        for a, b in zip(rs, rs[1:], strict=False):
            grew = (b["growth_kib"] - a["growth_kib"]) / 1024
            layer = (b["one_layer_attention_kib"] - a["one_layer_attention_kib"]) / 1024
            out.append(
                row(
                    f"{kind} peak RSS growth, T {a['length']} -> {b['length']}",
                    grew,
                    layer,
                    grew / layer,
                    target="<= 1 (one layer's attention, one example)",
                    met=grew <= layer,
                    unit="MiB",
                    note=f"peak at T={b['length']} over the RSS after a warm-up run: "
                    f"{b['growth_kib'] / 1024:.0f} MiB; one layer's attention "
                    f"{b['one_layer_attention_kib'] / 1024:.0f} MiB",
                )
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--child", choices=KINDS, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--outside", action="store_true", help="peak RSS of the CLI on a 16-head Hugging Face model"
    )
    parser.add_argument("--lengths", default="512,1024,2048")
    args = parser.parse_args()
    if args.outside:
        print(machine_line())
        rows = outside_rss(tuple(int(x) for x in args.lengths.split(",")))
        for r in rows:
            print(json.dumps(r))
        print_rows("outside model peak RSS", outside_summary(rows))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        _child(args.child, args.quick)
        return
    print(machine_line())
    print_rows("scaling", run(args.quick))


if __name__ == "__main__":
    main()
