"""Language models on real text: the study fixed in analyses/PROTOCOL.md ("Protocol of the
language-model study"), run resumably, one committed record per run, and its REPORT.md section.

    python analyses/lm_study.py pilot            # seconds per training step per PE, 1 thread
    python analyses/lm_study.py run [--max-runs N] [--no-commit]
    python analyses/lm_study.py measure-again [RUN ...] [--no-commit]
    python analyses/lm_study.py report           # tables, figures, REPORT.md section

`run` trains each (PE, seed) of the protocol in order through the sweep machinery (a run
folder under runs/lm/, git-ignored; an interrupted run resumes from its training state),
then measures it (`nopeinterp.lm_eval.lm_eval`, `nopeinterp.probing.probe_position` with
its random-init control, `nopeinterp.probing.attention_sinks`) and commits one small record,
analyses/results/lm/records/<run>.json. A run with a committed record is skipped, so the
command is rerun until every run is done; two `run`s in one checkout share the work (each
leaves the run the other holds and goes on to the next). `report` reads only the committed
records.
Nothing here computes a number: the numbers come from nopeinterp's own functions.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from nopeinterp.errors import NopeinterpError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    ROOT,
    mean_span,
    run_script,
    to_markdown,
    write_figure,
    write_section,
    write_table,
)

# --- the protocol (analyses/PROTOCOL.md, "Protocol of the language-model study") ---------
PES = ("nope", "t5", "alibi", "rotary", "sinusoidal", "fire")
SEEDS = (0, 1)
TASK_OPTIONS = {"corpus": "stdlib", "context": 256, "vocab_size": 4096}
PRESET = "lm"  # the training recipe: nopeinterp/training/presets.py, defined there once
OVERRIDES: dict = {}  # TrainConfig values on top of the preset (none in the protocol)
EVAL = dict(
    lengths=(256, 512, 1024, 2048),
    mode="nonoverlap",
    max_windows=32,
    depths=(0.0, 0.25, 0.5, 0.75, 1.0),
    trials=20,
    seed=0,
)
PROBE = dict(n_fit=200, n_val=50, n_id=100, n_ood=40, ood_length=512)
SINK_LENGTH, SINK_WINDOWS, SINK_THRESHOLD = 64, 64, 0.3  # Gu et al. 2024: 64-token prompts
# what `measure` writes into a record; raised when it writes more (a record without the key is
# version 1; `measure-again` brings older records up to date from their checkpoints).
# 2: the loss within the training context beside the loss past it (lm_eval, same windows)
MEASURES = 2

# published numbers set beside ours (../shared/paper-notes.md, "Language-model length
# generalization"): Gu et al. 2024, Table 3 (60M LMs, 64-token prompts, heads with mean
# attention to the first token > 0.3); Haviv et al. 2022 (LMs without PE, 1024 positions)
GU_SINK_SHARE = {"nope": 0.2035, "alibi": 0.2078, "rotary": 0.1818, "learned APE": 0.3313}
HAVIV = "a probe's MAE far below the random-guess baseline (about 340 of 1024 positions) by layer 4"

RUNS = ROOT / "runs" / "lm"
OUT = RESULTS / "lm"
RECORDS = OUT / "records"
REPORT = ROOT / "analyses" / "REPORT.md"
BEGIN, END = "<!-- lm-study:begin -->", "<!-- lm-study:end -->"


def run_names() -> list[tuple[str, int]]:
    """Seed-major: every PE's seed 0 first, so a study cut short compares all PEs."""
    return [(pe, seed) for seed in SEEDS for pe in PES]


def run_name(pe: str, seed: int) -> str:
    return f"lm-{pe}-seed{seed}"


def _spec() -> str:
    return "lm:" + ",".join(f"{k}={v}" for k, v in TASK_OPTIONS.items())


def _folder(pe: str, seed: int) -> Path:
    """The run's folder under RUNS, as the sweep names it."""
    from nopeinterp.training import sweep

    return RUNS / sweep.run_name(sweep.grid([_spec()], [pe], [seed])[0])


# --- pilot -----------------------------------------------------------------------------------
def pilot(steps: int) -> None:
    """Seconds per training step of every PE at the protocol's size, 1 thread (not a counted
    run: a throwaway folder, the first step not timed)."""
    import tempfile

    import torch

    from nopeinterp.checkpoint import load_checkpoint
    from nopeinterp.training import make_config, train

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for pe in PES:
            out = Path(tmp) / f"{pe}.pt"
            kw = {**OVERRIDES, "steps": steps + 1, "eval_every": 10_000, "checkpoint_every": 10_000}
            t0 = time.time()
            train(
                make_config(
                    "lm", pe, out, preset=PRESET, task_options=TASK_OPTIONS, progress=False, **kw
                )
            )
            meta = load_checkpoint(out).meta
            sps = meta["throughput"]["steps_per_s"]
            print(f"{pe}: {1 / sps:.3f} s/step ({steps + 1} steps incl. the first, "
                  f"wall {time.time() - t0:.1f} s with the corpus load and the final validation)",
                  flush=True)  # fmt: skip


# --- one run's measurements ---------------------------------------------------------------------
def _held_out(tokenizer):
    """The test split's stream, and disjoint token sets for probes and sinks."""
    from nopeinterp.tasks.lm import chunks, read_corpus, token_stream

    stream = token_stream(tokenizer, read_corpus(TASK_OPTIONS["corpus"]).documents["test"])
    ctx = TASK_OPTIONS["context"]
    n_id = PROBE["n_fit"] + PROBE["n_val"] + PROBE["n_id"]
    short = chunks(stream[: n_id * ctx], ctx)
    rest = stream[n_id * ctx :]
    ood = chunks(rest, PROBE["ood_length"])[: PROBE["n_ood"]]
    a, b = PROBE["n_fit"], PROBE["n_fit"] + PROBE["n_val"]
    probe_sets = {"fit": short[:a], "val": short[a:b], "ID": short[b:], "OOD": ood}
    sink_tokens = chunks(rest[len(ood) * PROBE["ood_length"] :], SINK_LENGTH)[:SINK_WINDOWS]
    return probe_sets, sink_tokens


def measure(ckpt_path: Path) -> dict:
    """lm-eval, position probes (with the random-init control) and the sink share."""
    from nopeinterp.checkpoint import load_checkpoint
    from nopeinterp.lm_eval import lm_eval
    from nopeinterp.probing import attention_sinks, probe_position

    ckpt = load_checkpoint(ckpt_path)
    t0 = time.time()
    ev = lm_eval(ckpt, name=ckpt_path.parent.name, progress=False, **EVAL)
    t_eval = time.time() - t0
    probe_sets, sink_tokens = _held_out(ckpt.tokenizer)
    probe = probe_position(ckpt, probe_sets, progress=False, shuffle_control=False)
    mae = probe.table[(probe.table["metric"] == "mae")]
    sinks = attention_sinks(ckpt, {"ID": sink_tokens}, progress=False)
    heads = sinks.dilution
    return {
        "perplexity": ev.perplexity.drop(columns=["model"]).to_dict("records"),
        "loss_by_position": _coarse(ev.table),
        "passkey": ev.passkey.drop(columns=["model"]).to_dict("records"),
        "probe_mae": mae[["model", "layer", "split", "value", "n"]].to_dict("records"),
        "sink_share": float((heads["first_mass"] > SINK_THRESHOLD).mean()),
        "sink_heads": heads[["layer", "head", "first_mass"]].to_dict("records"),
        "eval_meta": {k: v for k, v in ev.meta.items() if k not in ("title", "models")},
        "eval_wall_s": round(t_eval, 1),
        "measures": MEASURES,
    }


def _coarse(table) -> list[dict]:
    """Loss by position in the figure's bins (the full table is recomputable from the run)."""
    from nopeinterp.viz.lm import binned

    out = []
    for length, rows in table.groupby("length"):
        x, y = binned(rows)
        out += [{"length": int(length), "position": float(p), "loss": float(v)} for p, v in zip(x, y, strict=True)]  # fmt: skip
    return out


# --- the driver -------------------------------------------------------------------------------
def run(max_runs: int | None, commit: bool) -> None:
    import torch

    from nopeinterp.training.sweep import CHECKPOINT, RECORD, run_sweep

    torch.set_num_threads(1)
    done = 0
    for pe, seed in run_names():
        name = run_name(pe, seed)
        dest = RECORDS / f"{name}.json"
        if dest.exists():
            continue
        if max_runs is not None and done >= max_runs:
            break
        statuses = run_sweep(
            [_spec()], [pe], [seed], RUNS, preset=PRESET, overrides=dict(OVERRIDES), test="none"
        )
        status = next(iter(statuses.values()))
        if status == "busy":  # another `run` in this checkout trains it: go on to the next
            continue
        folder = _folder(pe, seed)
        if not (folder / RECORD).exists():
            print(f"{name}: {statuses} (no record: rerun to continue)")
            return
        record = json.loads((folder / RECORD).read_text())
        record.update(run=name, protocol={"eval": EVAL, "probe": PROBE})  # training: "config"
        record.update(measure(folder / CHECKPOINT))
        _write_record(dest, record)
        print(f"{name}: record {dest}", flush=True)
        if commit:
            msg = f"lm study: {name} (val loss {record['val_loss']:.3f}, {record['run_wall_s']} s)"
            _commit(dest, msg)
        done += 1


def measure_again(names: list[str], commit: bool) -> None:
    """Measure finished runs again from their checkpoints (under RUNS, on this machine) and
    rewrite their records' measurements, the training fields unchanged: the named runs, or
    every record older than MEASURES. Prints how far each number the record already had moved
    (the measurements are deterministic: 0 expected)."""
    import torch

    from nopeinterp.training.sweep import CHECKPOINT

    torch.set_num_threads(1)
    records = {r["run"]: r for r in _records()}
    unknown = [n for n in names if n not in records]
    if unknown:
        raise NopeinterpError(f"no committed record for {', '.join(unknown)}")
    todo = names or [n for n, r in records.items() if r.get("measures", 1) < MEASURES]
    ckpts = {n: _folder(records[n]["pe"], records[n]["seed"]) / CHECKPOINT for n in todo}
    missing = [n for n, c in ckpts.items() if not c.exists()]
    if missing:
        raise NopeinterpError(f"no checkpoint under {RUNS} for {', '.join(missing)}")
    for name in todo:
        record = records[name]
        fresh = measure(ckpts[name])
        moved = _largest_change(record, fresh)
        record.update(fresh)
        dest = RECORDS / f"{name}.json"
        _write_record(dest, record)
        print(f"{name}: measured again (measures {MEASURES}); largest change of a number it had: {moved:.3g}", flush=True)  # fmt: skip
        if commit:
            _commit(dest, f"lm study: {name} measured again (measures {MEASURES}; largest change {moved:.3g})")  # fmt: skip


def _write_record(dest: Path, record: dict) -> None:
    from nopeinterp._io import atomic_write_text

    atomic_write_text(dest, json.dumps(record, indent=1, sort_keys=True, default=str))


def _largest_change(old: dict, new: dict) -> float:
    """The largest absolute difference between numbers present in both (lists of row dicts
    matched by position, rows by key)."""

    def numbers(value, path=()):
        if isinstance(value, dict):
            for k, v in value.items():
                yield from numbers(v, (*path, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from numbers(v, (*path, i))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield path, float(value)

    skip = ("eval_wall_s", "measures")
    a = dict(numbers({k: v for k, v in old.items() if k not in skip}))
    b = dict(numbers({k: v for k, v in new.items() if k not in skip}))
    both = [(a[p], b[p]) for p in a.keys() & b.keys()]
    return max((abs(x - y) for x, y in both if not (math.isnan(x) and math.isnan(y))), default=0.0)


def _commit(path: Path, message: str, tries: int = 5) -> None:
    """Commit one record; a second `run` committing at the same moment holds git's index
    lock for a second or two, so a failed try waits and retries."""
    for attempt in range(tries):
        add = subprocess.run(["git", "add", str(path)], cwd=ROOT)
        if add.returncode == 0:
            commit = ["git", "commit", "-q", "-m", message, "--", str(path)]
            if subprocess.run(commit, cwd=ROOT).returncode == 0:
                return
        time.sleep(2 + 3 * attempt)
    raise NopeinterpError(f"could not commit {path} (the record is written: commit it)")


# --- the report -------------------------------------------------------------------------------
def _records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]


def report() -> None:
    import pandas as pd

    from nopeinterp.viz.lm import loss_by_position_figure, passkey_figure

    context = TASK_OPTIONS["context"]
    records = _records()
    planned = [run_name(pe, s) for pe, s in run_names()]
    have = [r["run"] for r in records]
    paths = []
    lines = [
        BEGIN,
        f"# Part 3: language models on real text (Python standard library, context {context})",
        "",
        "Protocol: analyses/PROTOCOL.md, \"Protocol of the language-model study\", fixed before the "
        "runs. Regenerated by `python analyses/lm_study.py report` from the committed records "
        "in analyses/results/lm/records/.",
        "",
        f"Runs finished: {len(have)} of {len(planned)}"
        + (f" (missing: {', '.join(r for r in planned if r not in have)})" if len(have) < len(planned) else "")
        + ".",
        "",
    ]  # fmt: skip
    if not records:
        lines += ["No run has finished yet; nothing below is a result.", END]
        write_section(REPORT, "\n".join(lines), BEGIN, END)
        return
    ppl = pd.DataFrame([{"run": r["run"], "pe": r["pe"], "seed": r["seed"], **p} for r in records for p in r["perplexity"]])  # fmt: skip
    runs = pd.DataFrame(
        [
            {
                "run": r["run"],
                "pe": r["pe"],
                "seed": r["seed"],
                "val_loss": r["val_loss"],
                "best_step": r["best_step"],
                "train_s": r["run_wall_s"],
                "sink_share": r["sink_share"],
            }
            for r in records
        ]
    )
    wide = ppl.pivot_table(index=["pe", "seed"], columns="length", values="loss").reset_index()
    wide.columns = [c if isinstance(c, str) else f"loss@{c}" for c in wide.columns]
    past = ppl.pivot_table(index=["pe", "seed"], columns="length", values="loss_past_context")
    past = past.drop(columns=[c for c in past.columns if past[c].isna().all()]).reset_index()
    past.columns = [c if isinstance(c, str) else f"past{context}@{c}" for c in past.columns]
    keys = pd.DataFrame([{"run": r["run"], "pe": r["pe"], "seed": r["seed"], **p} for r in records for p in r["passkey"]])  # fmt: skip
    key_len = (
        keys.groupby(["pe", "seed", "length"])["accuracy"].mean().unstack("length").reset_index()
    )
    key_len.columns = [c if isinstance(c, str) else f"passkey@{c}" for c in key_len.columns]
    probes = pd.DataFrame([{"run": r["run"], "pe": r["pe"], "seed": r["seed"], **p} for r in records for p in r["probe_mae"]])  # fmt: skip
    probe_id = (
        probes[probes["split"] == "ID"]
        .pivot_table(index=["pe", "seed", "model"], columns="layer", values="value")
        .reset_index()
    )
    probe_id.columns = [c if isinstance(c, str) else f"MAE L{c}" for c in probe_id.columns]
    per_seed = _per_seed(runs, ppl, probes)
    summary = _summary(per_seed)
    out = OUT / "tables"
    paths += write_table(summary, out, "summary", title="Per PE, mean [min, max] over seeds")
    paths += write_table(runs, out, "runs", title="Runs")
    paths += write_table(wide, out, "loss_by_length", title="Mean loss (nats) by window length")
    paths += write_table(
        past, out, "loss_past_context", title=f"Mean loss at positions >= {context}"
    )
    paths += write_table(key_len, out, "passkey_by_length", title="Passkey accuracy by length (mean over depths)")  # fmt: skip
    paths += write_table(probe_id, out, "probe_mae", title=f"Position probe MAE (positions) on held-out {context}-token text, ID split")  # fmt: skip
    # one line (one heat map) per PE: its seeds averaged, each seed weighing the same
    coarse = pd.DataFrame([{"model": r["pe"], "length": q["length"], "position": q["position"], "loss": q["loss"], "n": 1} for r in records for q in r["loss_by_position"]])  # fmt: skip
    longest = max(EVAL["lengths"])
    fig = loss_by_position_figure(coarse, {"all": context}, title=f"Loss by position at {longest} tokens (trained at {context}; mean over seeds)")  # fmt: skip
    paths += write_figure(fig, OUT, "loss_by_position")
    key_mean = keys.groupby(["pe", "length", "depth"], as_index=False)["accuracy"].mean()
    key_fig = passkey_figure(key_mean.rename(columns={"pe": "model"}), title="Passkey retrieval accuracy (mean over seeds)")  # fmt: skip
    paths += write_figure(key_fig, OUT, "passkey")
    lines += [
        f"Per PE, mean [min, max] over its seeds, sorted by the mean loss at positions >= "
        f"{context} of the {longest}-token windows (`past`); `within` is the same windows' "
        f"loss at positions < {context}, `rise` = past - within (one text, so the rise is the "
        "cost of the unseen positions alone); probe MAE is the lowest over the layers after "
        "each block (ID split; layer 0, the embedding, is in the full table below):",
        "",
        to_markdown(summary),
        *_rise_order(per_seed),
        *_beside_published(per_seed),
        f"![Loss by position at {longest} tokens, one line per PE (mean over seeds); dashed: "
        "the training context](results/lm/loss_by_position.png)",
        "",
        "![Passkey retrieval accuracy by length and depth, per PE (mean over seeds)]"
        "(results/lm/passkey.png)",
        "",
        "Mean loss per window length (non-overlapping windows of the test split; lower is "
        f"better; the models never saw a position past {context - 1}):",
        "",
        to_markdown(wide),
        f"Mean loss at positions >= {context} only:",
        "",
        to_markdown(past),
        f"Passkey retrieval accuracy per length (mean over {len(EVAL['depths'])} depths, "
        f"{EVAL['trials']} trials each):",
        "",
        to_markdown(key_len),
        f"Position probe (ridge regression on the residual stream, {context}-token held-out text): "
        "mean absolute error in positions per layer, trained model and its random-init "
        f"control (a constant guess of the mean position scores about {context / 4:g}):",
        "",
        to_markdown(probe_id),
        f"Runs: best validation loss, its step, training seconds and the first-token sink "
        f"share (heads with mean attention to the first token > {SINK_THRESHOLD} on "
        f"{SINK_LENGTH}-token held-out windows):",
        "",
        to_markdown(runs),
        "Interactive figures: analyses/results/lm/loss_by_position.html, "
        "analyses/results/lm/passkey.html (not committed; written by the same command).",
        END,
    ]
    write_section(REPORT, "\n".join(lines), BEGIN, END)
    paths.append(REPORT)
    for p in paths:
        print(p)


def _per_seed(runs, ppl, probes):
    """One row per (pe, seed): validation loss, sink share, the loss within and past the
    context at the longest length and its rise, and the best probe MAE after a block (trained
    and random-init: layer 0 is the embedding, a sinusoidal PE's own table)."""
    at_longest = ppl[ppl["length"] == max(EVAL["lengths"])].set_index(["pe", "seed"])
    if "loss_within_context" not in at_longest:  # records measured before it was
        at_longest = at_longest.assign(loss_within_context=float("nan"))
    id_mae = probes[(probes["split"] == "ID") & (probes["layer"] > 0)]
    best = id_mae.groupby(["pe", "seed", "model"])["value"].min().unstack("model")
    per_seed = (
        runs.set_index(["pe", "seed"])[["val_loss", "sink_share"]]
        .join(at_longest[["loss_within_context", "loss_past_context"]])
        .join(best[["trained", "random_init"]])
    )
    per_seed["rise"] = per_seed["loss_past_context"] - per_seed["loss_within_context"]
    return per_seed


def _rise_order(per_seed) -> list[str]:
    """The PEs by their mean rise past the context at the longest length, and, for NoPE, the
    PEs whose seeds all rise more or all rise less than every NoPE seed (descriptive: two seeds
    give no interval)."""
    rise = per_seed["rise"].groupby("pe")
    lo, hi, mean = rise.min(), rise.max(), rise.mean().sort_values()
    if mean.isna().all():
        return []
    lines = ["Rise past the context, smallest first: " + ", ".join(f"{pe} {v:.3f}" for pe, v in mean.items()) + "."]  # fmt: skip
    if "nope" in mean:
        more = [pe for pe in mean.index if pe != "nope" and lo[pe] > hi["nope"]]
        less = [pe for pe in mean.index if pe != "nope" and hi[pe] < lo["nope"]]
        rest = [pe for pe in mean.index if pe != "nope" and pe not in more + less]
        lines[0] += (
            f" Every NoPE seed rises less than every seed of {', '.join(more) or 'no PE'} and more "
            f"than every seed of {', '.join(less) or 'no PE'}; the seeds overlap with "
            f"{', '.join(rest) or 'no PE'}."
        )
    return [*lines, ""]


def _beside_published(per_seed) -> list[str]:
    """Our sink shares and NoPE's position probe beside the published numbers."""
    context = TASK_OPTIONS["context"]
    ours = per_seed.groupby("pe")["sink_share"].mean()
    theirs = ", ".join(f"{pe} {v:.2%}" for pe, v in GU_SINK_SHARE.items())
    mine = ", ".join(f"{pe} {v:.2%}" for pe, v in ours.items())
    lines = [
        f"Beside published numbers. First-token sinks: Gu et al. 2024's 60M LMs {theirs}; "
        f"ours (this protocol's small models, mean over seeds) {mine}.",
    ]
    if "nope" in ours:
        best = per_seed.loc["nope", ["trained", "random_init"]].mean()
        lines[0] += (
            f" Position from NoPE's hidden states: Haviv et al. 2022 found {HAVIV}; ours "
            f"({context} positions: a random guess scores about {context / 3:.0f}, the mean "
            f"position {context / 4:g}) best layer {best['trained']:.1f}, its random-init "
            f"control {best['random_init']:.1f}."
        )
    return [*lines, ""]


def _summary(per_seed):
    """One row per PE: each measure as mean [min, max] over its seeds."""
    import pandas as pd

    longest = max(EVAL["lengths"])
    order = per_seed.groupby("pe")["loss_past_context"].mean().sort_values().index
    rows = []
    for pe in order:
        d = per_seed.loc[[pe]]
        rows.append(
            {
                "pe": pe,
                "seeds": len(d),
                "val_loss": mean_span(d["val_loss"]),
                f"within@{longest}": mean_span(d["loss_within_context"]),
                f"past@{longest}": mean_span(d["loss_past_context"]),
                "rise": mean_span(d["rise"]),
                "probe MAE (trained)": mean_span(d["trained"], 1),
                "probe MAE (random init)": mean_span(d["random_init"], 1),
                "sink_share": mean_span(d["sink_share"], 2),
            }
        )
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("pilot")
    q.add_argument("--steps", type=int, default=5)
    q = sub.add_parser("run")
    q.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs")
    q.add_argument("--no-commit", action="store_true", help="write records without committing")
    q = sub.add_parser("measure-again", help="rewrite finished runs' measurements")
    q.add_argument("runs", nargs="*", help="run names (default: records older than the driver's measures)")  # fmt: skip
    q.add_argument("--no-commit", action="store_true", help="write records without committing")
    sub.add_parser("report")
    args = p.parse_args(argv)
    if args.command == "pilot":
        pilot(args.steps)
    elif args.command == "run":
        run(args.max_runs, not args.no_commit)
    elif args.command == "measure-again":
        measure_again(args.runs, not args.no_commit)
    else:
        report()
    return 0


if __name__ == "__main__":
    run_script(main)
