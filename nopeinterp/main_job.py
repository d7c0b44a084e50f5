"""The main job: every analysis, on the shipped checkpoints, in a few minutes, on one page.

    nopeinterp report --checkpoints checkpoints --out reports/main

writes `<out>/index.html`: one offline page (plotly.js once) with a section per claim, each
opening with a verdict line computed from the numbers below it:
1. length generalization: exact match per length for every checkpoint (one panel per task,
   training range shaded), ID / OOD summary;
2. Theorem 1: position probes on each task's NoPE checkpoint, with the random-init baseline;
3. Theorem 2: distance dependence of the attention logits, and attention mass by relative
   distance, on each task's checkpoints (`distance_pes`: NoPE only, or every PE);
4. attention similarity: NoPE vs every other PE and NoPE-prime (the paper's analysis);
5. an attention explorer: NoPE beside a chosen reference on examples every model can read.
The tables behind each section are saved as CSV (+ meta JSON) in `<out>/<analysis>/`; the
page is the report. Everything is computed here from the checkpoints; nothing is trained or
downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from nopeinterp.options import ReportOptions

PAGE_MAX_BYTES = 8 * 2**20  # the page must stay light enough to open and mail around
PAPER_SIMILARITY_ORDER = "T5 ~ NoPE' < ALiBi < APE < Rotary"  # paper-notes.md, SCAN


def _print(title: str, df: pd.DataFrame) -> None:
    print(f"\n== {title} ==")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def _fmt(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


# -- verdicts: one line each, computed from the result tables --------------------------------
def length_verdict(summary: pd.DataFrame) -> str:
    """Per task: NoPE's OOD exact match and its rank among the seed-0 PEs that could be
    evaluated (`summary`: EvalResult.summary joined with task, pe and seed)."""
    parts = []
    for task, rows in summary[(summary["split"] == "OOD") & (summary["seed"] == 0)].groupby(
        "task", sort=False
    ):
        rows = rows.dropna(subset=["accuracy"]).sort_values("accuracy", ascending=False)
        if rows.empty:
            continue
        best = rows.iloc[0]
        nope = rows[rows["pe"] == "nope"]
        if nope.empty:
            parts.append(f"{task}: best OOD {best['pe']} {_fmt(best['accuracy'])}")
            continue
        acc = float(nope["accuracy"].iloc[0])
        rank = 1 + int((rows["accuracy"] > acc).sum())
        parts.append(
            f"{task}: NoPE OOD exact match {_fmt(acc)}, rank {rank} of {len(rows)} PEs "
            f"(best {best['pe']} {_fmt(best['accuracy'])})"
        )
    return "; ".join(parts) or "no OOD lengths evaluated"


def probe_verdict(task: str, table: pd.DataFrame) -> str:
    """Best layer's OOD (else ID) R2 of the position probe: trained NoPE vs random init."""
    r2 = table[table["metric"] == "r2"]
    split = "OOD" if (r2["split"] == "OOD").any() else "ID"
    r2 = r2[r2["split"] == split]
    trained = r2[r2["model"] == "trained"]
    if trained.empty:
        return f"{task}: no probe results"
    best = trained.loc[trained["value"].idxmax()]
    rand = r2[(r2["model"] == "random_init") & (r2["layer"] == best["layer"])]["value"]
    rand_txt = f", random-init {_fmt(float(rand.iloc[0]))}" if len(rand) else ""
    return f"{task}: position R2 {_fmt(best['value'])} ({split}, layer {best['layer']}{rand_txt})"


def distance_summary(results: dict[tuple[str, str], object]) -> pd.DataFrame:
    """Per (task, pe, split, layer): mean and max over heads of the distance-dependence R2."""
    frames = []
    for (task, pe), r in results.items():
        g = r.table.groupby(["split", "layer"], sort=False)["score"]
        frames.append(
            pd.DataFrame({"mean_score": g.mean(), "max_score": g.max()})
            .reset_index()
            .assign(task=task, pe=pe)
        )
    cols = ["task", "pe", "split", "layer", "mean_score", "max_score"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def distance_verdict(summary: pd.DataFrame) -> str:
    """Theorem 2 asks whether layers after the first can make logits depend on distance:
    NoPE's best head in layers >= 1 against its best head in layer 0."""
    parts = []
    nope = summary[summary["pe"] == "nope"]
    for task, rows in nope.groupby("task", sort=False):
        split = "OOD" if (rows["split"] == "OOD").any() else rows["split"].iloc[0]
        rows = rows[rows["split"] == split]
        later = rows[rows["layer"] >= 1]
        first = rows[rows["layer"] == 0]
        if later.empty:
            continue
        best = later.loc[later["max_score"].idxmax()]
        l0 = _fmt(float(first["max_score"].max())) if len(first) else "n/a"
        parts.append(
            f"{task} NoPE: best head distance R2 {_fmt(best['max_score'])} in layer "
            f"{best['layer']} ({split}; layer 0: {l0})"
        )
    return "; ".join(parts) or "no NoPE checkpoint to test"


def similarity_verdict(task: str, ranking: pd.DataFrame) -> str:
    split = "OOD" if (ranking["split"] == "OOD").any() else ranking["split"].iloc[0]
    rows = ranking[ranking["split"] == split].sort_values("rank")
    order = " < ".join(f"{r} {m:.3f}" for r, m in zip(rows["ref"], rows["mean"], strict=True))
    return f"{task}, {split}, divergence from NoPE: {order} (paper: {PAPER_SIMILARITY_ORDER})"


# -- the explorer's examples -----------------------------------------------------------------
def explorer_examples(checkpoint, limit: int | None, *, per_split: int = 3, seed: int = 0):
    """([1-D token tensors], [names]): up to `per_split` ID and OOD sequences of at most
    `limit` tokens (what every model in the explorer can read), spread over the lengths
    available, longest first."""
    from nopeinterp.data import make_sequences

    sets = make_sequences(None, checkpoint, purpose="analysis", n_per_length=1, seed=seed)
    examples, names = [], []
    for split, seqs in sets.items():
        seqs = seqs.readable_by(limit)
        n_tok = seqs.attention_mask.sum(1)
        order = sorted(range(len(seqs)), key=lambda i: -int(n_tok[i]))
        if not order:
            continue
        k = min(per_split, len(order))
        picks = [order[round(j * (len(order) - 1) / max(k - 1, 1))] for j in range(k)]
        for i in dict.fromkeys(picks):
            n = int(n_tok[i])
            examples.append(seqs.tokens[i, :n])
            names.append(f"{split} length {int(seqs.lengths[i])} ({n} tokens)")
    return examples, names


def run_main_job(
    checkpoints="checkpoints",
    out="reports/main",
    *,
    options: ReportOptions | None = None,
    **changes,
) -> Path:
    """Run every analysis on the checkpoints in `checkpoints` and write `<out>/index.html`
    (returned); see the module docstring. `options` (`nopeinterp.options.ReportOptions`), or
    any of its fields, say how much of each analysis runs.

    Runs with one torch thread: the shipped models are tiny, and on a 2-core machine a second
    thread only contends (the main job took 40 min at the default thread count beside other
    jobs, under 2 min with one thread beside the test suite)."""
    import torch

    opts = ReportOptions.make(options, **changes)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_main_job(checkpoints, out, opts)
    finally:
        torch.set_num_threads(threads)


def _run_main_job(checkpoints, out, opts: ReportOptions) -> Path:
    """The main job with resolved options (see `run_main_job`)."""
    n_eval, n_probe, n_distance = opts.n, opts.n_probe, opts.n_distance
    distance_pes, n_per_length = opts.distance_pes, opts.n_per_length
    explorer_per_split, n_heads, progress = opts.explorer_per_split, opts.n_heads, opts.progress
    from nopeinterp import zoo
    from nopeinterp.data import max_positions
    from nopeinterp.evaluation import EvalResult, evaluate
    from nopeinterp.probing import distance_dependence, probe_position
    from nopeinterp.similarity import compare_attention
    from nopeinterp.similarity.explorer import explorer_data
    from nopeinterp.viz.page import Page
    from nopeinterp.viz.report import distance_figure, rel_mass_figure

    out = Path(out)
    entries = zoo.find_checkpoints(checkpoints)
    ckpts = {e.name: e.load() for e in entries}
    tasks = zoo.tasks_of(entries)
    page = Page(
        "nopeinterp: positional encodings and length generalization",
        intro=(
            f"{len(entries)} checkpoints from {checkpoints} (tasks: {', '.join(tasks)}). "
            "Claims of Kazemnejad et al. 2023; each section opens with a verdict computed from "
            "its numbers."
        ),
    )

    # 1. length generalization
    results = [evaluate(ckpts[e.name], n=n_eval, progress=progress) for e in entries]
    evaluation = EvalResult.concat(results)
    names = pd.DataFrame([{"model": e.name, "task": e.task, "seed": e.seed} for e in entries])
    summary = evaluation.summary.merge(names, on="model")
    wide = summary.pivot_table(
        index=["task", "model"], columns="split", values="accuracy", sort=False
    ).reset_index()
    _print(f"Length generalization: exact match ({n_eval} examples per length)", wide)
    evaluation.save(out / "length_generalization", html=False)
    (
        page.section("Length generalization (claim 1)", verdict=length_verdict(summary))
        .add(evaluation.figure())
        .add(wide, caption="Exact match, mean over ID / OOD lengths")
        .add(evaluation.table, caption="Exact match per length")
        .text(
            f"{n_eval} examples per length, greedy decoding. A learned APE cannot read "
            "sequences past its table: those lengths are marked and left out of its mean."
        )
    )

    # 2. Theorem 1: position probes on NoPE
    sec = None
    verdicts, probe_results = [], []
    for task in tasks:
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
        result.save(out / f"probe_position_{task}", html=False)
        verdicts.append(probe_verdict(task, result.table))
        probe_results.append((task, result))
    if probe_results:
        sec = page.section("Theorem 1: absolute position in NoPE", verdict="; ".join(verdicts))
        for task, result in probe_results:
            sec.add(result.figure(), caption=f"{task}: linear position probes per layer")
            sec.add(result.pivot().reset_index(), caption=f"{task}: probe metrics per layer")

    # 3. Theorem 2: distance dependence and attention mass by relative distance
    wanted = set(distance_pes)
    distance = {}
    for e in entries:
        if e.seed != 0 or not (e.pe == "nope" or "all" in wanted or e.pe in wanted):
            continue
        result = distance_dependence(ckpts[e.name], n_eval=n_distance, progress=progress)
        result.save(out / "distance_dependence" / e.name, html=False)
        distance[(e.task, e.pe)] = result
    if distance:
        dsum = distance_summary(distance)
        _print("Distance dependence (max over heads of R2 of logits on n - m)", dsum)
        (
            page.section(
                "Theorem 2: relative distance in later layers", verdict=distance_verdict(dsum)
            )
            .add(distance_figure(dsum))
            .add(rel_mass_figure(distance))
            .add(dsum, caption="Distance R2 per task, PE, split and layer (mean / max over heads)")
            .text(
                "Score: R2 of logit[n, m] ~ a_row + f(n - m) over the causal cells, relative to "
                "the row-centred logits; 1 = the head's logits depend on relative distance only. "
                f"{n_distance} ID and {n_distance} OOD sequences per checkpoint."
            )
        )

    # 4. attention similarity (SCAN, or the only task there is)
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
        result.save(out / f"attention_similarity_{task}", html=False)
        (
            page.section(
                "Attention similarity: what NoPE learns (claim 4)",
                verdict=similarity_verdict(task, result.ranking),
            )
            .add(result.figure())
            .add(result.ranking, caption="Ranking, closest to NoPE first (95% bootstrap CI)")
            .add(result.table, caption="Divergence per reference, layer and split")
            .text(
                f"Jensen-Shannon divergence (nats) per query row, min over head pairs, mean over "
                f"{n_per_length} examples per length; nope_prime (a second NoPE seed) is the "
                "noise floor."
            )
        )

        # 5. the attention explorer: NoPE beside each reference on examples all can read
        models = {"nope": ckpts[nope.name].model}
        if prime:
            models[prime.pe + "-seed" + str(prime.seed)] = ckpts[prime.name].model
        models.update({pe: ckpts[path.stem].model for pe, path in refs.items()})
        limits = [m for m in map(max_positions, models.values()) if m is not None]
        examples, example_names = explorer_examples(
            ckpts[nope.name], min(limits) if limits else None, per_split=explorer_per_split
        )
        if examples:
            data = explorer_data(
                models,
                examples,
                labels=ckpts[nope.name].tokenizer,
                example_names=example_names,
                left="nope",
                reference=next(iter(refs), None),
            )
            longest = max(len(e) for e in examples)
            page.section(
                "Attention explorer",
                verdict=(
                    f"{task}: {len(models)} models, {len(data.layers)} layers x {data.n_heads} "
                    f"heads, {len(examples)} examples of up to {longest} tokens"
                    + (f" (every model reads at most {min(limits)} positions)" if limits else "")
                ),
            ).add(data)

    # Head taxonomy: what dominates each head, per seed-0 checkpoint. Position
    # erasure is too slow for the main job; its results are in analyses/results/causal_*.
    from nopeinterp.probing import classify_heads
    from nopeinterp.probing.heads import KINDS

    rows = []
    for e in entries:
        if e.seed != 0:
            continue
        tax = classify_heads(ckpts[e.name], n_eval=n_heads, progress=progress)
        t = tax.table[tax.table.split == tax.table.split.iloc[0]]
        counts = t.label.value_counts()
        rows.append({"task": e.task, "pe": e.pe, **{k: int(counts.get(k, 0)) for k in KINDS}})
    heads = pd.DataFrame(rows)
    _print("Head taxonomy (heads per label, ID split)", heads)
    positional = [k for k in KINDS if k != "content"]
    nope = heads[heads.pe == "nope"]
    page.section(
        "Heads: what dominates each head",
        verdict=(
            f"NoPE: {int(nope[positional].to_numpy().sum())} of "
            f"{int(nope[list(KINDS)].to_numpy().sum())} heads are positional "
            f"({', '.join(positional)}); labels and thresholds: nopeinterp.probing.heads"
        ),
    ).add(heads)

    index = page.write(out / "index.html", max_bytes=PAGE_MAX_BYTES)
    print(f"\nreport written to {index} ({index.stat().st_size / 2**20:.1f} MiB)")
    return index
