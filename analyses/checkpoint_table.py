"""Write checkpoints/README.md: one row per reference checkpoint, figures from `nopeinterp eval`.

    python analyses/checkpoint_table.py [--n 50]

ID / OOD exact match are exactly what `nopeinterp eval FILE --n N` prints in its summary
(same function, same seed), so the table can be checked file by file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nopeinterp import load_checkpoint
from nopeinterp.evaluation import evaluate
from nopeinterp.viz.html import atomic_write_text
from nopeinterp.zoo import checkpoint_files

ROOT = Path(__file__).resolve().parents[1]

HEADER = """# Reference checkpoints

Trained on this repository's CPU (2 cores) by `analyses/train_reference.py` (`make checkpoints`),
which holds the exact commands; stored in float16 (loaded back as float32). One architecture
for every PE: {arch}. AdamW, lr {lr}, batch {batch}, 6% warmup then linear decay, loss on the
target only; the checkpoint kept is the step with the best ID validation exact match (100
held-out examples, checked every 250 steps), as the paper selects.

`nope-seed1` is NoPE-prime, a second NoPE seed: the noise floor of the attention-similarity
analysis. ID / OOD: exact match from `nopeinterp eval FILE --n {n}` ({n} examples per length,
greedy decoding; ID lengths from the held-out validation pool, OOD lengths from the test split).
Learned APE cannot read sequences longer than its table (n_ctx): those OOD lengths are "not
evaluable" and left out of its OOD mean (count in the last column).

| file | task | PE | seed | steps (best / total) | train wall time | val acc | ID exact match | OOD exact match | OOD lengths not evaluable | size |
|---|---|---|---|---|---|---|---|---|---|---|
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", default=str(ROOT / "checkpoints"))
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args()
    directory = Path(args.checkpoints)
    rows, first = [], None
    for path in checkpoint_files(directory):
        ckpt = load_checkpoint(path)
        first = first or ckpt
        summary = evaluate(ckpt, n=args.n, progress=False).summary
        summary = summary.set_index("split")
        meta = ckpt.meta
        acc = {
            s: (f"{summary.loc[s, 'accuracy']:.3f}" if s in summary.index else "-")
            for s in ("ID", "OOD")
        }
        not_eval = int(summary.loc["OOD", "lengths_not_evaluable"]) if "OOD" in summary.index else 0
        rows.append(
            f"| {path.name} | {meta['task']} | {meta['pe']} | {meta['seed']} | {meta['step']} / {meta['steps']} "
            f"| {meta['wall_time_s'] / 60:.1f} min | {meta['val_accuracy']:.2f} | {acc['ID']} | {acc['OOD']} "
            f"| {not_eval} | {path.stat().st_size / 2**20:.1f} MB |"
        )
        print(rows[-1], flush=True)
    # (an empty folder never gets here: checkpoint_files raises for it)
    c, t = first.meta["config"], first.meta["train_config"]
    arch = (
        f"{c['n_layers']} layers, {c['n_heads']} heads, d_model {c['d_model']}, d_mlp {c['d_mlp']}"
    )
    text = (
        HEADER.format(arch=arch, lr=t["lr"], batch=t["batch_size"], n=args.n)
        + "\n".join(rows)
        + "\n"
    )
    total = sum(p.stat().st_size for p in checkpoint_files(directory))
    text += f"\nTotal: {total / 2**20:.1f} MB.\n"
    atomic_write_text(directory / "README.md", text)
    print(f"wrote {directory / 'README.md'}")


if __name__ == "__main__":
    from _common import run_script

    run_script(main)
