"""The paper's 1B code LMs on this machine: can the position analyses run on one of them?

A random model of the 1B shape (`McGill-NLP/codellm_1b_*`: 24 layers, d_model 1024, 32 heads
of 128, d_ff 16384, vocabulary 49152, context 1024), written as a custom_decoder_only_t5
directory in bfloat16 (the official parameter names, T5's unused cross-attention included, T5's
initialisation scales) and opened through the CLI's `--hf` as the real ones would be:

    nopeinterp probe-position --hf DIR --id-lengths 1023-1023 --ood-lengths 1024-1024 \
        --n-train N_TRAIN --n-eval N_EVAL
    nopeinterp probe-distance --hf DIR --id-lengths 1023-1023 --ood-lengths 1024-1024 --n-eval 4

Each command runs in its own process, one torch thread; the figures are its wall time and its
peak RSS (the child's VmHWM, `bench._common.peak_rss_kib`), beside the bytes of the weights file. Informational rows:
no target (the question is whether it fits, and in how long).

    python -m bench.paper_1b [--quick] [--n-train 8] [--n-eval 4] [--pe rotary] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench._common import machine_line, peak_rss_kib, print_rows, row

FULL = dict(n_layers=24, d_model=1024, n_heads=32, d_kv=128, d_ff=16384, vocab=49152, ctx=1024)
QUICK = dict(n_layers=2, d_model=32, n_heads=2, d_kv=16, d_ff=64, vocab=64, ctx=64)


def write_random_codellm(path: Path, shape: dict, pe: str = "rotary", seed: int = 0) -> int:
    """A custom_decoder_only_t5 directory with random bfloat16 weights; returns its bytes."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    d, h, k, f = shape["d_model"], shape["n_heads"], shape["d_kv"], shape["d_ff"]
    inner = h * k

    def w(rows, cols, std):
        return (torch.randn(rows, cols, generator=g) * std).to(torch.bfloat16)

    state = {"shared.weight": w(shape["vocab"], d, 1.0)}
    for i in range(shape["n_layers"]):
        b = f"decoder.block.{i}.layer"
        for j, name in ((0, "SelfAttention"), (1, "EncDecAttention")):
            state[f"{b}.{j}.{name}.q.weight"] = w(inner, d, (d * k) ** -0.5)
            state[f"{b}.{j}.{name}.k.weight"] = w(inner, d, d**-0.5)
            state[f"{b}.{j}.{name}.v.weight"] = w(inner, d, d**-0.5)
            state[f"{b}.{j}.{name}.o.weight"] = w(d, inner, inner**-0.5)
            state[f"{b}.{j}.layer_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        state[f"{b}.2.DenseReluDense.wi.weight"] = w(f, d, d**-0.5)
        state[f"{b}.2.DenseReluDense.wo.weight"] = w(d, f, f**-0.5)
        state[f"{b}.2.layer_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
    state["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = w(32, h, 0.1)
    state["decoder.final_layer_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"))
    config = {
        "architectures": ["CustomDecoderOnlyT5"],
        "model_type": "custom_decoder_only_t5",
        "position_encoding_type": pe,
        "d_model": d,
        "d_kv": k,
        "num_heads": h,
        "num_layers": shape["n_layers"],
        "d_ff": f,
        "feed_forward_proj": "relu",
        "n_positions": shape["ctx"],
        "vocab_size": shape["vocab"],
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "bos_token_id": 0,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(config))
    return (path / "model.safetensors").stat().st_size


def run_cli(args: list[str], in_process: bool = False) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of `nopeinterp ARGS`: a child process of its own, one
    torch thread (`in_process`: here, for the quick smoke run; RSS then is this process's)."""
    if in_process:
        from nopeinterp.cli import main

        t0 = time.perf_counter()
        if main(["--quiet", *args]) != 0:
            raise RuntimeError(f"nopeinterp {' '.join(args)} failed")
        return time.perf_counter() - t0, peak_rss_kib() / 1024
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    code = (
        "import resource, sys, torch; torch.set_num_threads(1); from nopeinterp.cli import main; "
    )
    code += "rc = main(sys.argv[1:]); "
    code += "from bench._common import peak_rss_kib; print('peak_rss_kib', peak_rss_kib(), flush=True); "
    code += "sys.exit(rc)"
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, "--quiet", *args], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"nopeinterp {' '.join(args)}: exit {done.returncode}: {done.stderr}")
    lines = done.stdout.strip().splitlines()
    rss = next(int(x.split()[1]) for x in lines if x.startswith("peak_rss_kib"))
    return wall, rss / 1024


COMMANDS = ("probe-position", "probe-distance")


def run(
    quick: bool = False,
    n_train: int = 8,
    n_eval: int = 4,
    pe: str = "rotary",
    root=None,
    commands=COMMANDS,
):
    shape = QUICK if quick else FULL
    T = shape["ctx"]
    lengths = ["--id-lengths", f"{T - 1}-{T - 1}", "--ood-lengths", f"{T}-{T}"]
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        directory = Path(tmp) / f"codellm_{pe}"
        t0 = time.perf_counter()
        size = write_random_codellm(directory, shape, pe)
        written = time.perf_counter() - t0
        print(f"[paper_1b] wrote {size / 2**30:.2f} GiB of weights in {written:.0f} s", flush=True)
        position = ["probe-position", "--hf", str(directory), *lengths]
        position += ["--n-train", str(n_train), "--n-eval", str(n_eval)]
        distance = ["probe-distance", "--hf", str(directory), *lengths, "--n-eval", "4"]
        rows = []
        for name, args in (("probe-position", position), ("probe-distance", distance)):
            if name not in commands:
                continue
            wall, rss = run_cli(args, in_process=quick)
            print(f"[paper_1b] {name}: {wall:.0f} s, peak RSS {rss:.0f} MiB", flush=True)
            note = f"T={T}, {pe}, bf16 weights {size / 2**20:.0f} MiB"
            if name == "probe-position":
                note += f", --n-train {n_train} --n-eval {n_eval}"
            rows.append(row(f"{name} wall time", wall, None, None, unit="s", note=note))
            rows.append(row(f"{name} peak RSS", rss, None, None, unit="MiB", note=note))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--n-train", type=int, default=8)
    p.add_argument("--n-eval", type=int, default=4)
    p.add_argument("--pe", default="rotary", help="position_encoding_type: none, rotary, alibi")
    p.add_argument("--dir", default=None, help="where to write the temporary weights")
    p.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    args = p.parse_args()
    print(machine_line())
    print_rows(
        "paper 1B shape",
        run(args.quick, args.n_train, args.n_eval, args.pe, args.dir, args.commands),
    )


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
