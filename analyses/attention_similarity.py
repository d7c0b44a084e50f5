"""Which PE does NoPE attend like? JSD of NoPE's attention against every other PE and NoPE-prime.

    python analyses/attention_similarity.py [--checkpoints checkpoints] [--quick] [--task scan]

The paper's analysis (Sec. 5), with `nopeinterp.similarity.compare_attention`: teacher-forced
full sequences, `n_per_length` (10, as the paper) per ID and per OOD length of the task; per
(example, layer) the divergence between NoPE's and the reference's attention rows, reduced
over head pairs; mean over examples with a 95% bootstrap CI over examples, per layer and over
layers ("all": each example's layer mean first), ID vs OOD. It is run twice:

- ours: the true Jensen-Shannon divergence (nats, <= ln 2), min over all head pairs, query row
  0 (always 0) skipped -- `heads="min"`;
- paper-compatible: `paper_compat=True`, the official code's "jsd" (0.5 (KL(M||P) + KL(M||Q)),
  unbounded), its head pairs (i < j only) and row 0 included: the number to set beside the
  paper's (NoPE' 0.26/0.29, T5 0.25/0.30, ALiBi 0.44/0.62, APE 0.65/0.89, Rotary 0.90/1.22).

Both on seed 0 (`<task>-<pe>.pt`, NoPE-prime `<task>-nope-seed1.pt`). If the folders hold
further seeds of every PE (`<task>-<pe>-seed<k>.pt`, see train_reference.py --seeds), the true
JSD is also computed per seed s, NoPE seed s against each PE's seed s, NoPE-prime being the
next NoPE seed (s + 1, cyclically), as the paper averages over seeds: the spread across
training runs, which the bootstrap over examples does not see.

At one seed every PE starts from NoPE's initial weights and sees its batches, so a same-seed PE
shares with NoPE what NoPE-prime does not. A second ranking takes every reference from the next
seed (NoPE seed s against each PE's and NoPE's seed s + 1): all share as little with NoPE, so
there NoPE-prime is a fair floor ("as close to NoPE as another NoPE").
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from _common import parser, print_written, run_script, write_figure, write_table

from nopeinterp.checkpoint import load_checkpoint
from nopeinterp.errors import NopeinterpError
from nopeinterp.zoo import checkpoint_name, find_checkpoints, nope_pair, over_seeds, references

# Kazemnejad et al. 2023, SCAN, mean over lengths, their "jsd" (= our paper_compat); their
# APE is sinusoidal.
PAPER = {
    ("nope_prime", "ID"): 0.26, ("nope_prime", "OOD"): 0.29,
    ("t5", "ID"): 0.25, ("t5", "OOD"): 0.30,
    ("alibi", "ID"): 0.44, ("alibi", "OOD"): 0.62,
    ("sinusoidal", "ID"): 0.65, ("sinusoidal", "OOD"): 0.89,
    ("rotary", "ID"): 0.90, ("rotary", "OOD"): 1.22,
}  # fmt: skip
KEY = ["ref", "layer", "split"]


def side_by_side(ours: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """One row per (ref, layer, split): true JSD and paper-compatible value with their CIs."""
    stats = ["mean", "ci_low", "ci_high"]
    a = ours[KEY + stats + ["n"]].rename(columns={s: f"jsd_{s}" for s in stats})
    b = paper[KEY + stats].rename(columns={s: f"paper_jsd_{s}" for s in stats})
    a["layer"], b["layer"] = a["layer"].astype(str), b["layer"].astype(str)
    out = a.merge(b, on=KEY, how="outer")
    out["paper_reported"] = [
        PAPER.get((r, s)) if layer == "all" else None
        for r, s, layer in zip(out.ref, out.split, out.layer, strict=True)
    ]
    order = {"all": -1}
    out["_l"] = [order.get(x, int(x) if x.isdigit() else 99) for x in out.layer]
    out["_s"] = out.split.map({"ID": 0, "OOD": 1}).fillna(2)
    out["_r"] = out.ref.map({r: i for i, r in enumerate(dict.fromkeys(ours.ref))})
    out = out.sort_values(["_l", "_s", "_r"]).drop(columns=["_l", "_s", "_r"])
    return out[[*KEY, "n", *[c for c in out.columns if c not in [*KEY, "n"]]]].reset_index(
        drop=True
    )


def across_seeds(infos: dict, task: str, common: dict, refs_seed: str = "same") -> pd.DataFrame:
    """True-JSD ranking per seed with a complete set of PEs (see the module docstring). The
    PEs come from NoPE's seed (`refs_seed="same"`) or from NoPE-prime's (`"next"`)."""
    if refs_seed not in ("same", "next"):
        raise ValueError(f"refs_seed is 'same' or 'next', not {refs_seed!r}")
    from nopeinterp.similarity import compare_attention

    pes = sorted({i.pe for i in infos.values() if i.pe != "nope"})
    seeds = sorted(
        s
        for s in {i.seed for i in infos.values()}
        if all(checkpoint_name(task, pe, s) in infos for pe in ["nope", *pes])
    )
    if len(seeds) < 2:
        return pd.DataFrame()
    rankings = []
    for k, s in enumerate(seeds):
        prime = seeds[(k + 1) % len(seeds)]
        ref = s if refs_seed == "same" else prime
        t0 = time.perf_counter()
        result = compare_attention(
            infos[checkpoint_name(task, "nope", s)].load(),
            {pe: infos[checkpoint_name(task, pe, ref)].load() for pe in pes},
            nope_prime=infos[checkpoint_name(task, "nope", prime)].load(),
            heads="min",
            **common,
        )
        print(
            f"  seed {s} (NoPE-prime: seed {prime}): {time.perf_counter() - t0:.1f} s", flush=True
        )
        rankings.append(result.ranking.assign(seed=s, ref_seed=ref, nope_prime_seed=prime))
    return pd.concat(rankings, ignore_index=True)


def seed_summary(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per (split, ref): mean, min and max over seeds of the true JSD, and the ranks it got."""
    keys = ["split", "ref"]
    out = over_seeds(per_seed, keys, ["mean"]).rename(
        columns={"mean_mean": "jsd_mean_over_seeds", "mean_min": "jsd_min", "mean_max": "jsd_max"}
    )
    ranks = per_seed.groupby(keys, sort=False)["rank"].agg(
        lambda r: " ".join(str(int(x)) for x in r)
    )
    out = out.merge(ranks.rename("ranks").reset_index(), on=keys)
    out = out.sort_values(["split", "jsd_mean_over_seeds"], kind="stable")
    return out.reset_index(drop=True)


def main(argv=None) -> list[Path]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--task", default="scan", help="task (default scan, as the paper)")
    p.add_argument("--n-per-length", type=int, default=None, help="examples per length (10)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples")
    args = p.parse_args(argv)
    n_per_length = args.n_per_length or (2 if args.quick else 10)
    from nopeinterp.similarity import compare_attention

    entries = find_checkpoints(args.checkpoints, [args.task])
    infos = {i.name: i for i in entries}
    nope_name, prime_name = (
        checkpoint_name(args.task, "nope"),
        checkpoint_name(args.task, "nope", 1),
    )
    if nope_name not in infos:
        raise NopeinterpError(f"no {nope_name}.pt in {args.checkpoints}")
    # the models the report compares: NoPE and NoPE-prime (seeds 0 and 1), every other PE's seed 0
    nope_entry, prime_entry = nope_pair(entries, args.task)
    nope = nope_entry.load()
    try:
        refs = {pe: load_checkpoint(path) for pe, path in references(entries, args.task).items()}
    except NopeinterpError:  # no other PE: NoPE-prime alone is still informative
        refs = {}
    prime = prime_entry.load() if prime_entry else None
    if prime is None:
        print(f"note: no {prime_name}.pt: no NoPE-prime noise floor")
    if not refs and prime is None:
        raise NopeinterpError(f"nothing to compare {nope_name} with in {args.checkpoints}")
    if not refs:  # compare_attention needs one ref; NoPE-prime alone is still informative
        refs, prime = {"nope_seed1": prime}, None
    common = dict(
        nope_prime=prime, n_per_length=n_per_length, n_boot=args.n_boot, progress=args.progress
    )
    results = {}
    for label, kwargs in (("jsd", {"heads": "min"}), ("paper_jsd", {"paper_compat": True})):
        t0, c0 = time.perf_counter(), time.process_time()
        results[label] = compare_attention(nope, refs, **common, **kwargs)
        print(f"  {label}: {time.perf_counter() - t0:.1f} s ({time.process_time() - c0:.1f} s CPU)",
              flush=True)  # fmt: skip
    ours, paper = results["jsd"], results["paper_jsd"]
    table = side_by_side(ours.table, paper.table)
    ranking = ours.ranking.merge(
        paper.ranking[["split", "ref", "rank", "mean"]].rename(
            columns={"rank": "paper_jsd_rank", "mean": "paper_jsd_mean"}
        ),
        on=["split", "ref"],
        how="left",
    ).rename(columns={"rank": "jsd_rank", "mean": "jsd_mean", "ci_low": "jsd_ci_low",
                      "ci_high": "jsd_ci_high"})  # fmt: skip
    ranking["paper_reported"] = [PAPER.get(k) for k in zip(ranking.ref, ranking.split, strict=True)]
    per_example = pd.concat(
        [ours.per_example, paper.per_example], ignore_index=True
    )  # metric column tells them apart

    pd.set_option("display.width", 250)
    fmt = {"float_format": lambda v: f"{v:.3f}", "index": False}
    print(f"\n== NoPE vs each PE on {args.task}: mean over layers, ranked by true JSD ==")
    print(ranking.to_string(**fmt))
    print("\n== Per layer: true JSD (min over head pairs) and paper-compatible value, 95% CIs ==")
    print(table.to_string(**fmt))
    out = Path(args.out)
    quick = " QUICK RUN (--quick): too few examples for conclusions." if args.quick else ""
    notes = (
        f"Task {args.task}, {n_per_length} teacher-forced examples per ID and OOD length; mean "
        "over examples, 95% bootstrap CI over examples; layer 'all' = each example's mean over "
        "layers. jsd: true Jensen-Shannon divergence (nats), min over all head pairs, row 0 "
        "skipped. paper_jsd: the official code's metric and head pairs (paper_compat=True). "
        "paper_reported: the paper's SCAN numbers (its APE is sinusoidal)." + quick
    )
    paths = [
        *write_table(table, out, "attention_similarity", title="Attention divergence from NoPE",
                     notes=notes),
        *write_table(ranking, out, "attention_similarity_ranking",
                     title="Closest to NoPE first (by true JSD)", notes=notes),
        *write_table(per_example, out, "attention_similarity_per_example",
                     title="Per example and layer", notes=notes),
        *write_figure(ours.figure(), out, "attention_similarity_jsd"),
        *write_figure(paper.figure(), out, "attention_similarity_paper_jsd"),
    ]  # fmt: skip
    per_seed_common = {k: v for k, v in common.items() if k != "nope_prime"}
    for refs_seed, name, summary_name, pe_seed, why in (
        ("same", "seeds", "seed_summary", "s", ""),
        ("next", "cross_seeds", "cross_seed_summary", "s+1",
         " Every reference from another seed than NoPE's: none shares its initial weights or "
         "batches, so NoPE-prime is a fair floor here."),
    ):  # fmt: skip
        per_seed = across_seeds(infos, args.task, per_seed_common, refs_seed=refs_seed)
        if not len(per_seed):
            continue
        summary = seed_summary(per_seed)
        print(f"\n== True JSD across training seeds (NoPE seed s vs PE seed {pe_seed}) ==")
        print(summary.to_string(**fmt))
        seed_notes = notes + (
            f" Per seed s: NoPE seed s vs each PE's seed {pe_seed}, NoPE-prime = NoPE seed s+1 "
            "(cyclically); ranks: the rank in each seed, in seed order." + why
        )
        paths += [
            *write_table(per_seed, out, f"attention_similarity_{name}",
                         title=f"True JSD ranking per training seed (PEs of seed {pe_seed})",
                         notes=seed_notes),
            *write_table(summary, out, f"attention_similarity_{summary_name}",
                         title=f"True JSD across training seeds (PEs of seed {pe_seed})",
                         notes=seed_notes),
        ]  # fmt: skip
    print_written(paths)
    return paths


if __name__ == "__main__":
    run_script(main)
