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
    from nopeinterp import zoo
    from nopeinterp.evaluation import EvalResult, evaluate
    from nopeinterp.probing import probe_position
    from nopeinterp.similarity import compare_attention

    out = Path(out)
    entries = zoo.find_checkpoints(checkpoints)
    ckpts = {e.name: e.load() for e in entries}

    # 1. length generalization
    results = [evaluate(ckpts[e.name], n=n_eval, progress=progress) for e in entries]
    evaluation = EvalResult.concat(results)
    wide = (
        evaluation.summary.merge(evaluation.table[["model", "task"]].drop_duplicates(), on="model")
        .pivot_table(index=["task", "model"], columns="split", values="accuracy")
        .reset_index()
    )
    _print(f"Length generalization: exact match ({n_eval} examples per length)", wide)
    evaluation.save(out / "length_generalization")

    # 2. Theorem 1: position probes on NoPE
    for task in zoo.tasks_of(entries):
        nope = zoo.get(entries, task, "nope")
        if nope is None:
            continue
        result = probe_position(
            ckpts[nope.name], n_train=n_probe, n_eval=n_probe // 2, progress=progress
        )
        _print(
            f"Position probes, {nope.name} (R2 / MAE per layer; [random_init] = same config, "
            "untrained)",
            result.pivot().reset_index(),
        )
        result.save(out / f"probe_position_{task}")

    # 3. attention similarity on SCAN (or the only task there is)
    task = zoo.analysis_task(entries)
    if zoo.get(entries, task, "nope") is not None:
        nope, prime = zoo.nope_pair(entries, task)
        refs = zoo.references(entries, task)
        result = compare_attention(
            ckpts[nope.name],
            {pe: ckpts[path.stem] for pe, path in refs.items()},
            nope_prime=ckpts[prime.name] if prime else None,
            n_per_length=n_per_length,
            progress=progress,
        )
        _print(
            f"Attention divergence from NoPE, {task} (true JSD, min over head pairs; closest first)",
            result.ranking,
        )
        result.save(out / f"attention_similarity_{task}")

    print(f"\nreports written to {out}/ :")
    for html in sorted(out.rglob("*.html")):
        print(f"  {html}")
    return out
