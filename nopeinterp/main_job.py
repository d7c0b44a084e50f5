"""The main job: every analysis, on the shipped checkpoints, in a few minutes.

    nopeinterp report --checkpoints checkpoints --out reports/main

1. length generalization: exact match per length for every checkpoint, ID / OOD summary;
2. position probes (Theorem 1) on each task's NoPE checkpoint, with the random-init baseline;
3. attention similarity: NoPE vs every other PE and NoPE-prime on SCAN (the paper's analysis).
Everything is computed here from the checkpoints; nothing is trained or downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from nopeinterp.checkpoint import load_checkpoint
from nopeinterp.errors import NopeinterpError


def _print(title: str, df: pd.DataFrame) -> None:
    print(f"\n== {title} ==")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def run_main_job(
    checkpoints="checkpoints",
    out="reports/main",
    *,
    n_eval=20,
    n_probe=256,
    n_per_length=10,
    progress=True,
) -> Path:
    from nopeinterp.evaluation import evaluate, save_evaluation, summarize
    from nopeinterp.probing import probe_position_checkpoint
    from nopeinterp.similarity import compare_attention

    directory, out = Path(checkpoints), Path(out)
    paths = sorted(p for p in directory.glob("*.pt") if not p.name.endswith(".state.pt"))
    if not paths:
        raise NopeinterpError(
            f"no checkpoints in {directory}: see checkpoints/README.md (make checkpoints)"
        )
    ckpts = {p.stem: load_checkpoint(p) for p in paths}
    tasks = sorted({c.task for c in ckpts.values()})

    # 1. length generalization
    tables = [evaluate(c, n=n_eval, progress=progress, name=name) for name, c in ckpts.items()]
    table = pd.concat(tables, ignore_index=True)
    table.insert(2, "task_name", table.pop("task"))
    table = table.rename(columns={"task_name": "task"})
    summary = summarize(table).merge(table[["model", "task"]].drop_duplicates(), on="model")
    wide = summary.pivot_table(
        index=["task", "model"], columns="split", values="accuracy"
    ).reset_index()
    _print(f"Length generalization: exact match ({n_eval} examples per length)", wide)
    save_evaluation(table, out / "length_generalization")

    # 2. Theorem 1: position probes on NoPE
    for task in tasks:
        name = f"{task}-nope"
        if name not in ckpts:
            continue
        result = probe_position_checkpoint(
            ckpts[name], n_train=n_probe, n_eval=n_probe // 2, progress=progress
        )
        pivot = result.pivot().reset_index()
        _print(
            f"Position probes, {name} (R2 / MAE per layer; [random_init] = same config, untrained)",
            pivot,
        )
        result.save(out / f"probe_position_{task}")

    # 3. attention similarity on SCAN (or the only task there is)
    task = "scan" if "scan" in tasks else tasks[0]
    nope = ckpts.get(f"{task}-nope")
    if nope is not None:
        refs = {c.pe: c for name, c in ckpts.items() if c.task == task and c.pe != "nope"}
        prime = ckpts.get(f"{task}-nope-seed1")
        result = compare_attention(
            nope, refs, nope_prime=prime, n_per_length=n_per_length, progress=progress
        )
        _print(
            f"Attention divergence from NoPE, {task} (true JSD, min over head pairs; closest first)",
            result.ranking,
        )
        result.save(
            out / f"attention_similarity_{task}", title=f"NoPE attention similarity: {task}"
        )

    print(f"\nreports written to {out}/ :")
    for html in sorted(out.rglob("*.html")):
        print(f"  {html}")
    return out
