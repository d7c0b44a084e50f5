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
5. an attention explorer: NoPE beside a chosen reference on examples every model can read;
6. a head taxonomy: what dominates each head of every seed-0 checkpoint.
The page is declared by `SECTIONS`: each `Section` names its heading and the function that
computes it from the loaded checkpoints (`Zoo`), returning what it `Found` (a verdict, tables
to print, the page's items); `run_main_job(..., sections=...)` runs any of them. The tables
behind each section are saved as CSV (+ meta JSON) in `<out>/<analysis>/`; the page is the
report. Everything is computed here from the checkpoints; nothing is trained or downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
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
# Each section's line first says whether the paper's claim is supported, not supported or
# inconclusive on these checkpoints, by the rules below (fixed before looking at any result,
# never tuned to one), then gives the numbers it was judged on.
SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
GOOD_R2 = 0.5  # a probe or distance fit explaining half the variance: a clear signal
MARGIN_R2 = 0.1  # trained vs its baseline (random init, layer 0): a difference that counts
FLOOR_ACCURACY = 0.05  # below it on OOD lengths for every PE: nothing to rank


def claim_line(statuses: list[str], claim: str, numbers: str) -> str:
    """'<Status> on these checkpoints: <claim>. <numbers>': one status per task, combined
    (mixed statuses across tasks are inconclusive overall)."""
    found = set(statuses)
    status = found.pop() if len(found) == 1 else INCONCLUSIVE
    mixed = " (tasks disagree)" if len(set(statuses)) > 1 else ""
    return f"{status.capitalize()} on these checkpoints{mixed}: {claim}. {numbers}"


def _binomial_gap(p1: float, n1: float, p2: float, n2: float) -> float:
    """Two standard errors of the difference of two exact-match rates."""
    return 2 * math.sqrt(p1 * (1 - p1) / max(n1, 1) + p2 * (1 - p2) / max(n2, 1))


def length_verdict(summary: pd.DataFrame) -> str:
    """Claim 1, per task: NoPE's OOD exact match against the best seed-0 PE that could be
    evaluated (`summary`: EvalResult.summary joined with task, pe and seed). Supported when
    NoPE ranks first; not supported when the best PE beats it by more than two standard
    errors (binomial, over the OOD items: column `n`); inconclusive within that, or when no
    PE reaches FLOOR_ACCURACY."""
    parts, statuses = [], []
    ood = summary[(summary["split"] == "OOD") & (summary["seed"] == 0)]
    for task, rows in ood.groupby("task", sort=False):
        rows = rows.dropna(subset=["accuracy"]).sort_values("accuracy", ascending=False)
        if rows.empty:
            continue
        best = rows.iloc[0]
        nope = rows[rows["pe"] == "nope"]
        if nope.empty:
            parts.append(
                f"{task}: no NoPE checkpoint; best OOD {best['pe']} {_fmt(best['accuracy'])}"
            )
            statuses.append(INCONCLUSIVE)
            continue
        acc = float(nope["accuracy"].iloc[0])
        rank = 1 + int((rows["accuracy"] > acc).sum())
        n_nope = float(nope["n"].iloc[0]) if "n" in nope else 0.0
        n_best = float(best["n"]) if "n" in rows else 0.0
        gap = float(best["accuracy"]) - acc
        if float(best["accuracy"]) < FLOOR_ACCURACY:
            statuses.append(INCONCLUSIVE)
        elif rank == 1:
            statuses.append(SUPPORTED)
        elif gap > _binomial_gap(acc, n_nope, float(best["accuracy"]), n_best):
            statuses.append(NOT_SUPPORTED)
        else:
            statuses.append(INCONCLUSIVE)
        parts.append(
            f"{task}: NoPE OOD exact match {_fmt(acc)}, rank {rank} of {len(rows)} PEs "
            f"(best {best['pe']} {_fmt(best['accuracy'])})"
        )
    if not parts:
        return "Inconclusive: no OOD lengths evaluated"
    return claim_line(
        statuses, "NoPE generalizes to longer inputs better than the other PEs", "; ".join(parts)
    )


def probe_status(table: pd.DataFrame) -> tuple[str, str]:
    """Theorem 1 on one NoPE checkpoint: (status, numbers). Judged on the held-out ID split
    at the best layer after the embeddings: supported when the probe's R2 reaches GOOD_R2
    and beats the random-init model's at that layer by MARGIN_R2; not supported when it
    does neither; inconclusive otherwise, and when the random-init value is missing or NaN
    (a degenerate fit)."""
    r2 = table[(table["metric"] == "r2") & (table["layer"] >= 1)]
    numbers = []
    status = INCONCLUSIVE
    for split in ("ID", "OOD"):
        rows = r2[r2["split"] == split]
        trained = rows[rows["model"] == "trained"]
        if trained.empty:
            continue
        best = trained.loc[trained["value"].idxmax()]
        rand = rows[(rows["model"] == "random_init") & (rows["layer"] == best["layer"])]["value"]
        rand_value = float(rand.iloc[0]) if len(rand) else float("nan")
        rand_txt = f", random-init {_fmt(rand_value)}" if len(rand) else ""
        numbers.append(f"{split} R2 {_fmt(best['value'])} (layer {best['layer']}{rand_txt})")
        if split == "ID":
            value = float(best["value"])
            good, ahead = value >= GOOD_R2, not value - rand_value < MARGIN_R2
            status = (
                INCONCLUSIVE  # no control to beat (none, or its fit was degenerate: NaN)
                if math.isnan(rand_value)
                else SUPPORTED
                if good and ahead
                else NOT_SUPPORTED
                if not (good or ahead)
                else INCONCLUSIVE
            )
    return status, ", ".join(numbers) or "no probe results"


def probe_verdict(results: dict[str, pd.DataFrame]) -> str:
    """Theorem 1 over tasks: {task: probe_position table} (see `probe_status`)."""
    judged = {task: probe_status(table) for task, table in results.items()}
    return claim_line(
        [status for status, _ in judged.values()],
        "NoPE's residual stream encodes absolute position (a linear probe recovers it, "
        "beyond an untrained model)",
        "; ".join(f"{task}: {numbers}" for task, (_, numbers) in judged.items()),
    )


def distance_summary(results: dict[tuple[str, str], object]) -> pd.DataFrame:
    """Per (task, pe, split, layer): mean and max over heads of the distance-dependence R2."""
    from nopeinterp.probing.distance import layer_scores

    frames = [
        layer_scores(r.table)
        .rename(columns={"mean": "mean_score", "max": "max_score"})
        .assign(task=task, pe=pe)
        for (task, pe), r in results.items()
    ]
    cols = ["task", "pe", "split", "layer", "mean_score", "max_score"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def distance_verdict(summary: pd.DataFrame) -> str:
    """Theorem 2 asks whether layers after the first can make logits depend on distance:
    NoPE's best head in layers >= 1 against its best head in layer 0 (OOD where measured).
    Supported when the best later head reaches GOOD_R2 and beats layer 0 by MARGIN_R2; not
    supported when it does neither; inconclusive otherwise."""
    parts, statuses = [], []
    nope = summary[summary["pe"] == "nope"]
    for task, rows in nope.groupby("task", sort=False):
        split = "OOD" if (rows["split"] == "OOD").any() else rows["split"].iloc[0]
        rows = rows[rows["split"] == split]
        later = rows[rows["layer"] >= 1]
        first = rows[rows["layer"] == 0]
        if later.empty:
            continue
        best = later.loc[later["max_score"].idxmax()]
        l0 = float(first["max_score"].max()) if len(first) else float("nan")
        value = float(best["max_score"])
        good, ahead = value >= GOOD_R2, not value - l0 < MARGIN_R2
        statuses.append(
            SUPPORTED if good and ahead else NOT_SUPPORTED if not (good or ahead) else INCONCLUSIVE
        )
        parts.append(
            f"{task} NoPE: best head distance R2 {_fmt(value)} in layer "
            f"{best['layer']} ({split}; layer 0: {_fmt(l0)})"
        )
    if not parts:
        return "Inconclusive: no NoPE checkpoint with more than one layer to test"
    return claim_line(
        statuses,
        "NoPE's later layers attend by relative distance (their logits depend on n - m)",
        "; ".join(parts),
    )


def similarity_verdict(task: str, ranking: pd.DataFrame) -> str:
    """Claim 4: NoPE's attention is closest to T5's among the reference PEs (the second NoPE
    seed left out). Supported when T5 ranks first with its 95% CI below the runner-up's;
    not supported when another PE's CI lies wholly below T5's; inconclusive otherwise."""
    from nopeinterp.similarity.compare import NOPE_PRIME

    split = "OOD" if (ranking["split"] == "OOD").any() else ranking["split"].iloc[0]
    rows = ranking[ranking["split"] == split].sort_values("rank")
    order = " < ".join(f"{r} {m:.3f}" for r, m in zip(rows["ref"], rows["mean"], strict=True))
    numbers = f"{task}, {split}, divergence from NoPE: {order} (paper: {PAPER_SIMILARITY_ORDER})"
    refs = rows[rows["ref"] != NOPE_PRIME]
    t5 = refs[refs["ref"] == "t5"]
    status = INCONCLUSIVE
    if len(t5) and {"ci_low", "ci_high"} <= set(refs.columns):
        others = refs[refs["ref"] != "t5"]
        low, high = float(t5["ci_low"].iloc[0]), float(t5["ci_high"].iloc[0])
        if others.empty:
            status = INCONCLUSIVE
        elif int(t5["rank"].iloc[0]) == int(refs["rank"].min()) and high < others["ci_low"].min():
            status = SUPPORTED
        elif (others["ci_high"] < low).any():
            status = NOT_SUPPORTED
    return claim_line([status], "NoPE's attention looks most like T5's relative bias", numbers)


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
    sections=None,
    **changes,
) -> Path:
    """Run every analysis on the checkpoints in `checkpoints` and write `<out>/index.html`
    (returned); see the module docstring. `options` (`nopeinterp.options.ReportOptions`), or
    any of its fields, say how much of each analysis runs; `sections` (default `SECTIONS`)
    which sections the page has.

    Runs with `options.threads` torch threads (one by default), restored afterwards. Everything
    is written into a fresh folder beside `out` that replaces `out` only when the page is
    done: an interrupted run leaves the previous report whole (never a mix of two runs), and
    `out` holds only this run's files. What a killed run left beside `out` is removed by the
    next; two reports on one `out` at once are refused (a lock beside it).
    """
    import torch

    from nopeinterp._io import try_lock
    from nopeinterp.errors import NopeinterpError

    opts = ReportOptions.make(options, **changes)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NopeinterpError(f"{out}: exists and is not a folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = try_lock(out.with_name(f".{out.name}.lock"))
    if lock is None:
        raise NopeinterpError(f"{out}: another report is being written there; let it finish")
    fresh = _sibling(out, "new")
    before = torch.get_num_threads()
    torch.set_num_threads(opts.threads)
    try:
        _clean_siblings(out)
        _run_main_job(checkpoints, fresh, opts, SECTIONS if sections is None else sections)
        _swap_in(fresh, out)
    finally:
        torch.set_num_threads(before)
        if fresh.exists():
            import shutil

            shutil.rmtree(fresh, ignore_errors=True)
        lock.release()
    index = out / "index.html"
    print(f"\nreport written to {index} ({index.stat().st_size / 2**20:.1f} MiB)")
    return index


def _sibling(out: Path, kind: str) -> Path:
    """A new hidden folder name next to `out` (same file system: renames are atomic)."""
    import secrets

    return out.with_name(f".{out.name}.{kind}-{secrets.token_hex(4)}")


def _clean_siblings(out: Path) -> None:
    """Remove the hidden folders a killed report left beside `out` (called under the report's
    lock). Where a kill came between the two renames of `_swap_in`'s fallback, `out` is
    missing and its previous report waits in an "old" folder: that one is put back first."""
    import shutil

    olds = sorted(out.parent.glob(f".{out.name}.old-*"))
    if olds and not out.exists():
        olds.pop().rename(out)
    for stale in [*olds, *out.parent.glob(f".{out.name}.new-*")]:
        shutil.rmtree(stale, ignore_errors=True)


def _swap_in(fresh: Path, out: Path) -> None:
    """Put `fresh` in `out`'s place; the previous `out`, if any, is removed afterwards. The
    swap is one atomic exchange where the system has one (Linux), so a kill at any moment
    leaves `out` holding one whole report."""
    import shutil

    from nopeinterp._io import exchange

    old = None
    if out.exists():
        if exchange(fresh, out):  # `fresh` now holds the previous report
            shutil.rmtree(fresh, ignore_errors=True)
            return
        old = _sibling(out, "old")
        out.rename(old)
    try:
        fresh.rename(out)
    except OSError:
        if old is not None:
            old.rename(out)  # the previous report back in place
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- the sections: each computes from the checkpoints and says what the page shows --------------
@dataclass
class Zoo:
    """What every section reads: the checkpoints (loaded once), the options and the output."""

    directory: str
    entries: list
    ckpts: dict
    opts: ReportOptions
    out: Path

    @property
    def tasks(self) -> list[str]:
        from nopeinterp import zoo

        return zoo.tasks_of(self.entries)


@dataclass
class Found:
    """What one section found: a verdict, the tables printed on the terminal, and the page's
    items ((Figure | DataFrame | ExplorerData | text, caption)); results are saved as found."""

    verdict: str
    printed: list = field(default_factory=list)  # (title, DataFrame)
    items: list = field(default_factory=list)  # (item, caption or None)
    note: str | None = None  # plain text after the items


def length_generalization(z: Zoo) -> Found:
    from nopeinterp.evaluation import EvalResult, accuracy_by_split, evaluate

    n = z.opts.n
    evaluation = EvalResult.concat(
        evaluate(z.ckpts[e.name], n=n, progress=z.opts.progress) for e in z.entries
    )
    names = pd.DataFrame([{"model": e.name, "task": e.task, "seed": e.seed} for e in z.entries])
    summary = evaluation.summary.merge(names, on="model")
    wide = accuracy_by_split(summary, ["task", "model"])
    evaluation.save(z.out / "length_generalization", html=False)
    return Found(
        length_verdict(summary),
        printed=[(f"Length generalization: exact match ({n} examples per length)", wide)],
        items=[
            (evaluation.figure(), None),
            (wide, "Exact match, mean over ID / OOD lengths"),
            (evaluation.table, "Exact match per length"),
        ],
        note=f"{n} examples per length, greedy decoding. A learned APE cannot read "
        "sequences past its table: those lengths are marked and left out of its mean.",
    )


def position_probes(z: Zoo) -> Found | None:
    from nopeinterp import zoo
    from nopeinterp.probing import probe_position

    found = Found("")
    tables = {}
    for task in z.tasks:
        nope = zoo.get(z.entries, task, "nope")
        if nope is None:
            continue
        n = z.opts.n_probe
        result = probe_position(
            z.ckpts[nope.name], n_train=n, n_eval=n // 2, progress=z.opts.progress
        )
        pivot = result.pivot().reset_index()
        found.printed.append(
            (
                f"Position probes, {nope.name} (R2 / MAE per layer; [random_init] = same "
                "config, untrained)",
                pivot,
            )
        )
        result.save(z.out / f"probe_position_{task}", html=False)
        tables[task] = result.table
        found.items += [
            (result.figure(), f"{task}: linear position probes per layer"),
            (pivot, f"{task}: probe metrics per layer"),
        ]
    if not tables:
        return None
    found.verdict = probe_verdict(tables)
    return found


def relative_distance(z: Zoo) -> Found | None:
    from nopeinterp.probing import distance_dependence
    from nopeinterp.viz.report import distance_figure, rel_mass_figure

    wanted = set(z.opts.distance_pes)
    distance = {}
    for e in z.entries:
        if e.seed != 0 or not (e.pe == "nope" or "all" in wanted or e.pe in wanted):
            continue
        result = distance_dependence(
            z.ckpts[e.name], n_eval=z.opts.n_distance, progress=z.opts.progress
        )
        result.save(z.out / "distance_dependence" / e.name, html=False)
        distance[(e.task, e.pe)] = result
    if not distance:
        return None
    dsum = distance_summary(distance)
    n = z.opts.n_distance
    return Found(
        distance_verdict(dsum),
        printed=[("Distance dependence (max over heads of R2 of logits on n - m)", dsum)],
        items=[
            (distance_figure(dsum), None),
            (rel_mass_figure(distance), None),
            (dsum, "Distance R2 per task, PE, split and layer (mean / max over heads)"),
        ],
        note="Score: R2 of logit[n, m] ~ a_row + f(n - m) over the causal cells, relative to "
        "the row-centred logits; 1 = the head's logits depend on relative distance only. "
        f"{n} ID and {n} OOD sequences per checkpoint.",
    )


def _similarity_models(z: Zoo):
    """(task, NoPE entry, NoPE-prime entry or None, {pe: path}) of the attention comparison,
    or None without a NoPE checkpoint."""
    from nopeinterp import zoo

    task = zoo.analysis_task(z.entries)
    if zoo.get(z.entries, task, "nope") is None:
        return None
    nope, prime = zoo.nope_pair(z.entries, task)
    return task, nope, prime, zoo.references(z.entries, task)


def attention_similarity(z: Zoo) -> Found | None:
    from nopeinterp.similarity import compare_attention

    found = _similarity_models(z)
    if found is None:
        return None
    task, nope, prime, refs = found
    n = z.opts.n_per_length
    result = compare_attention(
        z.ckpts[nope.name],
        {pe: z.ckpts[path.stem] for pe, path in refs.items()},
        nope_prime=z.ckpts[prime.name] if prime else None,
        n_per_length=n,
        progress=z.opts.progress,
    )
    result.save(z.out / f"attention_similarity_{task}", html=False)
    return Found(
        similarity_verdict(task, result.ranking),
        printed=[
            (
                f"Attention divergence from NoPE, {task} (true JSD, min over head pairs; "
                "closest first)",
                result.ranking,
            )
        ],
        items=[
            (result.figure(), None),
            (result.ranking, "Ranking, closest to NoPE first (95% bootstrap CI)"),
            (result.table, "Divergence per reference, layer and split"),
        ],
        note=f"Jensen-Shannon divergence (nats) per query row, min over head pairs, mean over "
        f"{n} examples per length; nope_prime (a second NoPE seed) is the noise floor.",
    )


def attention_explorer(z: Zoo) -> Found | None:
    from nopeinterp.data import max_positions
    from nopeinterp.similarity.explorer import explorer_data

    found = _similarity_models(z)
    if found is None:
        return None
    task, nope, prime, refs = found
    models = {"nope": z.ckpts[nope.name].model}
    if prime:
        models[prime.pe + "-seed" + str(prime.seed)] = z.ckpts[prime.name].model
    models.update({pe: z.ckpts[path.stem].model for pe, path in refs.items()})
    limits = [m for m in map(max_positions, models.values()) if m is not None]
    examples, example_names = explorer_examples(
        z.ckpts[nope.name],
        min(limits) if limits else None,
        per_split=z.opts.explorer_per_split,
    )
    if not examples:
        return None
    data = explorer_data(
        models,
        examples,
        labels=z.ckpts[nope.name].tokenizer,
        example_names=example_names,
        left="nope",
        reference=next(iter(refs), None),
    )
    longest = max(len(e) for e in examples)
    return Found(
        f"{task}: {len(models)} models, {len(data.layers)} layers x {data.n_heads} "
        f"heads, {len(examples)} examples of up to {longest} tokens"
        + (f" (every model reads at most {min(limits)} positions)" if limits else ""),
        items=[(data, None)],
    )


def head_taxonomy(z: Zoo) -> Found:
    """What dominates each head, per seed-0 checkpoint. Position erasure is too slow for the
    main job; its results are in analyses/results/causal_*."""
    from nopeinterp.probing import classify_heads
    from nopeinterp.probing.heads import KINDS, label_counts

    rows = []
    for e in z.entries:
        if e.seed != 0:
            continue
        tax = classify_heads(z.ckpts[e.name], n_eval=z.opts.n_heads, progress=z.opts.progress)
        first = tax.table.split.iloc[0]  # the ID split
        counts = label_counts(tax.table).set_index("split").loc[first]
        rows.append({"task": e.task, "pe": e.pe, **{k: int(counts[k]) for k in KINDS}})
    heads = pd.DataFrame(rows)
    positional = [k for k in KINDS if k != "content"]
    nope = heads[heads.pe == "nope"]
    return Found(
        f"NoPE: {int(nope[positional].to_numpy().sum())} of "
        f"{int(nope[list(KINDS)].to_numpy().sum())} heads are positional "
        f"({', '.join(positional)}); labels and thresholds: nopeinterp.probing.heads",
        printed=[("Head taxonomy (heads per label, ID split)", heads)],
        items=[(heads, None)],
    )


@dataclass(frozen=True)
class Section:
    """One section of the report page: its heading and what computes it."""

    title: str
    compute: Callable[[Zoo], Found | None]


# The report, in page order. A section whose computation finds nothing to show is left out.
SECTIONS = (
    Section("Length generalization (claim 1)", length_generalization),
    Section("Theorem 1: absolute position in NoPE", position_probes),
    Section("Theorem 2: relative distance in later layers", relative_distance),
    Section("Attention similarity: what NoPE learns (claim 4)", attention_similarity),
    Section("Attention explorer", attention_explorer),
    Section("Heads: what dominates each head", head_taxonomy),
)


def load_zoo(checkpoints, out, opts: ReportOptions) -> Zoo:
    """Every checkpoint of the folder, loaded once, for the sections to share."""
    from nopeinterp import zoo

    entries = zoo.find_checkpoints(checkpoints)
    return Zoo(str(checkpoints), entries, {e.name: e.load() for e in entries}, opts, Path(out))


def _run_main_job(checkpoints, out, opts: ReportOptions, sections) -> Path:
    """The main job with resolved options (see `run_main_job`): each section of `sections`
    computed, printed and put on the page, in order."""
    from nopeinterp.viz.page import Page

    z = load_zoo(checkpoints, out, opts)
    page = Page(
        "nopeinterp: positional encodings and length generalization",
        intro=(
            f"{len(z.entries)} checkpoints from {checkpoints} (tasks: {', '.join(z.tasks)}). "
            "Claims of Kazemnejad et al. 2023; each section opens with a verdict computed from "
            "its numbers."
        ),
    )
    for section in sections:
        found = section.compute(z)
        if found is None:
            continue
        for title, table in found.printed:
            _print(title, table)
        sec = page.section(section.title, verdict=found.verdict)
        for item, caption in found.items:
            sec.add(item, caption=caption)
        if found.note:
            sec.text(found.note)
    return page.write(z.out / "index.html", max_bytes=PAGE_MAX_BYTES)
