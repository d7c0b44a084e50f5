"""Real-size analyses of an imported model: time and peak RSS against what a researcher writes.

A random model, nothing downloaded: transformers' default `GPT2Config` (GPT-2 small, 124M
parameters, float32), or with `--shape llama-1b` a Llama of Llama-3.2-1B's shape (16 layers,
d_model 2048, 32 heads, 8 key-value heads, d_ff 8192, vocabulary 128256, tied embeddings) in
bfloat16, saved with `save_pretrained` to a temporary directory. Every command runs in a child
process of its own with one torch thread; the figures are its wall time and its peak RSS
(VmHWM: `bench._common.peak_rss_kib`), so loading and imports are included on both sides.

  probe-position   `nopeinterp probe-position --hf DIR` (its defaults: the random-init control
                   and the shuffled-label control) against the plain script a researcher writes
                   instead (`plain_probe`): the transformers model's forward with
                   `output_hidden_states` over the very same sequences (sampled once, by the
                   CLI's own code, and saved), the same ridge statistics (the package's
                   `RidgeStats` / `RidgePath` / `select_alpha`, the same targets), and the same
                   random-init twin (the config, re-initialised). Targets: time and peak RSS
                   ratios <= 1.1, both measured in this run.
  probe-distance, compare-attention (the model against itself), heads (sinks and the head
                   taxonomy): peak RSS against the bound (every analysis, probe-position too):
                   the imports + 1.3 x the weights' bytes of each model held at once + one
                   layer's attention for one batch + the analysis' statistics.

Bound terms: the imports = the peak of a child that only imports transformers, the CLI and
TransformerLens (the interpreter's floor; about 475 MiB here); models held at once: two for
probe-position (its random-init control re-initialises a twin while the model is alive, as the
plain script does) and for compare-attention (both models), one otherwise; one layer's attention = batch x heads x T^2 x 4 bytes (float32 scores, the pattern
as many again where an analysis reads both; compare-attention holds one layer per model);
statistics: probe-position's ridge sums (X^T X and X^T Y, float64, per layer, fit and val
splits), probe-distance's distance design (a D x D float64 gram with D = T, and per layer
[heads, T] sums).

    python -m bench.real_size [--quick] [--shape gpt2-small|llama-1b] [--n-train 16]
                              [--n-eval 4] [--only probe-position ...] [--dir PATH]
                              [--repeats N]  # probe-position: N alternated rounds, medians
                              [--no-plain]   # probe-position against its bound only
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench._common import machine_line, print_rows, row
from bench.paper_1b import run_cli

SHAPES = {
    "gpt2-small": dict(T=1024),
    "llama-1b": dict(T=2048),
    "quick": dict(T=32),
}
COMMANDS = ("probe-position", "probe-distance", "compare-attention", "heads")
TARGET_TIME = 1.1
TARGET_RSS = 1.1
BOUND_WEIGHTS = 1.3


def write_model(path: Path, shape: str, seed: int = 0) -> int:
    """A random transformers causal LM of `shape` saved to `path`; returns its weights' bytes
    (the parameters the model holds, as loaded)."""
    import transformers as tf

    torch.manual_seed(seed)
    if shape == "gpt2-small":
        model = tf.GPT2LMHeadModel(tf.GPT2Config())
    elif shape == "quick":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64))
    elif shape == "llama-1b":
        cfg = tf.LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
            tie_word_embeddings=True, rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = tf.LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(old)
        model.config.torch_dtype = torch.bfloat16
    else:
        raise ValueError(f"unknown shape {shape!r}")
    model.save_pretrained(path)
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:  # tied embeddings once
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


# ------------------------------------------------------------------ the researcher's script
_SETS_CHILD = """
import sys, torch
from nopeinterp.inputs import resolve
from nopeinterp.models.hf import from_hf
from nopeinterp.options import ProbeOptions
directory, out, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
kw = dict(zip(argv[0::2], argv[1::2]))
opts = ProbeOptions(id_lengths=tuple(map(int, kw["id"].split("-"))),
                    ood_lengths=tuple(map(int, kw["ood"].split("-"))), n_train=int(kw["n_train"]),
                    n_eval=int(kw["n_eval"]), progress=False)
mi, sets = resolve(from_hf(directory), None, opts, purpose="probe")
torch.save({k: (v.tokens, v.attention_mask) for k, v in sets.items()}, out)
print(mi.model.cfg.n_layers, mi.model.cfg.n_heads, mi.model.cfg.d_model, opts.batch_size,
      opts.random_init_seed if opts.random_init_seed is not None else -1, opts.seed)
"""


def plain_probe(directory: str, sets_path: str, batch_size: int, seed: int, control_seed: int):
    """What a researcher writes instead of `probe-position --hf`: the transformers model's own
    forward with output_hidden_states, the package's ridge statistics on every hidden state,
    alpha chosen on val, metrics on ID / OOD; the same for a re-initialised twin and for
    shuffled labels (the CLI's controls). Returns the number of table rows it computed."""
    import transformers as tf

    from nopeinterp.probing.position import _shuffled_labels, position_targets
    from nopeinterp.probing.ridge import DEFAULT_ALPHAS, RidgePath, RidgeStats, select_alpha

    class _Set:  # what _shuffled_labels reads
        def __init__(self, tokens, mask):
            self.tokens, self.attention_mask = tokens, mask

    sets = {k: _Set(*v) for k, v in torch.load(sets_path).items()}
    P = max(int(sets[n].attention_mask.sum(1).max()) for n in ("fit", "val"))
    shuffled = _shuffled_labels(sets, ("fit", "val"), seed)

    def hidden(model, s):
        order = torch.argsort(s.attention_mask.sum(1), descending=True, stable=True)
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            t = int(s.attention_mask[idx].sum(1).max())
            tokens, mask = s.tokens[idx, :t], s.attention_mask[idx, :t]
            with torch.inference_mode():
                out = model(tokens, attention_mask=mask, output_hidden_states=True)
            yield idx, mask.bool(), out.hidden_states

    def probe(model, controls: bool):
        n_layers = model.config.num_hidden_layers + 1
        d = model.config.hidden_size
        k = (1 + P) * (2 if controls else 1)
        stats = {n: [RidgeStats(d, k) for _ in range(n_layers)] for n in ("fit", "val")}
        for name in ("fit", "val"):
            for idx, real, states in hidden(model, sets[name]):
                pos = torch.arange(real.shape[1]).expand_as(real)[real]
                shuf = shuffled[name][idx, : real.shape[1]][real] if controls else None
                Y = position_targets(pos, P, shuf)
                for layer, h in enumerate(states):
                    stats[name][layer].update(h[real].float(), Y)
                del states
        weights = []
        for layer in range(n_layers):
            path = RidgePath(stats["fit"][layer])
            full = RidgePath(stats["fit"][layer].merged(stats["val"][layer]))
            W, c = torch.zeros(d, k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
            for g in range(k // (1 + P)):
                for cols in ([g * (1 + P)], list(range(g * (1 + P) + 1, (g + 1) * (1 + P)))):
                    a, _ = select_alpha(path, stats["val"][layer], DEFAULT_ALPHAS, cols)
                    coef, intercept = full.coef(a)
                    W[:, cols], c[cols] = coef[:, cols], intercept[cols]
            weights.append((W, c))
        del stats
        rows = 0
        for split in ("ID", "OOD"):
            sums = [[0.0, 0.0, 0] for _ in range(n_layers)]
            for _, real, states in hidden(model, sets[split]):
                pos = torch.arange(real.shape[1]).expand_as(real)[real].double()
                for layer, h in enumerate(states):
                    W, c = weights[layer]
                    pred = h[real].double() @ W + c
                    sums[layer][0] += float((pred[:, 0] - pos).abs().sum())
                    sums[layer][1] += float((pred[:, 1 : 1 + P].argmax(1) == pos.long()).sum())
                    sums[layer][2] += pos.numel()
                del states
            rows += 3 * n_layers * (k // (1 + P))
        return rows

    model = tf.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    rows = probe(model, controls=True)
    torch.manual_seed(control_seed)
    twin = tf.AutoModelForCausalLM.from_config(model.config).to(model.dtype).eval()
    rows += probe(twin, controls=False)
    return rows


def _run_child(code: str, args: list[str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MiB, stdout) of `python -c code args` with one torch thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    pre = "import resource, sys, torch; torch.set_num_threads(1)\n"
    post = "\nfrom bench._common import peak_rss_kib; print('peak_rss_kib', peak_rss_kib())"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", pre + code + post, *args], env=env,
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    rss = next(int(x.split()[1]) for x in lines if x.startswith("peak_rss_kib"))
    return wall, rss / 1024, "\n".join(x for x in lines if not x.startswith("peak_rss_kib"))


_IDLE_CHILD = "import transformers, nopeinterp.cli, nopeinterp.models.hf  # noqa"
_PLAIN_CHILD = """
from bench.real_size import plain_probe
print(plain_probe(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
"""


def run(quick: bool = False, shape: str = "gpt2-small", n_train: int = 16, n_eval: int = 4,
        only=COMMANDS, root=None, repeats: int = 1, plain: bool = True) -> list[dict]:  # fmt: skip
    shape = "quick" if quick else shape
    T = SHAPES[shape]["T"]
    ids, ood = f"{T - 1}-{T - 1}", f"{T}-{T}"
    lengths = ["--id-lengths", ids, "--ood-lengths", ood]
    rows = []
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        directory = str(Path(tmp) / shape)
        t0 = time.perf_counter()
        weights = write_model(Path(directory), shape)
        print(f"[real_size] wrote {shape} ({weights / 2**20:.0f} MiB of weights) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        sets_path = str(Path(tmp) / "sets.pt")
        _, _, info = _run_child(
            _SETS_CHILD,
            [directory, sets_path, "id", ids, "ood", ood, "n_train", str(n_train),
             "n_eval", str(n_eval)],
        )  # fmt: skip
        n_layers, H, d, batch, control_seed, seed = (int(x) for x in info.split()[-6:])
        sets = torch.load(sets_path)
        counts = {k: int(v[0].shape[0]) for k, v in sets.items()}
        b = min(batch, max(counts.values()))
        control_seed = control_seed if control_seed >= 0 else 1  # the model's seed (0) + 1
        one_layer = b * H * T * T * 4
        P = T - 1
        ridge = 2 * (n_layers + 1) * (d * d + d * 2 * (1 + P)) * 8
        _, idle, _ = _run_child(_IDLE_CHILD, [])
        what = (
            f"{shape}, T={T}, n-train {n_train}, n-eval {n_eval}; sets {counts}; a child that "
            f"only imports the CLI, transformers and TransformerLens peaks at {idle:.0f} MiB"
        )
        if "probe-position" in only:
            args = ["probe-position", "--hf", directory, *lengths,
                    "--n-train", str(n_train), "--n-eval", str(n_eval)]  # fmt: skip
            plain_args = [directory, sets_path, str(batch), str(seed), str(control_seed)]
            times, peaks = {"ours": [], "plain": []}, {"ours": [], "plain": []}
            for i in range(repeats):  # alternated, so a change of load falls on both sides
                wall, rss = run_cli(args, in_process=False)
                times["ours"].append(wall)
                peaks["ours"].append(rss)
                print(f"[real_size] probe-position round {i + 1}: {wall:.0f} s {rss:.0f} MiB",
                      flush=True)  # fmt: skip
                if plain:
                    p_wall, p_rss, _ = _run_child(_PLAIN_CHILD, plain_args)
                    times["plain"].append(p_wall)
                    peaks["plain"].append(p_rss)
                    print(f"[real_size] plain script round {i + 1}: {p_wall:.0f} s "
                          f"{p_rss:.0f} MiB", flush=True)  # fmt: skip
            wall, rss = statistics.median(times["ours"]), max(peaks["ours"])
            if plain:
                p_wall, p_rss = statistics.median(times["plain"]), max(peaks["plain"])
                rounds = "; ".join(
                    f"{a:.0f}/{b:.0f} s" for a, b in zip(times["ours"], times["plain"], strict=True)
                )
                what_pp = what + f"; {repeats} alternated rounds (ours/plain: {rounds}), time: "
                what_pp += "medians, RSS: the larger peak"
                rows.append(row(f"probe-position --hf ({shape}): time vs plain transformers script",
                                wall, p_wall, wall / p_wall, target=f"<= {TARGET_TIME}",
                                met=wall / p_wall <= TARGET_TIME, unit="s", note=what_pp))  # fmt: skip
                rows.append(row(f"probe-position --hf ({shape}): peak RSS vs plain transformers "
                                "script", rss, p_rss, rss / p_rss, target=f"<= {TARGET_RSS}",
                                met=rss / p_rss <= TARGET_RSS, unit="MiB", note=what_pp))  # fmt: skip
            # the random-init control holds a second model of the same size (so does the
            # plain script): the bound counts the models an analysis holds at once
            rows.append(
                _bound_row("probe-position", shape, rss, weights, 2, one_layer, ridge, idle, what)
            )
        D = T + 1  # distances 0..T (OOD)
        distance_stats = D * D * 8 + n_layers * H * D * 8 * 3
        others = {  # args, models held at once, attention, statistics
            "probe-distance": (["probe-distance", "--hf", directory, *lengths,
                                "--n-eval", str(n_eval)], 1, 2 * one_layer, distance_stats),
            "compare-attention": (["compare-attention", "--nope-hf", directory, "--ref-hf",
                                   directory, *lengths, "--n", str(n_eval)], 2, 2 * one_layer, 0),
            "heads": (["heads", "--hf", directory, *lengths, "--n-eval", str(n_eval)],
                      1, 2 * one_layer, distance_stats),
        }  # fmt: skip
        for name, (args, models, attention, stats) in others.items():
            if name not in only:
                continue
            wall, rss = run_cli(args, in_process=False)
            print(f"[real_size] {name} {wall:.0f} s {rss:.0f} MiB", flush=True)
            rows.append(_bound_row(name, shape, rss, weights, models, attention, stats, idle,
                                   what + f", {wall:.0f} s"))  # fmt: skip
    return rows


def _bound_row(name, shape, rss_mib, weights, models, attention, stats, idle_mib, what):
    """Peak RSS against the bound: the interpreter with its libraries imported (measured: a
    child that only imports them) + 1.3 x the weights of each model held at once + one layer's
    attention for one batch + the statistics. The note gives each term and the ratio to the
    bound without the first term and with one model (the bound as first written)."""
    mib = 2**20
    held = BOUND_WEIGHTS * weights * models
    bound = idle_mib + (held + attention + stats) / mib
    first = (BOUND_WEIGHTS * weights + attention + stats) / mib
    return row(
        f"{name} --hf ({shape}): peak RSS vs the bound",
        rss_mib,
        bound,
        rss_mib / bound,
        target="<= 1",
        met=rss_mib <= bound,
        unit="MiB",
        note=f"bound = imports {idle_mib:.0f} MiB + {BOUND_WEIGHTS} x weights {weights / mib:.0f} "
        f"MiB x {models} model(s) held + one layer's attention {attention / mib:.0f} MiB + "
        f"statistics {stats / mib:.0f} MiB; against the bound as first written (no imports, "
        f"one model: {first:.0f} MiB) {rss_mib / first:.2f}; {what}",
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--shape", default="gpt2-small", choices=("gpt2-small", "llama-1b"))
    p.add_argument("--n-train", type=int, default=16)
    p.add_argument("--n-eval", type=int, default=4)
    p.add_argument("--only", nargs="*", default=list(COMMANDS), choices=COMMANDS)
    p.add_argument("--dir", default=None, help="where to write the temporary weights")
    p.add_argument("--repeats", type=int, default=1, help="alternated probe-position rounds")
    p.add_argument("--no-plain", action="store_true", help="probe-position against its bound only")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(machine_line(), flush=True)
    rows = run(args.quick, args.shape, args.n_train, args.n_eval, args.only, args.dir,
               args.repeats, plain=not args.no_plain)  # fmt: skip
    print_rows(f"real size ({args.shape})", rows)
    print(machine_line())


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
