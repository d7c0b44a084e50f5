"""Reproduction v3: converged models at the paper's head width, as analyses/PROTOCOL.md
("Protocol of the reproduction grid, version 3") fixes it.

    python analyses/reproduction_v3.py grid [--commit] [--workers 1]   # on CPU, resumable
        [--splits rsc mc] [--seeds 0]                                  # a part (same runs)
    python analyses/reproduction_v3.py gpu [--workers 8] [--commit]    # on a GPU node, bf16
    python analyses/reproduction_v3.py table [--out DIR]               # tables, comparison
    python analyses/reproduction_v3.py report                          # REPORT.md's section, verdicts
    python analyses/reproduction_v3.py rebuild [--splits rsc mdlen]    # checkpoints made here
    python analyses/reproduction_v3.py analyse [--splits rsc mdlen]    # claims 2-4 (_claim_rules.py)

Every run: `--preset repro-t5` (the paper's T5 decoder, 4 layers, 2 heads of 64, d_model 128),
learning rate V3_LR, trained until ID validation exact match >= 0.95 on two evaluations in a
row or V3_STEPS (best-by-validation checkpoint tested, as the paper). Checkpoints go under
runs/reproduction/v3/ (git-ignored); each finished run's record is copied to
analyses/results/reproduction/v3/lr=<lr>/<run>.json and, with `--commit`, committed at once,
so any machine resumes the grid where the last one stopped (a run whose record is committed
is not run again). The order: seed 0 of every (split, PE), then seed 1, then seed 2.

`gpu` first trains one short run (V3_CHECK) on the CPU in fp32 and on the GPU in bf16 and
stops (exit 2) unless their training losses agree (GPU_CHECK_RTOL); then it runs the grid with
`--workers` runs at once on the one GPU, in bf16 autocast, writing records in the same place
and format (each record's config says its precision, its throughput its device).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import torch

from nopeinterp.errors import NopeinterpError
from nopeinterp.paper import FIVE_PES
from nopeinterp.training.sweep import RECORD, run_name, run_sweep

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reproduction as repro  # noqa: E402
from _claim_rules import claim4_verdict, theorem1_verdict, theorem2_verdict  # noqa: E402

PRESET = "repro-t5"
V3_SPLITS = ("rsc", "rdc", "mc", "mdlen")
V3_SEEDS = (0, 1, 2)
V3_LR = 1e-3
V3_STEPS = 8000
V3_STOP = repro.PILOT_STOP  # ID validation exact match >= 0.95 on two evaluations in a row
V3_TARGET = V3_STOP["stop_at_val"]
# each batch in 4 groups of similar length (the same loss on less padding: bench/length_groups.py);
# from reverse.variant=mc-t5-seed0 on (PROTOCOL v3, "Changes after the runs started")
V3_LENGTH_GROUPS = 4
V3 = Path("v3")  # the grid's folder under runs/reproduction/ and results/reproduction/
# the GPU's short agreement run: (split, PE, seed, steps)
V3_CHECK = ("rsc", "nope", 0, 600)
GPU_CHECK_RTOL = 0.15  # mean training loss over the check's last half, GPU vs CPU


def overrides(**extra) -> dict:
    return {"lr": V3_LR, "steps": V3_STEPS, **V3_STOP, "length_groups": V3_LENGTH_GROUPS, **extra}


def v3_runs(splits=V3_SPLITS, seeds=V3_SEEDS) -> list[str]:
    """The run names of the grid (or a part), in the protocol's order (seed-major)."""
    return [
        run_name(spec)
        for seed in seeds
        for split in splits
        for spec in repro.split_runs(split, [seed])
    ]


def _check_part(splits, seeds) -> tuple[list[str], list[int]]:
    splits = list(V3_SPLITS if splits is None else splits)
    seeds = list(V3_SEEDS if seeds is None else seeds)
    bad = [s for s in splits if s not in V3_SPLITS] + [str(s) for s in seeds if s not in V3_SEEDS]
    if bad:
        raise NopeinterpError(
            f"not in the protocol: {', '.join(bad)} (splits {', '.join(V3_SPLITS)}; "
            f"seeds {', '.join(map(str, V3_SEEDS))})"
        )
    return [s for s in V3_SPLITS if s in splits], [s for s in V3_SEEDS if s in seeds]


def run_grid(splits=None, seeds=None, workers=1, commit=False, extra=None) -> None:
    """The grid (or a part) in the protocol's order; resumable; `extra`: run-only settings
    (device, precision) that change no setting of the protocol."""
    splits, seeds = _check_part(splits, seeds)
    folder = V3 / repro.lr_folder(V3_LR)
    wanted = set(v3_runs(splits, seeds))
    for run in repro.restore_records(V3_LR, wanted, tested_only=True, folder=folder):
        print(f"{run}: committed record restored", flush=True)

    def log(line: str) -> None:
        print(line, flush=True)
        run, _, status = line.partition(": ")
        if status in ("finished", "tested") and (repro.RUNS / folder / run / RECORD).exists():
            dest = repro.RECORDS / folder / f"{run}.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repro.RUNS / folder / run / RECORD, dest)
            if commit:
                repro.commit_records([dest], f"reproduction v3: record of {run}")

    for seed in seeds:
        run_sweep(
            [repro.task_spec(s) for s in splits], FIVE_PES, [seed], repro.RUNS / folder,
            preset=PRESET, overrides=overrides(**(extra or {})), workers=workers,
            test="eval_set", log=log,
        )  # fmt: skip


ANALYSED = ("rsc", "mdlen")  # the protocol's claims 2-4 run on these splits' checkpoints


def rebuild(splits=ANALYSED, seeds=None, workers: int = 1) -> list[Path]:
    """Train again here, with the protocol's settings, the committed runs of `splits` x `seeds`
    whose checkpoint is not on this machine (the protocol: "a checkpoint not on the machine is
    trained again from its record's config and said so"); rebuilt_runs.* under
    results/reproduction/v3/lr=<lr>/analyses/ says which and how far each is from its record."""
    splits, seeds = _check_part(splits, seeds)
    folder = V3 / repro.lr_folder(V3_LR)
    runs = grid_runs()
    runs = runs[runs["split"].isin(splits) & runs["seed"].isin(seeds)]
    missing = runs[runs["status"] != "done"]
    if len(missing):
        first = missing.iloc[0]
        raise NopeinterpError(
            f"not in the grid's records yet (run `grid` first): {first['split']} "
            f"{first['pe']} seed {first['seed']}"
        )
    # each run is trained again with the length groups its record says
    paths = []
    for (split, seed, n), cell in runs.groupby(["split", "seed", "length_groups"], sort=False):
        paths = repro.rebuild(
            V3_LR, [split], [seed], workers, folder=folder, preset=PRESET,
            overrides=overrides(length_groups=int(n)), pes=list(cell["pe"]),
        )  # fmt: skip
    return paths


def analyse(splits=ANALYSED, quick: bool = False) -> None:
    """Claims 2-4 (position probes, distance dependence, attention similarity with NoPE-prime:
    the first grid's scripts) on this grid's finished checkpoints of `splits`, every seed
    there is, into analyses/results/reproduction/v3/lr=<lr>/analyses/<split>/."""
    splits, _ = _check_part(splits, None)
    repro.analyse(V3_LR, splits, quick=quick, folder=V3 / repro.lr_folder(V3_LR))


GPU_CHECK_DEVICES = (("cpu", "fp32"), ("cuda", "bf16"))  # (device, precision): reference, GPU


def gpu_check(out: Path | None = None, devices=GPU_CHECK_DEVICES) -> dict:
    """One short run on the CPU (fp32) and on the GPU (bf16): their training-loss curves, and
    whether the mean over the last half agrees within GPU_CHECK_RTOL. Dropout draws differ
    between the devices' generators, so the curves are close, not equal."""
    split, pe, seed, steps = V3_CHECK
    out = Path(out) if out is not None else repro.RUNS / V3 / "gpu-check"
    curves = {}
    for device, precision in devices:
        folder = out / f"{device}-{precision}"
        run_sweep(
            [repro.task_spec(split)], [pe], [seed], folder, preset=PRESET,
            overrides={"lr": V3_LR, "steps": steps, "device": device, "precision": precision},
            test="none", log=lambda line, d=device: print(f"[gpu check, {d}] {line}", flush=True),
        )  # fmt: skip
        (record,) = folder.glob(f"*/{RECORD}")
        curves[f"{device}-{precision}"] = json.loads(record.read_text())["val_curve"]
    late = {d: [h["loss"] for h in c if h["step"] > steps // 2] for d, c in curves.items()}
    mean = {d: sum(v) / len(v) for d, v in late.items()}
    ref, other = mean.values()
    rel = abs(other - ref) / ref
    return {
        "run": f"{split} {pe} seed {seed}, {steps} steps",
        "mean_late_loss": mean,
        "relative_difference": rel,
        "rtol": GPU_CHECK_RTOL,
        "agree": rel <= GPU_CHECK_RTOL,
        "curves": curves,
    }


def run_gpu(workers: int, commit: bool) -> None:
    if not torch.cuda.is_available():
        raise NopeinterpError("gpu: no CUDA device here; run `grid` on a CPU machine")
    check = gpu_check()
    path = repro.RECORDS / V3 / "gpu_check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(check, indent=1) + "\n")
    losses = ", ".join(f"{k} {v:.4f}" for k, v in check["mean_late_loss"].items())
    print(
        f"gpu check: mean training loss over the last half: {losses}; relative difference "
        f"{check['relative_difference']:.3f} (rtol {GPU_CHECK_RTOL})",
        flush=True,
    )
    if not check["agree"]:
        raise NopeinterpError(
            f"gpu: the GPU's short run disagrees with the CPU's (see {path}); no grid run started"
        )
    if commit:
        repro.commit_records([path], "reproduction v3: the GPU's agreement check")
    run_grid(workers=workers, commit=commit, extra={"device": "cuda", "precision": "bf16"})


def grid_runs(root: Path | None = None) -> pd.DataFrame:
    """Every run of the grid (60 rows) with its record's fields where it has one; `status`
    done or missing; `capped`: done without reaching V3_TARGET validation (kept everywhere)."""
    root = repro.RECORDS / V3 if root is None else root
    runs = repro.records(root)
    runs = runs[runs["lr"] == V3_LR]
    # 1: the padded batch (the grid's first runs, and records written before the setting)
    groups = {
        (r["split"], r["pe"], r["seed"]): r.get("config", {}).get("length_groups", 1)
        for r in repro._read_records(root)
        if r["lr"] == V3_LR
    }
    keys = zip(runs["split"], runs["pe"], runs["seed"], strict=True)
    runs = runs.assign(length_groups=[groups[k] for k in keys])
    full = pd.MultiIndex.from_product([list(V3_SPLITS), FIVE_PES, V3_SEEDS]).to_frame(
        index=False, name=["split", "pe", "seed"]
    )
    out = full.merge(runs, on=["split", "pe", "seed"], how="left")
    out["status"] = "missing"
    out.loc[out["ood_accuracy"].notna(), "status"] = "done"
    done = out["status"] == "done"
    out["reached_target"] = done & (out["val_accuracy"] >= V3_TARGET)
    out["capped"] = done & ~out["reached_target"]
    return out.drop(columns=["did_not_train"])


def convergence(runs: pd.DataFrame) -> pd.DataFrame:
    """Per split and PE: runs done, how many reached V3_TARGET validation, the share."""
    done = runs[runs["status"] == "done"]
    g = done.groupby(["split", "pe"], sort=False)
    out = pd.DataFrame({"runs": g.size(), "reached": g["reached_target"].sum().astype(int)})
    out["share_reached"] = out["reached"] / out["runs"]
    return repro.in_paper_order(out.reset_index(), "runs")


def against_v2(runs: pd.DataFrame) -> pd.DataFrame:
    """Per split and PE: the first grid's mean best validation and OOD exact match (1,500
    steps, d_head 16, its chosen rate) beside this grid's, over the seeds each has so far."""
    v2 = repro.records()
    v2 = v2[v2["lr"] == V3_LR]
    sides = {"v2": v2, "v3": runs[runs["status"] == "done"]}
    parts = []
    for name, df in sides.items():
        g = df[df["split"].isin(V3_SPLITS)].groupby(["split", "pe"])
        parts.append(
            g.agg(**{f"val_{name}": ("val_accuracy", "mean"), f"ood_{name}": ("ood_accuracy", "mean"),
                     f"seeds_{name}": ("seed", "nunique")})
        )  # fmt: skip
    out = pd.concat(parts, axis=1).reset_index()
    out["ood_change"] = out["ood_v3"] - out["ood_v2"]
    return repro.in_paper_order(out, "split")


def converging_changed(against: pd.DataFrame) -> pd.DataFrame:
    """Per split, over the PEs this grid has runs of so far: the mean best validation and OOD
    exact match of the first grid and of this one, NoPE's OOD in each, and each grid's best PE
    by mean OOD among those PEs (what training to convergence at d_head 64 changed)."""
    rows = []
    for split, df in against.dropna(subset=["ood_v3", "ood_v2"]).groupby("split", sort=False):
        nope = df[df["pe"] == "nope"]
        rows.append(
            {
                "split": split,
                "pes": len(df),
                "val_v2": df["val_v2"].mean(),
                "val_v3": df["val_v3"].mean(),
                "ood_v2": df["ood_v2"].mean(),
                "ood_v3": df["ood_v3"].mean(),
                "nope_ood_v2": nope["ood_v2"].iloc[0] if len(nope) else float("nan"),
                "nope_ood_v3": nope["ood_v3"].iloc[0] if len(nope) else float("nan"),
                "best_v2": df.loc[df["ood_v2"].idxmax(), "pe"],
                "best_v3": df.loc[df["ood_v3"].idxmax(), "pe"],
            }
        )
    return pd.DataFrame(rows, columns=[
        "split", "pes", "val_v2", "val_v3", "ood_v2", "ood_v3", "nope_ood_v2", "nope_ood_v3",
        "best_v2", "best_v3",
    ])  # fmt: skip


# The authors' extra-small decoder (official configs/models/t5a_xsmall.jsonnet: 3 layers,
# d_model 64, 2 heads of d_model / 2, d_ff 256); the paper's base size is the `paper` preset.
PAPER_XSMALL_SHAPE = {"n_layers": 3, "n_heads": 2, "d_head": 32, "d_model": 64, "d_mlp": 256}
SHAPE_KEYS = ("n_layers", "n_heads", "d_head", "d_model", "d_mlp")


def shapes() -> pd.DataFrame:
    """The three T5-decoder shapes the size comparison sets side by side, with their
    parameters outside the (vocabulary-sized) embedding, counted on the built model."""
    from nopeinterp.models import build_model
    from nopeinterp.training.presets import preset_values

    named = {
        "ours (v3)": preset_values(PRESET, "copy"),
        "paper base": preset_values("paper", "copy"),
        "paper xsmall": PAPER_XSMALL_SHAPE,
    }
    rows = []
    for model, values in named.items():
        shape = {k: values[k] for k in SHAPE_KEYS}
        built = build_model(
            "nope", arch="t5", d_vocab=2, n_ctx=64, device="meta", init_weights=False, **shape
        )
        params = sum(p.numel() for n, p in built.named_parameters() if not n.startswith("embed"))
        rows.append({"model": model, **shape, "params_non_embedding": params})
    return pd.DataFrame(rows)


def size_comparison(runs: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Per (split, PE) where the paper reports both of its sizes (copy splits; NoPE, T5,
    sinusoidal): our mean OOD exact match (this grid, seeds so far) beside the paper's base and
    extra-small decoders (``paper_aggregates``: its len_gen_experiments file, means over its
    seed runs) and the paper's per-run seed results that the MRR uses (`paper`, the
    `paper_runs()` table: another run set)."""
    from nopeinterp.paper import paper_aggregates

    agg = paper_aggregates()
    agg = agg[~agg["scratchpad"] & agg["split"].isin(V3_SPLITS)]
    sizes = agg.pivot_table(index=["split", "pe"], columns="model", values="ood_mean")
    sizes = sizes.rename(columns=lambda m: f"paper_{m}")
    done = runs[runs["status"] == "done"]
    ours = done.groupby(["split", "pe"]).agg(
        ours_v3=("ood_accuracy", "mean"), seeds_v3=("seed", "nunique")
    )
    seed_runs = paper.groupby(["split", "pe"])["ood_accuracy"].mean()
    out = sizes.join(ours, how="left").join(seed_runs.rename("paper_seed_runs"), how="left")
    cols = ["ours_v3", "seeds_v3", "paper_xsmall", "paper_base", "paper_seed_runs"]
    return repro.in_paper_order(out.reset_index()[["split", "pe", *cols]], "split")


# the analyses' files (written by `analyse`), per analysed split: summaries over seeds for the
# report's tables, per-seed files for the decision rules of claims 2-4
MECHANISM_FILES = {
    "probes": "position_probes_seeds.csv",
    "distance": "distance_dependence_seeds.csv",
    "similarity": "attention_similarity_seed_summary.csv",
    "similarity_cross_seeds": "attention_similarity_cross_seed_summary.csv",
    "probes_per_seed": "position_probes.csv",
    "distance_per_seed": "distance_dependence.csv",
    "rankings_cross_seeds": "attention_similarity_cross_seeds.csv",
}


def mechanisms() -> dict:
    """Claims 2-4 on this grid's checkpoints, per analysed split that `analyse` has written
    (with two seeds or more, as the cross-seed rankings need): `probes` (Theorem 1: the probe of
    absolute position after the first block, trained model and random init, over seeds),
    `distance` (Theorem 2: the distance-dependence score of the later layers, mean over them of
    the heads' mean, max over them of the heads' max), `similarity` and
    `similarity_cross_seeds` (NoPE's attention against each PE's and NoPE-prime's, JSD over
    seeds, with each PE of NoPE's seed and of the next seed), the per-seed files the decision
    rules read (`probes_per_seed`, `distance_per_seed`, `rankings_cross_seeds`), and `rebuilt`
    (the analysed runs trained again on this machine, against their records)."""
    base = repro.RECORDS / V3 / repro.lr_folder(V3_LR) / "analyses"
    rebuilt_path = base / "rebuilt_runs.csv"
    rebuilt = pd.read_csv(rebuilt_path) if rebuilt_path.exists() else pd.DataFrame()
    out = {}
    for split in ANALYSED:
        paths = {k: base / split / name for k, name in MECHANISM_FILES.items()}
        if not all(path.exists() for path in paths.values()):
            continue
        tables = {k: pd.read_csv(path) for k, path in paths.items()}
        probes = tables["probes"]
        tables["probes"] = probes.loc[probes["layer"] == 1, [
            "pe", "n_seeds", "ID r2_mean", "ID r2_min", "ID r2_max", "ID r2 [random_init]_mean",
            "OOD r2_mean", "OOD r2 [random_init]_mean",
        ]].reset_index(drop=True)  # fmt: skip
        distance = tables["distance"]
        tables["distance"] = (
            distance[distance["layer"] >= 1]
            .groupby(["pe", "split"], sort=False)
            .agg(
                score_mean_heads=("score_mean_heads_mean", "mean"),
                score_max_heads=("score_max_heads_mean", "max"),
                n_seeds=("n_seeds", "min"),
            )
            .reset_index()
        )
        tables["rebuilt"] = rebuilt[rebuilt["split"] == split] if len(rebuilt) else rebuilt
        out[split] = tables
    return out


CLAIMS = {
    1: "1. NoPE length-generalizes better than the explicit PEs",
    2: "2. Theorem 1: NoPE's first layer recovers absolute position",
    3: "3. Theorem 2: later layers attend by relative distance",
    4: "4. NoPE's attention is most like T5's",
}
# (claim, its rule, the per-seed file the rule reads)
MECHANISM_RULES = (
    (2, theorem1_verdict, "probes_per_seed"),
    (3, theorem2_verdict, "distance_per_seed"),
    (4, claim4_verdict, "rankings_cross_seeds"),
)


def verdicts(r: dict, found: dict) -> pd.DataFrame:
    """One row per claim (claim, verdict, evidence) by the protocol's rules: claim 1 from the
    results (`results()`), claims 2-4 per analysed split from `mechanisms()`; a claim without
    its inputs yet says so."""
    rows = []
    done = r["runs"][r["runs"]["status"] == "done"]
    if r["verdict"] is None:
        rows.append((CLAIMS[1], "no verdict yet", "no (split, seed) cell has all five PEs"))
    else:
        taus = ", ".join(
            f"{row.split} {row.kendall_tau:.2f}" for row in r["comparison"].agreement.itertuples()
        )
        rows.append((
            CLAIMS[1], r["verdict"],
            f"MRR on {sum(r['cells'].values())} complete (split, seed) cells; "
            f"{int(done['reached_target'].sum())} of {len(done)} runs reached {V3_TARGET} ID "
            f"validation, {int(done['capped'].sum())} capped below it; Kendall tau against the "
            f"paper's order: {taus}",
        ))  # fmt: skip
    for claim, rule, key in MECHANISM_RULES:
        if not found:
            rows.append(
                (CLAIMS[claim], "not analysed yet", f"`analyse` on {' and '.join(ANALYSED)}")
            )
            continue
        per_split = [
            (f"{split} ({int(tables['probes']['n_seeds'].min())} seeds)", *rule(tables[key]))
            for split, tables in found.items()
        ] + [(split, "not analysed yet", "") for split in ANALYSED if split not in found]
        rows.append((
            CLAIMS[claim],
            "; ".join(f"{split}: {verdict}" for split, verdict, _ in per_split),
            " / ".join(f"{split}: {evidence}" for split, _, evidence in per_split if evidence),
        ))  # fmt: skip
    return pd.DataFrame(rows, columns=["claim", "verdict", "evidence"])


def results(root: Path | None = None) -> dict:
    """Everything the tables and the report show, computed once from the committed records:
    runs, convergence, against_v2, converging_changed, size, status, the per-length test exact
    match (`by_length`, `repro.accuracy_by_length`); on complete (split, seed)
    cells also the paper comparison (`comparison`: per-split Kendall tau in its `agreement`),
    the ties-averaged MRR (`mrr_ties_averaged`), the seeds per split (`cells`) and the claim-1
    `verdict`."""
    from nopeinterp.paper import (
        RUN_COLUMNS,
        claim1_verdict,
        compare_with_paper,
        mrr_by_side,
        paper_runs,
    )

    runs = grid_runs(root)
    paper = paper_runs()
    done = runs[runs["status"] == "done"]
    hours = done["train_wall_s"].sum() / 3600
    out = {
        "runs": runs,
        "convergence": convergence(runs),
        "against_v2": against_v2(runs),
        "size": size_comparison(runs, paper),
        "by_length": repro.accuracy_by_length(V3_LR, repro.RECORDS / V3 if root is None else root),
        "status": (
            f"{len(done)} of {len(runs)} runs done; {int(done['reached_target'].sum())} "
            f"reached {V3_TARGET} ID validation, {int(done['capped'].sum())} capped at "
            f"{V3_STEPS} steps below it (kept in every table); {hours:.1f} h of training "
            "wall time"
        ),
        "comparison": None,
        "mrr_ties_averaged": None,
        "cells": {},
        "verdict": None,
    }
    out["converging_changed"] = converging_changed(out["against_v2"])
    ours = repro.complete_cells(runs)
    if not ours.empty:
        splits = [s for s in V3_SPLITS if s in set(ours["split"])]
        sides = {"ours": ours[list(RUN_COLUMNS)], "paper": paper}
        out["comparison"] = compare_with_paper(sides["ours"], sides["paper"], splits=splits)
        meta = out["comparison"].meta
        # the first grid's sensitivity view: tied PEs share their average rank
        out["mrr_ties_averaged"] = mrr_by_side(
            sides, splits=meta["mrr_splits"], tie_order=None, seed=meta["bootstrap_seed"]
        )
        out["cells"] = ours.groupby("split")["seed"].nunique().to_dict()
        out["verdict"] = claim1_verdict(out["comparison"].separation)
    return out


V2_NOTE = (
    "Mean best ID validation and OOD exact match per split and PE. v2: 1,500 steps, 8 heads "
    "of 16, the default architecture; v3: trained to 0.95 or 8,000 steps, 2 heads of 64, the "
    "T5 decoder. Means over the seeds each grid has (seeds_v2, seeds_v3)."
)
CHANGED_NOTE = (
    "What converging changed, split by split: means over the PEs this grid has runs of "
    "(`pes`) of the best ID validation and OOD exact match, v2 then v3; NoPE's OOD exact match "
    "in each; each grid's best PE by mean OOD among those PEs."
)
SIZE_NOTE = (
    "Size: mean OOD exact match where the paper reports two sizes of its decoder (copy splits; "
    "NoPE, T5 and sinusoidal only): ours (this grid, `seeds_v3` seeds so far) beside the "
    "authors' extra-small and base-size decoders (means over their seed runs, from their "
    "len_gen_experiments results) and, for the base size, the per-run seed results the MRR "
    "uses (`paper_seed_runs`; another set of runs of the same model)."
)
SHAPES_NOTE = "The three shapes (parameters outside the embedding, counted on the built model):"
TIES_NOTE = (
    "MRR with tied PEs sharing their average rank (the first grid's sensitivity view; not the "
    "protocol's MRR, which breaks ties in the paper's order):"
)


def table(out: Path | None = None, root: Path | None = None) -> list[Path]:
    """Print and write the grid's tables into `out` (default results/reproduction/v3/tables/):
    its runs, convergence, the first grid beside it and what converging changed, model size,
    and on complete (split, seed) cells the comparison with the paper (Kendall tau per split,
    MRR, the MRR separation, the ties-averaged MRR) and the claim-1 verdict."""
    from _common import print_written, write_table

    r = results(root)
    out = Path(out) if out is not None else repro.RECORDS / V3 / "tables"
    if (r["runs"]["status"] == "done").sum() == 0:
        raise NopeinterpError(f"{repro.RECORDS / V3}: no finished run of the grid yet")
    print(r["status"])
    paths = write_table(r["runs"], out, "runs", title="Reproduction v3: runs", notes=r["status"])
    print("\n" + r["convergence"].to_string(index=False))
    paths += write_table(
        r["convergence"], out, "convergence",
        title=f"Runs that reached {V3_TARGET} ID validation",
        notes="Per split and PE, over the runs done so far.",
    )  # fmt: skip
    paths += write_table(
        r["against_v2"], out, "against_v2", title="The first grid beside this one", notes=V2_NOTE
    )
    paths += write_table(
        r["converging_changed"], out, "converging_changed", title="What converging changed",
        notes=CHANGED_NOTE,
    )  # fmt: skip
    print("\n" + r["size"].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    paths += write_table(r["size"], out, "size", title="Model size", notes=SIZE_NOTE)
    paths += write_table(shapes(), out, "shapes", title="Model shapes", notes=SHAPES_NOTE)
    if len(r["by_length"]):
        paths += write_table(
            r["by_length"], out, "accuracy_by_length", title="Test exact match per length",
            notes="Mean, min and max over the seeds done so far (n_seeds) of each run's exact "
            "match at that length; every test item scored once.",
        )  # fmt: skip
    rows = verdicts(r, mechanisms())
    print("\n" + rows.to_string(index=False))
    paths += write_table(rows, out, "verdicts", title=VERDICTS_TITLE, notes=verdicts_note(r))
    if r["comparison"] is None:
        print("\nno complete (split, seed) cell yet: no comparison with the paper")
        print_written(paths)
        return paths
    cells = r["cells"]
    for name, df in r["comparison"].tables().items():
        print(f"\n{name}:\n" + df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        paths += write_table(
            df, out, name, title=name.replace("_", " "),
            notes=f"Complete (split, seed) cells only; seeds per split: {cells}.",
        )  # fmt: skip
    paths += write_table(
        r["mrr_ties_averaged"], out, "paper_comparison_mrr_ties_averaged",
        title="MRR with tied PEs sharing their average rank", notes=TIES_NOTE,
    )  # fmt: skip
    print(f"\nclaim 1 on complete cells (seeds per split {cells}): {r['verdict']}")
    verdict = pd.DataFrame([{"claim": 1, "verdict": r["verdict"], "cells": str(cells)}])
    paths += write_table(
        verdict, out, "claim1_verdict", title="Claim 1 by the protocol's decision rule",
        notes="NoPE above an explicit PE only if its MRR interval lies wholly above that PE's.",
    )  # fmt: skip
    print_written(paths)
    return paths


def mechanisms_lines(found: dict) -> list[str]:
    """The report's lines on claims 2-4 (`mechanisms()`), or a line saying they are to come."""
    from _common import to_markdown

    lines = ["### Claims 2-4 on this grid's checkpoints", ""]
    if not found:
        return [
            *lines,
            f"Not analysed yet: the protocol runs them on {' and '.join(ANALYSED)}, every "
            "seed, once those runs are done (`python analyses/reproduction_v3.py rebuild` "
            "where their checkpoints are not on the machine, then `analyse`).",
        ]
    lines += [
        "From `python analyses/reproduction_v3.py analyse` (the first grid's analysis scripts; "
        f"all files in analyses/results/reproduction/{V3 / repro.lr_folder(V3_LR)}/analyses/"
        "<split>/).",
        "",
    ]
    for split, tables in found.items():
        rebuilt = tables["rebuilt"]
        lines += [f"**{split}.**", ""]
        if len(rebuilt):
            lines += [
                f"{len(rebuilt)} of the analysed checkpoints were trained again on the machine "
                "that analysed them (`rebuild`), so they are new samples of their runs, not the "
                "recorded models: their OOD exact match differs from the record's by up to "
                f"{(rebuilt['ood_accuracy_rebuilt'] - rebuilt['ood_accuracy']).abs().max():.3f} "
                "(rebuilt_runs.md).",
                "",
            ]
        lines += [
            "Theorem 1: ridge probes of absolute position after the first block (R^2, mean "
            "[min, max] over seeds; the random-init model of the same config beside it):",
            "",
            to_markdown(tables["probes"]),
            "",
            "Theorem 2: distance dependence of the later layers (blocks 2 on), ID and OOD:",
            "",
            to_markdown(tables["distance"]),
            "",
            "Claim 4: JSD between NoPE's attention and each PE's (and another NoPE seed's, "
            "NoPE-prime), over seeds; ranks per seed:",
            "",
            to_markdown(tables["similarity"]),
            "",
            "The same with every reference from another seed than NoPE's (NoPE seed s against "
            "each PE's seed s+1; NoPE-prime is NoPE seed s+1): nothing compared shares NoPE's "
            "initial weights or batches, so NoPE-prime is a fair floor here, and claim 4's rule "
            "reads these rankings:",
            "",
            to_markdown(tables["similarity_cross_seeds"]),
            "",
        ]
    return lines


REPORT = Path(__file__).resolve().parent / "REPORT.md"
BEGIN, END = "<!-- reproduction-v3:begin -->", "<!-- reproduction-v3:end -->"


FIGURE = "ood_by_split"  # the report's figure, under results/reproduction/v3/


def ood_figure(runs: pd.DataFrame, paper: pd.DataFrame):
    """OOD exact match per PE, one panel per split: each of this grid's runs a point (filled:
    reached V3_TARGET ID validation; open: capped below it), the paper's runs of the same split
    beside them as grey diamonds."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    done = runs[runs["status"] == "done"]
    fig = make_subplots(rows=1, cols=len(V3_SPLITS), subplot_titles=V3_SPLITS, shared_yaxes=True)
    in_legend = set()  # each entry once, on the first panel where it has points
    for col, split in enumerate(V3_SPLITS, start=1):
        ours = done[done["split"] == split]
        theirs = paper[paper["split"] == split]
        for name, rows, marker in (
            (f"ours, reached {V3_TARGET}", ours[ours["reached_target"]], {"symbol": "circle"}),
            ("ours, capped", ours[~ours["reached_target"]], {"symbol": "circle-open"}),
            ("paper", theirs, {"symbol": "diamond", "color": "grey"}),
        ):
            show = len(rows) > 0 and name not in in_legend
            in_legend.update([name] if show else [])
            fig.add_trace(
                go.Scatter(
                    x=rows["pe"], y=rows["ood_accuracy"], mode="markers", name=name,
                    offsetgroup="paper" if name == "paper" else "ours", legendgroup=name,
                    showlegend=show, marker={"size": 8, "color": "#1f77b4", **marker},
                    text=[f"seed {s}" for s in rows["seed"]],
                ),
                row=1, col=col,
            )  # fmt: skip
        fig.update_xaxes(categoryorder="array", categoryarray=list(FIVE_PES), row=1, col=col)
    fig.update_yaxes(title_text="OOD exact match", range=[-0.03, 1.03], row=1, col=1)
    fig.update_layout(
        title="OOD exact match per run: this grid (blue) and the paper's runs (grey)",
        scattermode="group", template="plotly_white", height=420, width=1100,
    )  # fmt: skip
    return fig


LENGTH_FIGURE = "accuracy_by_length"  # the report's second figure, beside FIGURE


def length_figure(by_length: pd.DataFrame):
    """Test exact match by length, one panel per split, one line per PE (mean over the seeds
    done so far), from `repro.accuracy_by_length` on this grid's records."""
    from nopeinterp.viz.evaluation import accuracy_figure

    frame = repro.length_frame(by_length)
    frame = frame[frame["task"].isin(V3_SPLITS)]
    return accuracy_figure(
        frame, title="Exact match by test length, mean over the seeds done so far (this grid)"
    )


VERDICTS_BEGIN = "<!-- reproduction-v3-verdicts:begin -->"
VERDICTS_END = "<!-- reproduction-v3-verdicts:end -->"
VERDICTS_TITLE = "The claims by this grid's decision rules"
FIRST_GRID_VERDICTS = "**The first grid's verdicts**"  # Part 1's hand-written table after ours


def verdicts_note(r: dict) -> str:
    """Where the verdict rows come from, and whether they are interim."""
    done = int((r["runs"]["status"] == "done").sum())
    note = (
        "Claim 1 from the committed records, claims 2-4 from `analyse`'s files, by the rules "
        'of PROTOCOL v3 (claims 2-4: its "Changes after the runs started").'
    )
    if done < len(r["runs"]):
        note += (
            f" Interim: {done} of the grid's {len(r['runs'])} runs are in, so these rows are "
            "not the grid's verdicts."
        )
    return note


def report(root: Path | None = None, path: Path = REPORT) -> Path:
    """Rewrite REPORT.md's section on this grid (between BEGIN and END) and its rows in Part 1's
    verdict table (between VERDICTS_BEGIN and VERDICTS_END) from the records."""
    from _common import batches_sentence, to_markdown, write_figure, write_section

    from nopeinterp.paper import paper_runs

    r, found = results(root), mechanisms()
    figure_paths = []
    if (r["runs"]["status"] == "done").any():
        out = repro.RECORDS / V3
        figure_paths = write_figure(ood_figure(r["runs"], paper_runs()), out, FIGURE)
        if len(r["by_length"]):  # records without per-length scores have nothing to draw
            figure_paths += write_figure(length_figure(r["by_length"]), out, LENGTH_FIGURE)
    lines = [
        BEGIN,
        "## Reproduction v3: converged models at the paper's head width",
        "",
        'Protocol: analyses/PROTOCOL.md, "Protocol of the reproduction grid, version 3", '
        "committed before the first counted run. Regenerated by `python "
        "analyses/reproduction_v3.py report` from the committed records in "
        "analyses/results/reproduction/v3/ (tables: `python analyses/reproduction_v3.py "
        "table`).",
        "",
        f"Status: {r['status']}.",
        "",
    ]
    done = r["runs"][r["runs"]["status"] == "done"]
    if len(done):
        changes = 'PROTOCOL v3, "Changes after the runs started"'
        lines += [batches_sentence(done["length_groups"], changes), ""]
    if (r["runs"]["status"] == "done").sum() == 0:
        lines += ["No run has finished yet; nothing below is a result.", END]
    else:
        for name, alt in (
            (FIGURE, "OOD exact match per run, this grid and the paper's"),
            (LENGTH_FIGURE, "Exact match by test length, per split and PE"),
        ):
            png = repro.RECORDS / V3 / f"{name}.png"
            if png in figure_paths:
                rel = png.relative_to(path.parent) if png.is_relative_to(path.parent) else png
                lines += [f"![{alt}]({Path(rel).as_posix()})", ""]
        lines += [
            f"Runs that reached {V3_TARGET} ID validation, per split and PE:",
            "",
            to_markdown(r["convergence"]),
            "",
            "The first grid beside this one. " + V2_NOTE,
            "",
            to_markdown(r["against_v2"]),
            "",
            CHANGED_NOTE,
            "",
            to_markdown(r["converging_changed"]),
            "",
            SIZE_NOTE,
            "",
            to_markdown(r["size"]),
            "",
            SHAPES_NOTE,
            "",
            to_markdown(shapes()),
            "",
        ]
        if r["comparison"] is None:
            lines += [
                "No (split, seed) cell has all five PEs yet: no comparison with the paper and "
                "no verdict.",
            ]
        else:
            mrr = r["comparison"].mrr
            n_cells, all_cells = sum(r["cells"].values()), len(V3_SPLITS) * len(V3_SEEDS)
            verdict = f"Claim 1 by the protocol's decision rule: {r['verdict']}"
            if n_cells < all_cells:  # a verdict on part of the grid is not the grid's verdict
                verdict = (
                    f"Interim, on {n_cells} of the grid's {all_cells} (split, seed) cells, not "
                    f"the grid's verdict (drawn on all {len(r['runs'])} runs). {verdict}"
                )
            lines += [
                f"MRR on complete (split, seed) cells (seeds per split: {r['cells']}), ours and "
                "the paper's on the same splits, 95% bootstrap intervals (with few cells the "
                "intervals are narrow because there is little to resample, not because the "
                "ranking is certain):",
                "",
                to_markdown(mrr),
                "",
                TIES_NOTE,
                "",
                to_markdown(r["mrr_ties_averaged"]),
                "",
                "Agreement with the paper's ranking of the PEs, per split (Kendall's tau-b of "
                "the mean OOD exact match on complete cells; orders best first):",
                "",
                to_markdown(r["comparison"].agreement),
                "",
                f"**{verdict}.**",
            ]
        lines += ["", *mechanisms_lines(found)]
        lines.append(END)
    # first time: before Part 2, at the end of the reproduction's part
    write_section(path, "\n".join(lines), BEGIN, END, before="# Part 2:")
    block = [
        VERDICTS_BEGIN,
        f"**{VERDICTS_TITLE}.** {verdicts_note(r)} Written by `python "
        "analyses/reproduction_v3.py report` (the same rows: `table`, verdicts.*).",
        "",
        to_markdown(verdicts(r, found)),
        VERDICTS_END,
    ]
    # first time: at the head of Part 1's verdicts, before the first grid's
    write_section(path, "\n".join(block), VERDICTS_BEGIN, VERDICTS_END, before=FIRST_GRID_VERDICTS)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grid", help="the grid on this machine's CPU (resumable)")
    g.add_argument("--splits", nargs="+", choices=list(V3_SPLITS), default=None)
    g.add_argument("--seeds", nargs="+", type=int, choices=list(V3_SEEDS), default=None)
    g.add_argument("--workers", type=int, default=1)
    g.add_argument("--commit", action="store_true", help="git-commit each finished record")
    u = sub.add_parser("gpu", help="check a short run against the CPU, then the grid on a GPU")
    u.add_argument("--workers", type=int, default=8, help="runs at once on the GPU")
    u.add_argument("--commit", action="store_true", help="git-commit each finished record")
    t = sub.add_parser("table", help="the grid's tables, the paper comparison, the verdict")
    t.add_argument("--out", type=Path, default=None, help="default results/reproduction/v3/tables")
    sub.add_parser("report", help="rewrite REPORT.md's section on this grid from the records")
    b = sub.add_parser("rebuild", help="train committed runs again here, for their checkpoints")
    b.add_argument("--splits", nargs="+", choices=list(V3_SPLITS), default=list(ANALYSED))
    b.add_argument("--seeds", nargs="+", type=int, choices=list(V3_SEEDS), default=None)
    b.add_argument("--workers", type=int, default=1)
    a = sub.add_parser("analyse", help="claims 2-4 on this grid's finished checkpoints")
    a.add_argument("--splits", nargs="+", choices=list(V3_SPLITS), default=list(ANALYSED))
    a.add_argument("--quick", action="store_true", help="small sets (a smoke run)")
    args = p.parse_args(argv)
    if args.command == "grid":
        run_grid(args.splits, args.seeds, args.workers, args.commit)
    elif args.command == "gpu":
        run_gpu(args.workers, args.commit)
    elif args.command == "table":
        table(args.out)
    elif args.command == "report":
        print(report())
    elif args.command == "rebuild":
        rebuild(args.splits, args.seeds, args.workers)
    elif args.command == "analyse":
        analyse(args.splits, args.quick)
    return 0


if __name__ == "__main__":
    from _common import run_script

    run_script(main)
