"""The scratchpad study (PROTOCOL.md, "Scratchpad study"): pilot timing, the runs, the report.

    python analyses/scratchpad_study.py pilot      # seconds per training step and per decoded
                                                   # item, one thread (how the study was sized)
    python analyses/scratchpad_study.py run [--max-runs N] [--no-commit]
                                                   # the grid in protocol order; rerun to resume
    python analyses/scratchpad_study.py report     # tables, figure, REPORT.md's section
    python analyses/scratchpad_study.py regions    # attention by region, finished checkpoints
    python analyses/scratchpad_study.py retest     # test again records decoded with an
                                                   # earlier decode bound (`run` does it first)
    python analyses/scratchpad_study.py id-steps   # step scores at ID lengths, finished
                                                   # checkpoints (`run`: after each run)

`run` trains one run at a time (one torch thread) under runs/scratchpad/<run>/ (not committed;
an interrupted run resumes from its training state), copies each finished run's record to
analyses/results/scratchpad/records/<run>.json, regenerates the report and commits both
(`--no-commit`: write only). `report` reads only the committed records: the same command gives
the same REPORT.md section on any machine.

`retest`: the records whose test was decoded with the batch's longest target as every item's
bound (before `nopeinterp.evaluation.DECODE_BOUND`, PROTOCOL.md's "Changes after the runs
started") are decoded again on their checkpoints, the earlier numbers kept in each record
under `previous_test`; `run` does this before it trains.

`regions` (a descriptive view added after the runs started, no verdict drawn from it): for
each recorded run with a scratchpad whose checkpoint is on this machine, the attention mass on
each region of the sequence (prompt, scratchpad components, markers, answer) while the model
reads the gold targets, into analyses/results/scratchpad/regions/<run>.csv (one file per run,
so runs trained on different machines add up); `report` then shows them. `id-steps` (the
same kind of view): exact match and step scores at each ID length on the validation items,
decoded as the test is, into analyses/results/scratchpad/id_steps/<run>.csv. `run` writes both
views of each run it finishes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    RESULTS,
    ROOT,
    batches_sentence,
    mean_span,
    run_script,
    to_markdown,
    write_figure,
    write_section,
    write_table,
)  # noqa: E402

# --- the protocol (PROTOCOL.md, "Scratchpad study"); nothing here is tuned -------------------
TASKS = (
    "addition:scratchpad=none",
    "addition:scratchpad=icovr",
    "addition:scratchpad=co",
    "addition:scratchpad=ivr",
    "lego:scratchpad=none",
    "lego:scratchpad=icor",
)
PES = ("nope", "t5", "alibi", "rotary", "sinusoidal")
SEEDS = (0, 1)
PRESET = "repro-t5"  # the T5 architecture's CPU preset, unchanged: its 1,500 steps are the cap
STOP_AT_VAL = 0.95
# each batch in 8 groups of similar length (the same loss on less padding: bench/length_groups.py);
# from addition.scratchpad=icovr-nope-seed0 on (PROTOCOL.md, "Changes after the runs started")
LENGTH_GROUPS = 8
OVERRIDES = {"stop_at_val": STOP_AT_VAL, "length_groups": LENGTH_GROUPS}

RUNS = ROOT / "runs" / "scratchpad"
OUT = RESULTS / "scratchpad"
RECORDS = OUT / "records"
REGIONS_OUT = OUT / "regions"
ID_STEPS_OUT = OUT / "id_steps"  # the in-distribution view: step scores at ID lengths
# the regions view: examples per length (every ID and OOD length), on the gold targets
# teacher-forced (the same text for every PE, so differences are the models', not what each
# generated: most OOD generations here are wrong)
REGION_N = 10
REGION_TOKENS = "gold"
REGION_QUERY = "output"  # the table and figure: the rows that predict each step's output
REPORT = ROOT / "analyses" / "REPORT.md"
BEGIN, END = "<!-- scratchpad-study:begin -->", "<!-- scratchpad-study:end -->"
COMMAND = "python analyses/scratchpad_study.py report"


def grid():
    """The runs in protocol order: seed, then task spec, then PE (a study cut short has every
    PE of its finished (seed, spec) blocks)."""
    from nopeinterp.training.sweep import grid as sweep_grid

    return [spec for seed in SEEDS for task in TASKS for spec in sweep_grid([task], PES, [seed])]


# --- pilot ----------------------------------------------------------------------------------


def pilot(steps: int) -> None:
    """Seconds per training step (median after 2 warm-up steps) and per decoded validation /
    OOD test item, at the protocol's model and batch, one thread, NoPE."""
    import torch

    from nopeinterp.evaluation import greedy_answers
    from nopeinterp.tasks import encode_examples, get_task, task_tokenizer
    from nopeinterp.training import make_config
    from nopeinterp.training.trainer import config_model, target_loss, train_examples

    torch.set_num_threads(1)
    for text in TASKS:
        name, _, opt = text.partition(":")
        task = get_task(name, scratchpad=opt.split("=")[1])
        tok = task_tokenizer(task)
        cfg = make_config(name, "nope", "unused.pt", preset=PRESET, **OVERRIDES)
        model = config_model(cfg, tok, n_ctx=800)
        opt_ = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        model.train()
        wall, cpu, tokens = [], [], []
        for step in range(steps):
            batch = encode_examples(tok, train_examples(task, cfg, step))
            t0, c0 = time.perf_counter(), time.process_time()
            loss = target_loss(model, batch)
            opt_.zero_grad()
            loss.backward()
            opt_.step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            tokens.append(int(batch.attention_mask.sum(1).float().mean()))
        model.eval()
        decode = {}
        for split, lengths in (("val", task.id_lengths[1]), ("test", task.ood_lengths[1])):
            items = task.eval_set(split, n_per_length=16, lengths=[lengths])
            t0, c0 = time.perf_counter(), time.process_time()
            greedy_answers(model, tok, items)
            decode[f"decode_{split}_cpu_s_per_item_at_longest"] = round(
                (time.process_time() - c0) / len(items), 4
            )
            longest = encode_examples(tok, items).attention_mask.sum(1).max()
            decode[f"{split}_longest_tokens"] = int(longest)

        def median(xs):
            xs = sorted(xs[2:])
            return round(xs[len(xs) // 2], 3)

        print(
            json.dumps(
                {
                    "task": text,
                    "batch": cfg.batch_size,
                    "mean_train_tokens": round(sum(tokens) / len(tokens), 1),
                    "step_wall_s": median(wall),
                    "step_cpu_s": median(cpu),
                    **decode,
                }
            ),
            flush=True,
        )


# --- runs -----------------------------------------------------------------------------------


def _cap() -> int:
    from nopeinterp.training.presets import preset_values

    return preset_values(PRESET, "addition")["steps"]


def record_path(run: str) -> Path:
    return RECORDS / f"{run}.json"


def record_format(rec: dict) -> str:
    """A record's scratchpad format ('none' for a run without one)."""
    return str(rec["task_options"].get("scratchpad", "none"))


def pe_rank(pes: pd.Series) -> pd.Series:
    """Each PE's place in PES (the study's order), for sorting tables."""
    return pes.map({p: i for i, p in enumerate(PES)})


def _git(*args: str) -> None:
    subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True)


def run(max_runs: int | None, commit: bool) -> None:
    import torch

    from nopeinterp.training.sweep import RECORD, SweepPlan, run_name, run_one

    torch.set_num_threads(1)
    retest_runs(commit)
    views = [*regions(), *id_steps()]  # of the finished runs that lack them
    if views and commit:
        paths = [*views, *report()]
        _git("add", *map(str, paths))
        msg = f"scratchpad study: descriptive views of finished runs ({len(views)} files)"
        _git("commit", "-m", msg, "--", *map(str, paths))
    specs = grid()
    todo = [s for s in specs if not record_path(run_name(s)).exists()]
    print(f"{len(specs) - len(todo)} of {len(specs)} runs recorded; {len(todo)} to go", flush=True)
    plan = SweepPlan(
        out=RUNS, runs=specs, preset=PRESET, overrides=dict(OVERRIDES), test="eval_set"
    )
    for spec in todo[:max_runs] if max_runs else todo:
        name = run_name(spec)
        t0 = time.time()
        print(f"[{time.strftime('%H:%M:%S')}] {name}: training", flush=True)
        status = run_one(plan, spec, threads=1)
        if status not in ("finished", "skipped"):
            print(f"{name}: {status}; stopping (rerun to resume)", flush=True)
            return
        RECORDS.mkdir(parents=True, exist_ok=True)
        dest = record_path(name)
        shutil.copyfile(RUNS / name / RECORD, dest)
        rec = json.loads(dest.read_text())
        print(
            f"[{time.strftime('%H:%M:%S')}] {name}: best step {rec['best_step']}, val "
            f"{rec['val_accuracy']:.3f}, OOD {rec['ood_accuracy']:.4f} "
            f"({time.time() - t0:.0f} s)",
            flush=True,
        )
        paths = [*regions(only=name), *id_steps(only=name), *report()]
        if commit:
            _git("add", str(dest), *map(str, paths))
            msg = (
                f"scratchpad study: record of {name} (OOD exact match "
                f"{rec['ood_accuracy']:.4f}, val {rec['val_accuracy']:.3f}, best step "
                f"{rec['best_step']}); report regenerated"
            )
            _git("commit", "-m", msg, "--", str(dest), *map(str, paths))


def scratchpad_runs_here(only: str | None = None, skip=None, missing: str = "skipped"):
    """(record path, record, checkpoint) of each recorded scratchpad run (`only`: that run)
    that `skip(path, record)` does not leave out and whose checkpoint is on this machine; a
    run whose checkpoint is not here is named, with `missing`."""
    for path in sorted(RECORDS.glob("*.json")):
        if only is not None and path.stem != only:
            continue
        rec = json.loads(path.read_text())
        if record_format(rec) == "none" or (skip is not None and skip(path, rec)):
            continue
        checkpoint = RUNS / path.stem / "model.pt"
        if not checkpoint.exists():
            print(f"{path.stem}: no checkpoint on this machine, {missing}", flush=True)
            continue
        yield path, rec, checkpoint


def retest_runs(commit: bool = False) -> list[str]:
    """Decode again (`nopeinterp.training.sweep.retest`) each recorded scratchpad run whose
    test used an earlier decode bound and whose checkpoint is here, one at a time, the report
    regenerated (and with `commit`, both committed) after each; the runs tested again. Runs
    without a scratchpad are not decoded again: an answer-only exact match does not depend on
    the bound (an answer longer than its target is wrong at any bound)."""
    from nopeinterp.evaluation import DECODE_BOUND
    from nopeinterp.training.sweep import retest

    def current(path, rec):
        return rec.get("decode_bound") == DECODE_BOUND

    done = []
    for path, _, checkpoint in scratchpad_runs_here(skip=current, missing="not tested again"):
        t0 = time.time()
        print(f"[{time.strftime('%H:%M:%S')}] {path.stem}: testing again", flush=True)
        retest(path, checkpoint)
        rec = json.loads(path.read_text())
        change = f"{rec['previous_test']['ood_accuracy']:.4f} -> {rec['ood_accuracy']:.4f}"
        print(
            f"[{time.strftime('%H:%M:%S')}] {path.stem}: OOD exact match {change} "
            f"({time.time() - t0:.0f} s)",
            flush=True,
        )
        paths = [path, *report()]
        if commit:
            _git("add", *map(str, paths))
            msg = (
                f"scratchpad study: {path.stem} tested again with the per-item decode bound "
                f"(OOD exact match {change}); report regenerated"
            )
            _git("commit", "-m", msg, "--", *map(str, paths))
        done.append(path.stem)
    return done


def regions(force: bool = False, only: str | None = None) -> list[Path]:
    """The regions view (module doc) of each recorded scratchpad run (`only`: of that run)
    whose checkpoint is here and whose file is not written yet (`force`: again); the paths
    written."""
    from nopeinterp._io import atomic_write_text
    from nopeinterp.probing.regions import attention_regions

    def written_already(path, rec):
        return (REGIONS_OUT / f"{path.stem}.csv").exists() and not force

    written = []
    for path, rec, checkpoint in scratchpad_runs_here(only, skip=written_already):
        out = REGIONS_OUT / f"{path.stem}.csv"
        result = attention_regions(checkpoint, n=REGION_N, tokens=REGION_TOKENS, name=path.stem)
        table = result.by_layer.assign(
            task=rec["task"], scratchpad=record_format(rec), seed=rec["seed"]
        )
        written.append(atomic_write_text(out, table.to_csv(index=False)))
        print(f"{path.stem}: {out.name} written", flush=True)
    return written


def load_regions() -> pd.DataFrame:
    """Every run's regions file (`regions`), stacked ('' columns when there is none)."""
    files = sorted(REGIONS_OUT.glob("*.csv"))
    if not files:
        return pd.DataFrame()
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def query_rows(by_layer: pd.DataFrame) -> pd.DataFrame:
    """The regions rows that predict each step's output words (REGION_QUERY): what the summary
    and the figure show. Formats without that component (ivr) have none."""
    return by_layer[by_layer["query_region"] == REGION_QUERY] if len(by_layer) else by_layer


def regions_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Of `rows` (`query_rows`), the attention mass on each key region at the last layer, per
    (task, format, PE, split), mean over seeds (4 decimals: a presentation table; the files
    keep every digit)."""
    from nopeinterp.tasks.scratchpad import REGIONS

    t = rows[rows["layer"] == rows["layer"].max()]
    out = t.pivot_table(
        index=["task", "scratchpad", "pe", "split"], columns="key_region", values="mass",
        aggfunc="mean", sort=False,
    )  # fmt: skip
    seeds = t.groupby(["task", "scratchpad", "pe", "split"], sort=False)["seed"].nunique()
    out = out[[r for r in REGIONS if r in out.columns]].assign(seeds=seeds)
    out = out.reset_index()
    out["_p"] = pe_rank(out["pe"])
    out = out.sort_values(["task", "scratchpad", "_p", "split"]).drop(columns="_p")
    return out.round(4)


def regions_figure(rows: pd.DataFrame):
    """One panel per (task, format) and PE: per layer and split, a bar of the attention mass
    on each key region (stacked) in `rows` (`query_rows`)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nopeinterp.tasks.scratchpad import REGIONS
    from nopeinterp.viz.legend import Legend

    t = rows.groupby(["task", "scratchpad", "pe", "split", "layer", "key_region"], sort=False)
    t = t["mass"].mean().reset_index()  # over seeds
    specs = list(dict.fromkeys(zip(t["task"], t["scratchpad"], strict=True)))
    pes = [p for p in PES if p in set(t["pe"])]
    fig = make_subplots(
        rows=len(specs), cols=len(pes), shared_yaxes=True,
        subplot_titles=[f"{task} {fmt} | {pe}" for task, fmt in specs for pe in pes],
    )  # fmt: skip
    legend = Legend(list(REGIONS))
    for row, (task, fmt) in enumerate(specs, start=1):
        for col, pe in enumerate(pes, start=1):
            cell = t[(t["task"] == task) & (t["scratchpad"] == fmt) & (t["pe"] == pe)]
            pairs = cell[["split", "layer"]].drop_duplicates().sort_values(["split", "layer"])
            x = [pairs["split"].tolist(), [f"layer {v}" for v in pairs["layer"]]]
            for key in [r for r in REGIONS if r in set(cell["key_region"])]:
                k = cell[cell["key_region"] == key].set_index(["split", "layer"])["mass"]
                y = [k.get(pair, 0.0) for pair in zip(pairs["split"], pairs["layer"], strict=True)]
                fig.add_trace(
                    go.Bar(x=x, y=y, marker_color=legend.color(key), **legend.entry(key)),
                    row=row, col=col,
                )  # fmt: skip
    fig.update_layout(
        barmode="stack",
        title=f"Attention mass by attended region when predicting each step's {REGION_QUERY} "
        "(gold scratchpads teacher-forced; x: split and layer)",
        legend_title_text="attended region",
        width=max(700, 260 * len(pes)),
        height=340 * len(specs) + 120,
    )
    fig.update_yaxes(range=[0, 1])
    return fig


# --- report ---------------------------------------------------------------------------------


def read_records() -> list[dict]:
    """The committed records, in file-name order (read once per report)."""
    return [json.loads(path.read_text()) for path in sorted(RECORDS.glob("*.json"))]


def ood_steps_right(accuracy: list[dict]) -> float | None:
    """The share of scratchpad steps right over a record's OOD items (None without step
    scores)."""
    ood = [a for a in accuracy if a["split"] == "OOD"]
    n = sum(a["n"] for a in ood)
    if not n or any(a.get("steps_right") is None for a in ood):
        return None
    return sum(a["steps_right"] * a["n"] for a in ood) / n


def load_records(records: list[dict]) -> pd.DataFrame:
    """One row per run."""
    rows = []
    for rec in records:
        history = rec.get("val_history") or []
        rows.append(
            {
                "task": rec["task"],
                "scratchpad": record_format(rec),
                "pe": rec["pe"],
                "seed": rec["seed"],
                "ood_accuracy": rec["ood_accuracy"],
                "ood_steps_right": ood_steps_right(rec["accuracy"]),
                "val_accuracy": rec["val_accuracy"],
                "reached_val": rec["val_accuracy"] >= STOP_AT_VAL,
                "best_step": rec["best_step"],
                "steps_trained": history[-1]["step"] if history else None,
                "test_items": rec["test_items"],
                "run_wall_s": rec.get("run_wall_s"),
                # 1: the padded batch (the records written before the setting)
                "length_groups": rec.get("config", {}).get("length_groups", 1),
                **bounds_used(rec),
            }
        )
    return pd.DataFrame(rows)


ANSWER_ONLY = "any (answer only)"  # an answer-only exact match is the same at every bound


def bounds_used(rec: dict) -> dict:
    """The decode bound a record's test (`test_bound`) and validation (`val_bound`) used:
    "per item" (`nopeinterp.evaluation.DECODE_BOUND`), "batch" (every item of a decoding batch
    bounded by the batch's longest target: records written before the per-item bound; a run
    tested again keeps its validation, and so its checkpoint, from training), or ANSWER_ONLY."""
    if record_format(rec) == "none":
        return {"test_bound": ANSWER_ONLY, "val_bound": ANSWER_ONLY}
    tested = "per item" if rec.get("decode_bound") else "batch"
    return {"test_bound": tested, "val_bound": "batch" if "previous_test" in rec else tested}


def retested(records: list[dict]) -> pd.DataFrame:
    """The runs tested again with the per-item bound: OOD exact match and OOD share of steps
    right before (the batch bound) and after, one row per run."""
    rows = [
        {
            "task": rec["task"],
            "scratchpad": record_format(rec),
            "pe": rec["pe"],
            "seed": rec["seed"],
            "ood_batch_bound": rec["previous_test"]["ood_accuracy"],
            "ood_per_item": rec["ood_accuracy"],
            "steps_right_batch_bound": ood_steps_right(rec["previous_test"]["accuracy"]),
            "steps_right_per_item": ood_steps_right(rec["accuracy"]),
            "test_wall_s_batch_bound": rec["previous_test"].get("test_wall_s"),
            "test_wall_s_per_item": rec.get("test_wall_s"),
        }  # fmt: skip
        for rec in records
        if "previous_test" in rec
    ]
    return pd.DataFrame(rows)


STEP_SAMPLES = 20  # examples per length for the gold step count of `steps_by_length`


def id_steps(force: bool = False, only: str | None = None) -> list[Path]:
    """The in-distribution view (module doc) of each recorded scratchpad run (`only`: of that
    run) whose checkpoint is here and whose file is not written yet (`force`: again): exact
    match and step scores per ID length on the validation items, decoded as the test is; the
    paths written."""
    from nopeinterp._io import atomic_write_text
    from nopeinterp.evaluation import evaluate
    from nopeinterp.tasks import get_task

    def written_already(path, rec):
        return (ID_STEPS_OUT / f"{path.stem}.csv").exists() and not force

    written = []
    for path, rec, checkpoint in scratchpad_runs_here(only, skip=written_already):
        out = ID_STEPS_OUT / f"{path.stem}.csv"
        lo, hi = get_task(rec["task"], **rec["task_options"]).id_lengths
        table = evaluate(checkpoint, n=None, lengths=range(lo, hi + 1), progress=False).table
        table = table.drop(columns="model").assign(run=path.stem, seed=rec["seed"])
        written.append(atomic_write_text(out, table.to_csv(index=False)))
        print(f"{path.stem}: {out.name} written", flush=True)
    return written


def load_id_steps() -> dict[str, pd.DataFrame]:
    """Every run's in-distribution file (`id_steps`), by run name."""
    return {f.stem: pd.read_csv(f) for f in sorted(ID_STEPS_OUT.glob("*.csv"))}


def steps_by_length(records: list[dict], id_tables: dict | None = None) -> pd.DataFrame:
    """Where the scratchpads go wrong: per (task, scratchpad, pe, split, length), means over
    the runs (`runs`) of answer exact match (`exact_match`), of the share of gold steps
    written right (`steps_right`) and of the mean index of the first wrong or missing step
    over the items that have one (`first_wrong_step`; 0 is the first step), beside the mean
    number of gold steps at that length (`gold_steps`, over STEP_SAMPLES examples of the
    task). OOD lengths from the records' tests; ID lengths from `id_tables` (`load_id_steps`),
    for the runs that have one. Runs without a scratchpad have no rows."""
    import random

    from nopeinterp.tasks import get_task
    from nopeinterp.tasks.scratchpad import steps_of

    id_tables = id_tables or {}
    rows, gold = [], {}
    for rec in records:
        fmt = record_format(rec)
        if fmt == "none":
            continue
        scored = [a for a in rec["accuracy"] if a["split"] == "OOD"]
        if rec["run"] in id_tables:
            scored += id_tables[rec["run"]].to_dict("records")
        for a in scored:
            if a.get("steps_right") is None:
                continue
            key = (rec["task"], fmt, a["length"])
            if key not in gold:
                task, rng = get_task(rec["task"], **rec["task_options"]), random.Random(0)
                targets = [task.sample(a["length"], rng).target for _ in range(STEP_SAMPLES)]
                gold[key] = sum(len(steps_of(t)) for t in targets) / STEP_SAMPLES
            rows.append({
                "task": rec["task"], "scratchpad": fmt, "pe": rec["pe"], "split": a["split"],
                "length": a["length"], "seed": rec["seed"], "exact_match": a["accuracy"],
                "steps_right": a["steps_right"], "first_wrong_step": a["first_wrong_step"],
                "gold_steps": gold[key],
            })  # fmt: skip
    keys = ["task", "scratchpad", "pe", "split", "length"]
    cols = [*keys, "runs", "exact_match", "steps_right", "first_wrong_step", "gold_steps"]
    if not rows:
        return pd.DataFrame(columns=cols)
    out = (
        pd.DataFrame(rows)
        .groupby(keys, sort=False)
        .agg(
            runs=("seed", "nunique"),
            exact_match=("exact_match", "mean"),
            steps_right=("steps_right", "mean"),
            first_wrong_step=("first_wrong_step", "mean"),
            gold_steps=("gold_steps", "first"),
        )
        .reset_index()
    )
    out["_p"] = pe_rank(out["pe"])
    out = out.sort_values(["task", "scratchpad", "_p", "length"], kind="stable")
    return out[cols].reset_index(drop=True)


STEP_PLOTS = (  # (column, y-axis title): the rows of the steps figure
    ("steps_right", "share of steps right"),
    ("first_wrong_step", "first wrong step (index)"),
)


def steps_figure(steps: pd.DataFrame):
    """By length (ID and OOD), the share of steps right (top) and the first wrong step's index
    (bottom), one column per (task, format), one line per PE (mean over its runs); dashed: the
    gold scratchpad's number of steps; dotted: where OOD begins."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nopeinterp.viz.legend import Legend

    panels = list(dict.fromkeys(zip(steps["task"], steps["scratchpad"], strict=True)))
    fig = make_subplots(
        rows=len(STEP_PLOTS), cols=max(len(panels), 1), shared_xaxes=True,
        subplot_titles=[f"{t} {f}" for t, f in panels] + [""] * len(panels),
        vertical_spacing=0.08,
    )  # fmt: skip
    legend = Legend(PES)
    for col, (task, fmt) in enumerate(panels, start=1):
        panel = steps[(steps["task"] == task) & (steps["scratchpad"] == fmt)]
        for row, (column, title) in enumerate(STEP_PLOTS, start=1):
            for pe in (p for p in PES if p in set(panel["pe"])):
                g = panel[panel["pe"] == pe]
                fig.add_trace(legend.line(pe, g["length"], g[column]), row=row, col=col)
            if column == "first_wrong_step":
                gold = panel.drop_duplicates("length")
                fig.add_trace(
                    go.Scatter(x=gold["length"], y=gold["gold_steps"], mode="lines",
                               name="gold steps", line={"color": "grey", "dash": "dash"},
                               legendgroup="gold", showlegend=col == 1),
                    row=row, col=col,
                )  # fmt: skip
            ood = panel.loc[panel["split"] == "OOD", "length"]
            if len(ood) and (panel["split"] == "ID").any():
                fig.add_vline(
                    x=ood.min() - 0.5, line={"color": "grey", "dash": "dot"}, row=row, col=col
                )
            fig.update_yaxes(title_text=title if col == 1 else None, row=row, col=col)
        fig.update_xaxes(title_text="length (ID | OOD)", row=len(STEP_PLOTS), col=col)
    fig.update_layout(
        title="Where the scratchpads go wrong, by length (dashed: steps in the gold "
        "scratchpad; dotted: where OOD begins)",
        template="plotly_white", height=720, width=max(500, 330 * len(panels)),
    )  # fmt: skip
    return fig


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    order = {t: i for i, t in enumerate(TASKS)}
    g = runs.groupby(["task", "scratchpad", "pe"], sort=False)
    out = g.apply(
        lambda d: pd.Series(
            {
                "runs": len(d),
                "reached_val_0.95": int(d["reached_val"].sum()),
                "ood_exact_match": mean_span(d["ood_accuracy"]),
                "ood_steps_right": mean_span(d["ood_steps_right"]),
                "val_exact_match": mean_span(d["val_accuracy"]),
                "mean_best_step": round(d["best_step"].mean()),
            }
        ),
        include_groups=False,
    ).reset_index()
    out["_o"] = [
        order.get(f"{t}:scratchpad={s}", 99) for t, s in zip(out.task, out.scratchpad, strict=True)
    ]
    out["_p"] = pe_rank(out["pe"])
    return out.sort_values(["_o", "_p"]).drop(columns=["_o", "_p"]).reset_index(drop=True)


def paper_comparison(runs: pd.DataFrame) -> pd.DataFrame:
    """Addition with the full format: our OOD exact match per PE beside the paper's runs."""
    from nopeinterp.paper import paper_scratchpad_runs

    paper = paper_scratchpad_runs()
    ours = runs[(runs.task == "addition") & (runs.scratchpad == "icovr")]
    rows = []
    for pe in PES:
        o, p = ours[ours.pe == pe], paper[paper.pe == pe]
        rows.append(
            {
                "pe": pe,
                "our_runs": len(o),
                "ours_ood": mean_span(o["ood_accuracy"]),
                "ours_val": mean_span(o["val_accuracy"]),
                "paper_runs": len(p),
                "paper_ood": mean_span(p["ood_accuracy"]),
                "paper_val": mean_span(p["val_accuracy"]),
            }
        )
    return pd.DataFrame(rows)


# the paper's LEGO split at our LEGO's lengths (its T5 runs are only on a `_perm` variant)
PAPER_LEGO_SPLIT = "s2s_lego/len_tr8_ts16"
LEGO_FORMATS = {False: "none", True: "icor"}  # the paper's without / with, our two formats


def lego_paper_comparison(runs: pd.DataFrame) -> pd.DataFrame:
    """LEGO without and with a scratchpad: our OOD exact match per PE (formats `none` and
    `icor`) beside the paper's means over its seed runs (`paper_aggregates`), for the PEs the
    paper reports on this split."""
    from nopeinterp.paper import paper_aggregates

    agg = paper_aggregates()
    paper = agg[(agg["split"] == PAPER_LEGO_SPLIT) & (agg["model"] == "base")]
    ours = runs[runs.task == "lego"]
    rows = []
    for pe in [p for p in PES if p in set(paper["pe"])]:
        for with_pad, fmt in LEGO_FORMATS.items():
            o = ours[(ours.pe == pe) & (ours.scratchpad == fmt)]
            q = paper[(paper.pe == pe) & (paper.scratchpad == with_pad)]
            rows.append(
                {
                    "pe": pe,
                    "scratchpad": fmt,
                    "our_runs": len(o),
                    "ours_ood": mean_span(o["ood_accuracy"]),
                    "paper_seeds": int(q["n_seeds"].sum()),
                    "paper_ood_mean": q["ood_mean"].item() if len(q) == 1 else None,
                    "paper_ood_std": q["ood_std"].item() if len(q) == 1 else None,
                }
            )
    return pd.DataFrame(rows)


def figure(runs: pd.DataFrame):
    """OOD exact match by format (x) and PE (colour), one panel per task; each run a point,
    the mean a bar; the paper's addition runs (full format) as open diamonds."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nopeinterp.paper import paper_scratchpad_runs
    from nopeinterp.viz.legend import Legend

    tasks = list(dict.fromkeys(t.split(":")[0] for t in TASKS))
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    legend = Legend(PES)
    paper = paper_scratchpad_runs()
    for col, task in enumerate(tasks, start=1):
        formats = [t.split("=")[1] for t in TASKS if t.startswith(task + ":")]
        t = runs[runs.task == task] if len(runs) else runs
        for pe in PES:
            r = t[t.pe == pe] if len(t) else t
            means = [
                r[r.scratchpad == f]["ood_accuracy"].mean() if len(r) else None for f in formats
            ]
            fig.add_trace(
                go.Bar(x=formats, y=means, offsetgroup=pe, marker_color=legend.color(pe),
                       **legend.entry(pe)),
                row=1, col=col,
            )  # fmt: skip
            if len(r):
                fig.add_trace(
                    go.Scatter(x=r["scratchpad"], y=r["ood_accuracy"], mode="markers",
                               marker={"color": "black", "size": 5}, offsetgroup=pe,
                               showlegend=False, name=f"{pe} runs"),
                    row=1, col=col,
                )  # fmt: skip
            p = paper[(paper.task == task) & (paper.pe == pe)]
            if len(p):
                fig.add_trace(
                    go.Scatter(x=p["scratchpad"], y=p["ood_accuracy"], mode="markers",
                               marker={"symbol": "diamond-open", "size": 9,
                                       "color": legend.color(pe)},
                               offsetgroup=pe, name=f"paper, {pe}", legendgroup="paper",
                               showlegend=False),
                    row=1, col=col,
                )  # fmt: skip
    fig.update_layout(
        barmode="group",
        scattermode="group",
        title="OOD exact match by scratchpad format and PE (bars: our mean; dots: our runs; "
        "open diamonds: the paper's runs)",
        yaxis_title="OOD exact match",
        width=1100,
        height=480,
    )
    fig.update_xaxes(title_text="scratchpad format")
    return fig


def report() -> list[Path]:
    """Tables, figure and REPORT.md's section from the committed records; the paths written."""
    records = read_records()
    runs = load_records(records)
    paths = []
    if len(runs):
        paths += write_table(runs, OUT, "runs", title="Scratchpad study: one row per run")
        summary = summarize(runs)
        paths += write_table(summary, OUT, "summary", title="Scratchpad study per format and PE")
    else:
        summary = pd.DataFrame()
    comparison = paper_comparison(runs) if len(runs) else paper_comparison(_empty())
    paths += write_table(comparison, OUT, "addition_icovr_vs_paper")
    lego = lego_paper_comparison(runs if len(runs) else _empty())
    paths += write_table(lego, OUT, "lego_vs_paper")
    fig_paths = write_figure(figure(runs if len(runs) else _empty()), OUT, "ood_by_format")
    paths += [p for p in fig_paths if p.suffix == ".png"]  # the HTML is not committed
    steps = steps_by_length(records, load_id_steps())
    if len(steps):
        paths += write_table(steps, OUT, "steps_by_length", title="Where the scratchpads go wrong")
        fig_paths = write_figure(steps_figure(steps), OUT, "steps_by_length")
        paths += [p for p in fig_paths if p.suffix == ".png"]
    by_layer = load_regions()
    shown = query_rows(by_layer)
    region_table, region_runs, unshown = None, 0, []
    if len(shown):
        region_table = regions_summary(shown)
        region_runs = shown["model"].nunique()
        unshown = sorted(set(by_layer["scratchpad"]) - set(shown["scratchpad"]))
        paths += write_table(region_table, OUT, "regions_last_layer")
        fig_paths = write_figure(regions_figure(shown), OUT, "regions_output")
        paths += [p for p in fig_paths if p.suffix == ".png"]
    again = retested(records)
    if len(again):
        paths += write_table(again, OUT, "retested", title="Runs tested again (decode bound)")
    text = section(
        runs, summary, comparison, lego, region_table, region_runs, unshown, steps, again
    )
    write_section(REPORT, text, BEGIN, END)
    return [*paths, REPORT]


def _empty() -> pd.DataFrame:
    cols = ["task", "scratchpad", "pe", "seed", "ood_accuracy", "val_accuracy"]
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})


def section(
    runs,
    summary,
    comparison,
    lego,
    region_table=None,
    region_runs=0,
    unshown=(),
    steps=None,
    again=None,
) -> str:
    total = len(grid())
    done = len(runs)
    lines = [
        BEGIN,
        "# Part 4: scratchpad formats, per PE",
        "",
        f"Regenerated by `{COMMAND}` from the committed records in "
        '`analyses/results/scratchpad/records/` (protocol: PROTOCOL.md, "Scratchpad study", '
        "committed before the first run).",
        "",
        f"**Runs finished: {done} of {total}.** "
        + (
            "The study is complete."
            if done == total
            else "The study is not complete: every number below is from the finished runs "
            "only, and a format or PE with fewer runs than the protocol's 2 seeds is marked by "
            "its `runs` count. `python analyses/scratchpad_study.py run` resumes it."
        ),
        "",
    ]
    if done:
        lines += [
            "OOD exact match (answer after the closing marker), mean [min, max] over seeds; "
            "`ood_steps_right`: mean share of scratchpad steps written right on the OOD test "
            "set; `reached_val_0.95`: runs whose ID validation exact match reached 0.95 before "
            f"the {_cap()}-step cap.",
            "",
            to_markdown(summary),
            "",
            batches_sentence(
                runs["length_groups"],
                'PROTOCOL.md, scratchpad study, "Changes after the runs started"',
            ),
            "",
            *bound_lines(runs, again),
        ]
    lines += [
        "Addition, full format (`icovr`), like for like with the paper's per-run numbers (its "
        "base-size T5 decoder, ID <= 8 digits, OOD 9-16, its own OOD test set; ours: the "
        "protocol's small model). The paper has one Rotary run.",
        "",
        to_markdown(comparison),
        "",
        "LEGO without a scratchpad (`none`) and with every component LEGO has (`icor`), beside "
        "the paper's means and standard deviations over its seed runs on the same lengths "
        f"(`{PAPER_LEGO_SPLIT}`, its base-size decoder; the paper's scratchpad format for these "
        "runs is not in its results file). The PEs the paper reports there: "
        + (", ".join(dict.fromkeys(lego["pe"])) if len(lego) else "none")
        + ". Each answer is one sign (`+ 1` or `- 1`, equally likely at every length), so a "
        "model that writes a well-formed answer with a random sign scores 0.5 in expectation.",
        "",
        to_markdown(lego),
        "",
        *(
            ["![OOD exact match by format and PE](results/scratchpad/ood_by_format.png)", ""]
            if (OUT / "ood_by_format.png").exists()
            else ["(No PNG here: kaleido found no Chromium when this was regenerated.)", ""]
        ),
        "Interactive figure: `analyses/results/scratchpad/ood_by_format.html` (not committed; "
        "written by the same command).",
        "",
        *steps_lines(steps),
        *regions_lines(region_table, region_runs, unshown),
        END,
    ]
    return "\n".join(lines) + "\n"


def bound_lines(runs: pd.DataFrame, again) -> list[str]:
    """The section's lines on the decode bound each run's test used (`bounds_used`), with
    the runs tested again (`retested`) before and after."""
    from nopeinterp.evaluation import SCRATCHPAD_BOUND_FACTOR

    counts = runs["test_bound"].value_counts()
    said = {
        "per item": "tested with each item decoded to its own bound",
        "batch": "**not yet tested again**, each item bounded by the longest target of its "
        "decoding batch (`python analyses/scratchpad_study.py retest`, on a machine that has "
        "their checkpoints)",
        ANSWER_ONLY: "without a scratchpad (an answer-only exact match is the same at any bound)",
    }
    parts = [f"{counts[k]} {said[k]}" for k in said if k in counts]
    lines = [
        "Decoding bound: each item decodes up to its own gold target + 1 tokens, "
        f"{SCRATCHPAD_BOUND_FACTOR} x its target + 1 with a scratchpad (the answer is read "
        "after the closing marker, so a scratchpad longer than the gold one can still end in "
        "the right answer; the paper's scratchpad runs decode up to 1,500 tokens). The study's first "
        "runs bounded every item of a decoding batch by the batch's longest target, which made "
        "an item's score depend on the items batched with it (PROTOCOL.md, scratchpad study, "
        '"Changes after the runs started"). Runs: ' + "; ".join(parts) + ".",
        "",
    ]
    if again is not None and len(again):
        val = int((runs["val_bound"] == "batch").sum())
        lines += [
            f"The {len(again)} runs tested again on their checkpoints: OOD exact match and OOD "
            "share of steps right under the batch bound (as first recorded) and per item. "
            f"Their checkpoints stay the ones training selected: {val} runs' validation (and so "
            "the `val_exact_match` above) used the batch bound "
            "(`analyses/results/scratchpad/retested.md`).",
            "",
            to_markdown(again.drop(columns=["test_wall_s_batch_bound", "test_wall_s_per_item"])),
            "",
        ]
    return lines


def steps_overview(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (task, format, PE), of `steps_by_length`: answer exact match and share of steps
    right, means over the ID lengths (runs with the in-distribution view: `id_runs`) and
    over the OOD lengths (`ood_runs`)."""
    keys = ["task", "scratchpad", "pe"]
    out = steps[keys].drop_duplicates().reset_index(drop=True)
    for split in ("ID", "OOD"):
        part = steps[steps["split"] == split].groupby(keys, sort=False)
        means = part[["exact_match", "steps_right"]].mean().add_prefix(f"{split.lower()}_")
        runs = part["runs"].min().rename(f"{split.lower()}_runs")
        out = out.merge(pd.concat([runs, means], axis=1).reset_index(), on=keys, how="left")
    return out.round(4)


def steps_lines(steps) -> list[str]:
    """The section's lines on where the scratchpads go wrong (`steps_by_length`)."""
    if steps is None or not len(steps):
        return []
    ood = steps[steps["split"] == "OOD"]
    shortest = ood[ood["length"] == ood.groupby("task")["length"].transform("min")]
    spans = [
        f"{task} `{fmt}` {g['first_wrong_step'].min():.1f}-{g['first_wrong_step'].max():.1f} "
        f"of {g['gold_steps'].iloc[0]:.0f} steps (length {g['length'].iloc[0]})"
        for (task, fmt), g in shortest.dropna(subset=["first_wrong_step"]).groupby(
            ["task", "scratchpad"], sort=False
        )
    ]
    text = "; ".join(spans)
    overview = steps_overview(steps)
    with_id = int(overview["id_runs"].notna().sum())
    return [
        "## Where the scratchpads go wrong",
        "",
        "Per length, the share of gold scratchpad steps written right (at their index) and the "
        "mean index of the first wrong or missing step (0: the first step), over the items that "
        "have one, beside the number of steps of the gold scratchpad; mean over each PE's runs "
        "(`analyses/results/scratchpad/steps_by_length.md`). OOD lengths: the records' tests. "
        "ID lengths: a descriptive view added after the runs started (no verdict rests on it), "
        "`python analyses/scratchpad_study.py id-steps` on the finished checkpoints: the "
        "validation items (those training selected its checkpoint on, by answer exact match), "
        "decoded as the test is. It tells a scratchpad the model never learned from one that "
        "fails only past the training lengths. At the shortest OOD length, the first wrong "
        f"step, lowest to highest PE: {text or 'no item wrong'}.",
        "",
        f"In distribution and out, means over the lengths ({with_id} of {len(overview)} "
        "(task, format, PE) cells have runs with the ID view; `id_runs`, `ood_runs`: runs "
        "averaged):",
        "",
        to_markdown(overview),
        "",
        *(
            ["![Where the scratchpads go wrong](results/scratchpad/steps_by_length.png)", ""]
            if (OUT / "steps_by_length.png").exists()
            else []
        ),
    ]


def regions_lines(region_table, runs: int, unshown=()) -> list[str]:
    """The section's lines on the regions view (a descriptive view: no verdict) of `runs`
    runs; `unshown`: the formats analysed that have no rows of the queried component."""
    head = ["## Where the models look while writing a scratchpad", ""]
    if region_table is None:
        return [
            *head,
            "No run analysed yet (`python analyses/scratchpad_study.py regions` on a machine "
            "that has the runs' checkpoints, then `report`).",
            "",
        ]
    return [
        *head,
        f"A descriptive view, added after the runs started (no verdict rests on it), of {runs} "
        "finished runs whose checkpoints were on the machine that ran `python "
        f"analyses/scratchpad_study.py regions`: {REGION_N} examples per ID and OOD length, the "
        f"gold scratchpads teacher-forced (the same text for every PE). In the rows that "
        f"predict each step's {REGION_QUERY} words, the attention mass on each region at the "
        "last layer, mean over heads and seeds (every layer: the figure, and "
        "`analyses/results/scratchpad/regions/`):",
        "",
        to_markdown(region_table),
        *(
            [
                "",
                f"Formats without the {REGION_QUERY} component ("
                + ", ".join(f"`{f}`" for f in unshown)
                + ") have no such rows and are not in this table; their files under "
                "`analyses/results/scratchpad/regions/` hold every other region.",
            ]
            if unshown
            else []
        ),
        "",
        *(
            ["![Attention by region](results/scratchpad/regions_output.png)", ""]
            if (OUT / "regions_output.png").exists()
            else []
        ),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("pilot", help="time training steps and decoding, one thread")
    s.add_argument("--steps", type=int, default=8)
    s = sub.add_parser("run", help="train, test and commit the runs without a record")
    s.add_argument("--max-runs", type=int, default=None, help="stop after this many runs")
    s.add_argument("--no-commit", action="store_true", help="write records, commit nothing")
    sub.add_parser("report", help="tables, figure and REPORT.md's section from the records")
    s = sub.add_parser("regions", help="attention by region on the finished runs' checkpoints")
    s.add_argument("--force", action="store_true", help="again for runs already written")
    sub.add_parser("retest", help="test again the runs decoded with an earlier decode bound")
    s = sub.add_parser("id-steps", help="exact match and step scores at ID lengths, finished runs")
    s.add_argument("--force", action="store_true", help="again for runs already written")
    args = p.parse_args()
    if args.command == "pilot":
        pilot(args.steps)
    elif args.command == "run":
        run(args.max_runs, commit=not args.no_commit)
    elif args.command == "regions":
        regions(args.force)
    elif args.command == "retest":
        retest_runs()
    elif args.command == "id-steps":
        id_steps(args.force)
    else:
        for path in report():
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    run_script(main)
