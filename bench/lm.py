"""Language modelling: the `lm` training step against the hand-written SDPA model, lm-eval's
scoring throughput against a plain transformers forward, and its peak memory at T = 2048.

1. Training step at T = 256 on corpus-like chunks (every next token a target, the `lm` task's
   `chunk_batch`): ours (the trainer's `target_loss` on `build_model`) against
   `bench.train_step.RefModel(sdpa=True)` of the same shape and PE, timed interleaved.
   Target ours/sdpa <= 1.05 (as the synthetic tasks' step).
2. lm-eval throughput: `lm_eval.token_losses` on `from_hf(model)` against the same Hugging Face
   model's own forward plus a cross-entropy (no TransformerLens), tokens per second on the same
   windows, interleaved, for two models: a SmolLM3 with RoPE in every layer (a Llama, which
   from_hf turns into our own rotary model: the fast attention our checkpoints use) and a
   Llama (from_hf: TransformerLens' own HookedTransformer). Target ours/plain >= 0.9.
3. Peak memory of `token_losses` at T = 2048 (one batch of TOKENS_PER_BATCH // 2048 rows) in a
   child process: the peak RSS (sampled every 0.5 ms) over the RSS before, against one layer's
   attention for that batch (rows x heads x T^2 float32); the logits [rows, T, vocab] come on
   top of it.

    python -m bench.lm [--quick] [--threads N] [--parts train eval memory]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

from bench._common import interleaved_times, machine_line, print_rows, row
from bench.train_step import RefModel, ref_loss, step_fn
from nopeinterp.lm_eval import TOKENS_PER_BATCH, token_losses
from nopeinterp.models import build_model
from nopeinterp.tasks.lm import chunk_batch
from nopeinterp.training.trainer import target_loss

FULL = dict(
    pes=("nope", "t5", "alibi", "rotary", "sinusoidal", "fire"),
    n_layers=4, n_heads=4, d_model=128, d_vocab=4096, batch=16, seq=256, repeats=5,
    eval_seq=(256, 2048), eval_windows=8, mem_seq=2048,
)  # fmt: skip
QUICK = dict(
    pes=("nope",), n_layers=1, n_heads=2, d_model=32, d_vocab=64, batch=2, seq=16, repeats=1,
    eval_seq=(32,), eval_windows=2, mem_seq=64,
)  # fmt: skip
TARGET_STEP = 1.05
TARGET_EVAL = 0.9


def _tokens(n, seq, d_vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, d_vocab, (n, seq), generator=g)


def train_rows(s) -> list[dict]:
    rows = []
    batch = chunk_batch(_tokens(s["batch"], s["seq"], s["d_vocab"]))
    for pe in s["pes"]:
        shape = dict(n_layers=s["n_layers"], n_heads=s["n_heads"], d_model=s["d_model"])
        ours = build_model(pe, **shape, d_vocab=s["d_vocab"], n_ctx=s["seq"], seed=0)
        ref = RefModel(pe, **shape, d_vocab=s["d_vocab"], n_ctx=s["seq"], sdpa=True)
        t = interleaved_times(
            {"ours": step_fn(ours, target_loss, batch), "sdpa": step_fn(ref, ref_loss, batch)},
            s["repeats"],
        )
        r = t["ours"] / t["sdpa"]
        rows.append(
            row(
                f"lm train step {pe} d{s['d_model']} T{s['seq']} B{s['batch']} "
                f"V{s['d_vocab']}: ours/sdpa-ref time",
                t["ours"] * 1e3,
                t["sdpa"] * 1e3,
                r,
                target=f"<= {TARGET_STEP}",
                met=r <= TARGET_STEP,
                unit="ms/step",
            )
        )
    return rows


HF_KINDS = ("smollm3", "llama")  # our own per-layer model (SDPA), TransformerLens' stock path


def hf_model(s, kind: str = "smollm3"):
    """A random Hugging Face model of the bench's shape: "smollm3" with RoPE in every layer (a
    Llama; from_hf makes it our own rotary model) or "llama" (from_hf: TransformerLens')."""
    import transformers as tf

    shape = dict(
        vocab_size=s["d_vocab"], hidden_size=s["d_model"], num_attention_heads=s["n_heads"],
        num_key_value_heads=s["n_heads"], num_hidden_layers=s["n_layers"],
        intermediate_size=4 * s["d_model"],
        max_position_embeddings=max((*s["eval_seq"], s["mem_seq"])),
    )  # fmt: skip
    torch.manual_seed(0)
    if kind == "smollm3":
        ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
        cfg = tf.SmolLM3Config(**shape, **ids, no_rope_layers=[1] * s["n_layers"])
        return tf.SmolLM3ForCausalLM(cfg).eval()
    return tf.LlamaForCausalLM(tf.LlamaConfig(**shape)).eval()


def eval_rows(s, kinds=HF_KINDS) -> list[dict]:
    import torch.nn.functional as F

    from nopeinterp.models.hf import from_hf

    rows = []
    for kind in kinds:
        hf = hf_model(s, kind)
        ours = from_hf(hf)
        for seq in s["eval_seq"]:
            tokens = _tokens(s["eval_windows"], seq, s["d_vocab"], seed=1)
            per = max(1, TOKENS_PER_BATCH // seq)

            def plain(tokens=tokens, per=per, hf=hf):
                with torch.inference_mode():
                    for i in range(0, len(tokens), per):
                        x = tokens[i : i + per]
                        logits = hf(x).logits[:, :-1].float()
                        F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")

            t = interleaved_times(
                {"ours": lambda tokens=tokens, m=ours: token_losses(m, tokens), "plain": plain},
                s["repeats"],
            )
            n = tokens.numel()
            r = t["plain"] / t["ours"]  # tokens/s ours over tokens/s plain
            rows.append(
                row(
                    f"lm-eval scoring T{seq} ({kind} {s['n_layers']}x{s['d_model']}, "
                    f"V{s['d_vocab']}): ours/plain transformers tokens per s",
                    n / t["ours"],
                    n / t["plain"],
                    r,
                    target=f">= {TARGET_EVAL}",
                    met=r >= TARGET_EVAL,
                    unit="tokens/s",
                    note=f"from_hf gives {type(ours).__name__}",
                )
            )
    return rows


_CHILD = r"""
import gc, json, os, sys, threading, time, torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from bench.lm import hf_model, QUICK, FULL, _tokens
from nopeinterp.lm_eval import TOKENS_PER_BATCH, token_losses
from nopeinterp.models.hf import from_hf
s = QUICK if sys.argv[2] == "quick" else FULL
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
model = from_hf(hf_model(s, sys.argv[3]))
token_losses(model, _tokens(2, 64, s["d_vocab"]))
gc.collect()
T = s["mem_seq"]
rows = max(1, TOKENS_PER_BATCH // T)
tokens = _tokens(rows, T, s["d_vocab"])
base, peak, running = rss(), [0], [True]
def sample():
    while running[0]:
        peak[0] = max(peak[0], rss())
        time.sleep(0.0005)
thread = threading.Thread(target=sample)
thread.start()
token_losses(model, tokens)
running[0] = False
thread.join()
print(json.dumps({"rows": rows, "growth_mib": (max(peak[0], rss()) - base) / 2**20}))
"""


def memory_rows(s, quick: bool, kinds=HF_KINDS) -> list[dict]:
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    out = []
    for kind in kinds:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, root, "quick" if quick else "full", kind],
            capture_output=True,
            text=True,
            check=True,
        )
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        T = s["mem_seq"]
        attention = rec["rows"] * s["n_heads"] * T * T * 4 / 2**20
        logits = rec["rows"] * T * s["d_vocab"] * 4 / 2**20
        out.append(
            row(
                f"lm-eval peak memory T{T} ({kind}, {rec['rows']} rows x {s['n_heads']} heads): "
                "RSS growth / one layer's attention",
                rec["growth_mib"],
                attention,
                rec["growth_mib"] / attention,
                target="<= 1 + logits",
                met=rec["growth_mib"] <= attention + logits,
                unit="MiB",
                note=f"peak RSS over the RSS before, sampled every 0.5 ms in a child process; "
                f"the float32 logits [rows, T, vocab] alone are {logits:.0f} MiB",
            )
        )
    return out


PARTS = ("train", "eval", "memory")


def run(quick: bool = False, parts=PARTS) -> list[dict]:
    s = QUICK if quick else FULL
    rows = train_rows(s) if "train" in parts else []
    kinds = HF_KINDS[:1] if quick else HF_KINDS  # quick: one child process, one model
    rows += eval_rows(s, kinds) if "eval" in parts else []
    return rows + (memory_rows(s, quick, kinds) if "memory" in parts else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine_line())
    print_rows("language modelling", run(args.quick, args.parts))


if __name__ == "__main__":
    main()
